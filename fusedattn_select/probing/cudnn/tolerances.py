"""Tolerances and comparisons of depth `verify` (numerics.py): how far a result may be from the
float32 reference, and how one is compared. torch is not imported here (tensors come in)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.types import Phase

SEED = 20240607  # the seed of every random input; lengths under padding masks derive from it too
# Unit roundoff of each 16-bit dtype: the rounding step of a value near 1 is twice this.
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
# Multiples of the unit roundoff a result may differ by, relative to the reference's largest value.
# A flash-attention kernel rounds P to 16 bits before P.V and each gradient's dS before dS.K and
# dS^T.Q; simulating exactly those roundings gives errors near one unit roundoff (docs/verify.md):
# the factors leave a wide margin for other orders of summation and roundings.
FACTORS = {"output": 8.0, "gradient": 16.0}
# FP8 graphs (per-tensor scales): the unit roundoff of each FP8 dtype, and the multiple of the
# coarsest of the inputs' and the results' a result may differ by, relative to the reference's
# largest value, whatever the head dim. Sized by simulating the kernel's roundings (P, s dS and the
# results rounded to FP8 at the scales dispatch binds; tools/simulate_fp8_tolerance.py, figures in
# docs/verify.md): the forward's O comes within about a quarter of it, the backward's dQ and dV within
# about half. An e4m3 dK can exceed it: dispatch sizes dK's scale from a bound that grows with the
# query rows, so at 512 rows and more without a causal mask its values sit far below the type's top.
UNIT_ROUNDOFF_FP8 = {"fp8_e4m3": 2.0 ** -4, "fp8_e5m2": 2.0 ** -3}
FP8_FACTOR = 3.0
# The softmax stats are float32 sums of exact 16-bit products: an absolute bound on log-sum-exp values.
STATS_TOLERANCE = 2e-3
# Dropout, O, dQ, dV, dK and dBias (compare_under_dropout): how many standard deviations of dropout's own spread a
# result may stray from what every correct mask gives (Chebyshev: a right kernel strays that far with
# probability under 1/64 whatever the distribution, and far less for sums of many decisions), and the
# multiple of the unit roundoff, of the result's size and of the dropout spread's, its roundings may add.
DROPOUT_SIGMAS = 8.0
DROPOUT_ROUNDING = 4.0


def tolerance(dtype: str, head_dim: int, kind: str = "output") -> float:
    """The largest error allowed for a result in `dtype` of head dim `head_dim`, as a fraction of the
    reference's largest magnitude: FACTORS[kind] x the unit roundoff x sqrt(head_dim / 64) (at least 1).

    kind: "output" (the forward's O) or "gradient" (dQ, dK, dV, dBias, dSink). Head dims above 64 widen
    the bound with the square root of the length of the dot products each element sums.
    """
    if dtype not in UNIT_ROUNDOFF:
        raise ConfigError("dtype", dtype, "verify compares 16-bit results: must be 'fp16' or 'bf16'")
    if kind not in FACTORS:
        raise ConfigError("kind", kind, "must be 'output' or 'gradient'")
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
        raise ConfigError("head_dim", head_dim, "must be a positive integer")
    return FACTORS[kind] * UNIT_ROUNDOFF[dtype] * math.sqrt(max(head_dim, 64) / 64)


def fp8_tolerance(qkv_dtype: str, *result_dtypes: str) -> float:
    """The largest error allowed for a result of an FP8 graph with FP8 inputs `qkv_dtype`, as a
    fraction of the reference's largest magnitude: the forward's O (`result_dtypes`: O's type), or a
    backward's dQ, dK, dV (dO's and the gradients' types), each FP8 or 16-bit."""
    if qkv_dtype not in UNIT_ROUNDOFF_FP8:
        raise ConfigError("qkv_dtype", qkv_dtype, "must be one of " + ", ".join(repr(n) for n in UNIT_ROUNDOFF_FP8))
    roundoffs = {**UNIT_ROUNDOFF, **UNIT_ROUNDOFF_FP8}
    for dtype in result_dtypes:
        if dtype not in roundoffs:
            raise ConfigError("dtype", dtype, "must be one of " + ", ".join(repr(n) for n in roundoffs))
    return FP8_FACTOR * max(UNIT_ROUNDOFF_FP8[qkv_dtype], *(roundoffs[dtype] for dtype in result_dtypes))


def roundoff(*names: str) -> float:
    """The largest unit roundoff of these dtype names (16-bit or FP8)."""
    table = {**UNIT_ROUNDOFF, **UNIT_ROUNDOFF_FP8}
    for name in names:
        if name not in table:
            raise ConfigError("dtype", name, "must be one of " + ", ".join(repr(n) for n in table))
    return max(table[name] for name in names)


def coarsest(*names: str) -> str:
    """Of 16-bit dtype names, the one with the largest unit roundoff."""
    return max(names, key=lambda name: UNIT_ROUNDOFF.get(name, math.inf))


# ----- comparisons -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """One result compared with the reference: its error, the bound, and whether it passed.

    O, dQ, dV, dK and dBias under dropout (compare_under_dropout): `error` is the units' squared distance over dropout's expected one,
    averaged (1 for a correct kernel), `bounds` its range, `scale` the result's excess along the reference and
    its bound.
    """

    name: str
    error: float
    tolerance: float
    passed: bool
    bounds: tuple[float, float] = (0.0, 0.0)
    scale: tuple[float, float] | None = None  # under dropout: the excess along the reference, and its bound

    def describe(self) -> str:
        if self.scale is not None:
            return (f"{self.name} distance over dropout's expected {self.error:.3g} (allowed "
                    f"{max(self.bounds[0], 0.0):.3g}..{self.bounds[1]:.3g}), scale {1.0 + self.scale[0]:.4g} "
                    f"(allowed 1 +- {self.scale[1]:.3g})")
        return f"{self.name} max error {self.error:.3g} (tolerance {self.tolerance:.3g})"


def compare(name: str, got: Any, want: Any, tol: float, rows: Any = None, *, absolute_floor: float = 0.0) -> Check:
    """Max |got - want| over `rows` (a mask of leading dims, or None: all) divided by
    max(max |want|, absolute_floor); non-finite values fail."""
    if rows is not None:
        got, want = got[rows], want[rows]
    if got.numel() == 0:
        return Check(name, 0.0, tol, True)
    got, want = got.float(), want.float()
    if not bool(got.isfinite().all()):
        return Check(name, math.inf, tol, False)
    scale = max(float(want.abs().max()), absolute_floor, 1e-6)
    error = float((got - want).abs().max()) / scale
    return Check(name, error, tol, error <= tol)


def compare_under_dropout(name: str, got: Any, want: Any, moments: Any, dropout: float, roundoff: float,
                            rows: Any = None) -> Check:
    """A result linear in the dropout decisions (O, dQ, dV; dK and dBias less their row-term shift) under dropout
    `dropout` against the dropout-free reference `want`, by what every correct kernel's result has whatever its
    mask (`moments`: chunked_reference.DropoutMoments, one unit per last-dim row: a query row of O, dQ or dBias,
    a key of dV or dK; docs/verify.md, 'Dropout'): each unit's squared distance from `want` near its expected
    p/(1-p) * sum spread, and its component along `want` near 0 (kept values rescaled by 1/(1-p)). Units are
    weighted by the inverse of their expected spread (a causal mask's first rows, with few keys, spread most),
    and each statistic may stray DROPOUT_SIGMAS standard deviations (never past what a mask can reach), plus
    what roundings of DROPOUT_ROUNDING x `roundoff` (of the unit's result and of its spread) can move it; a unit
    dropout cannot move (no spread) must equal `want` but for roundings. `rows`: a mask of the units."""
    rounded = moments.rounded if moments.rounded is not None else moments.reach.new_zeros(moments.reach.shape)
    parts = (moments.spread, moments.weights, moments.gram, moments.reach, moments.slope_spread, moments.slope_reach,
             rounded)
    if rows is not None:
        got, want, parts = got[rows], want[rows], tuple(part[rows] for part in parts)
    got, want = got.double(), want.double()
    if not bool(got.isfinite().all()):
        return Check(name, math.inf, 0.0, False)
    spread, weights, gram, reach, slope_spread, slope_reach, rounded = (part.double() for part in parts)
    if got.numel() == 0:
        return Check(name, 1.0, 0.0, True, (0.0, math.inf), (0.0, math.inf))
    odds = dropout / (1.0 - dropout)
    worst = max(1.0, odds)  # the largest |m / (1 - p) - 1| of a kept (m = 1) or dropped (m = 0) value
    fourth = dropout ** 4 / (1.0 - dropout) ** 3 + dropout  # E[(m / (1 - p) - 1)^4]
    floor = 1e-30
    residual = got - want
    # (`rounded` bounds its rounding's effect already, at one roundoff per rounding: twice, for the kernel's
    # own error in what it rounded)
    rounding = roundoff * (DROPOUT_ROUNDING * (got.norm(dim=-1) + spread.sum(-1).sqrt()) + 2.0 * rounded)
    # Distance: a unit's squared distance s_i = sum_{j,l} e_j e_l G_jl (a quadratic form of the independent
    # decisions, G the Gram matrix of its terms) has mean E_i = odds tr(G) and variance
    # (E[e^4] - 3 odds^2) sum_j G_jj^2 + 2 odds^2 ||G||_F^2; the statistic is sum_i s_i / E_i.
    expected = odds * spread.sum(-1)
    squared = residual.square().sum(-1)
    # Units no mask moves (a query row that sees one key has a dQ of 0): only roundings may, of the
    # result and of the terms that cancel there (bounded by `reach`). Told apart from the others' spread and
    # from the unit's own reach (its terms' size before they cancel: where every row sees one key, the
    # largest spread is itself what is left of the cancelling).
    still = expected <= 1e-12 * (odds * reach).maximum(expected.max())
    if bool(still.any()):
        allowed = roundoff * (DROPOUT_ROUNDING * (got[still].norm(dim=-1) + reach[still].sqrt()
                                                  + float(want.abs().max())) + 2.0 * rounded[still])
        error = residual[still].norm(dim=-1)
        if bool((error > allowed).any()):
            worst_unit = int((error - allowed).argmax())
            return Check(name, float(error[worst_unit]), float(allowed[worst_unit]), False)
    keep = ~still
    residual, want, spread, weights, gram, reach = (residual[keep], want[keep], spread[keep], weights[keep],
                                                    gram[keep], reach[keep])
    slope_spread, slope_reach, rounding, expected, squared = (slope_spread[keep], slope_reach[keep], rounding[keep],
                                                              expected[keep], squared[keep])
    if expected.numel() == 0:
        return Check(name, 1.0, 0.0, True, (0.0, math.inf), (0.0, math.inf))
    statistic = float((squared / expected).sum())
    count = expected.numel()
    # (as (E[e^4] - odds^2) sum_j G_jj^2 + 2 odds^2 sum_{j != l} G_jl^2, G positive semidefinite: sum_j G_jj^2 <=
    # ||G||_F^2 <= tr(G)^2, which holds `gram` where roundings of dQ's centred terms could move it past)
    gram = gram.maximum(weights).minimum(spread.sum(-1).square())
    spread_variance = (fourth - odds ** 2) * weights + 2.0 * odds ** 2 * (gram - weights)
    deviation = float((spread_variance.clamp_min(0.0) / expected ** 2).sum()) ** 0.5
    moved = float(((2.0 * rounding * squared.sqrt() + 3.0 * rounding ** 2) / expected).sum())
    high = min(count + DROPOUT_SIGMAS * deviation, float((worst ** 2 * reach / expected).sum())) + moved
    low = count - DROPOUT_SIGMAS * deviation - moved
    # Along the reference: t_i = (got_i - want_i) . want_i has mean 0 and variance V_i = odds x slope_spread_i,
    # and -p |want_i|^2 where kept values are not rescaled: weighted by lambda_i = |want_i|^2 / V_i (the
    # weights that tell that apart best), sum_i lambda_i t_i over sum_i lambda_i |want_i|^2 is the result's
    # excess along the reference (-p for such a kernel).
    variance = (odds * slope_spread).clamp_min(floor)
    length = want.square().sum(-1)
    weight = length / variance
    size = max(float((weight * length).sum()), floor)
    along = float((weight * (residual * want).sum(-1)).sum())
    slack = (min(DROPOUT_SIGMAS * float((weight * weight * variance).sum()) ** 0.5,
                 float((weight * worst * slope_reach).sum()))
             + float((weight * rounding * length.sqrt()).sum()))
    passed = low <= statistic <= high and abs(along) <= slack
    return Check(name, statistic / count, 0.0, passed, (low / count, high / count), (along / size, slack / size))


@dataclass(frozen=True)
class Planted:
    """A deliberate error for tests of verify itself (never set otherwise): graphs are built from
    `graph_config(cfg)` instead of `cfg`, and `after_execute(phase, outputs)` may change results."""

    graph_config: Callable[[AttnConfig], AttnConfig] | None = None
    after_execute: Callable[[Phase, dict], None] | None = None


