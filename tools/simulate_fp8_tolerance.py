"""Simulate the roundings of FP8 attention graphs on the CPU, to size depth verify's FP8 tolerance.

    python -m tools.simulate_fp8_tolerance            # the grid docs/verify.md quotes

The inputs are seeded normals quantized per tensor as dispatch quantizes them (a power-of-two scale
bringing the largest magnitude nearest below the type's top); the kernel is taken to compute the
scores exactly from those FP8 values. Forward: the unnormalized probabilities exp(S - rowmax) are
rounded to the inputs' type at dtypes.FP8_SOFTMAX_SCALE before P.V (as cudnn-frontend's FP8
reference does), normalized by the unrounded row sums, and O is rounded to its FP8 type at V's
scale. Backward, for each recipe of RECIPES: P rounded as in the forward for dV = P^T dO; s dS =
s P (dO V^T - rowsum(dO O)) with O rounded, rounded to dO's type at the scale dispatch binds
(dtypes.fp8_gradient_bounds "dP", dtypes.FP8_INTERNAL_RANGE) for dQ = s dS K and dK = s dS^T Q, as
cudnn-frontend's sdpa_fp8_bwd graph orders it; each gradient rounded at the scale its bound gives.
The error is max |result - reference| / max |reference|, the reference computed in float64 from the
same FP8 values: the forward's in unit roundoffs of the type next to the tolerance, the backward's
as a fraction of the tolerance depth verify applies (over 1 fails).
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import torch

from fusedattn_select import dtypes
from fusedattn_select.probing.cudnn import tolerances

HEAD_DIMS, LENGTHS = (64, 128, 256), (128, 512, 1024)


def _quantized(x: torch.Tensor, dtype: str) -> tuple[torch.Tensor, float]:
    """(the real values of x's FP8 copy, its scale)."""
    scale = dtypes.fp8_scale(float(x.abs().max()), dtype)
    return (x * scale).to(dtypes.torch_dtype(dtype, torch)).double() / scale, scale


def _round(x: torch.Tensor, dtype: str, scale: float) -> torch.Tensor:
    return (x * scale).float().to(dtypes.torch_dtype(dtype, torch)).double() / scale


def _problem(dtype: str, head_dim: int, length: int, causal: bool, seed: int, batch: int, heads: int, count: int):
    """`count` quantized inputs (real values, scales) and the scores' mask."""
    generator = torch.Generator().manual_seed(seed)
    inputs = [_quantized(torch.randn(batch, heads, length, head_dim, generator=generator), dtype) for _ in range(count)]
    keep = torch.ones(length, length, dtype=torch.bool).tril() if causal else torch.ones(length, length, dtype=torch.bool)
    return inputs, keep


def relative_error(dtype: str, head_dim: int, length: int, causal: bool, seed: int = 0,
                   batch: int = 2, heads: int = 4) -> float:
    """max |O - reference| / max |reference| of one simulated forward with FP8 inputs and output."""
    ((q, _), (k, _), (v, v_scale)), keep = _problem(dtype, head_dim, length, causal, seed, batch, heads, 3)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(head_dim)).masked_fill(~keep, float("-inf"))
    reference = torch.softmax(scores, -1) @ v
    unnormalized = torch.exp(scores - scores.amax(-1, keepdim=True))
    rounded_p = _round(unnormalized, dtype, dtypes.FP8_SOFTMAX_SCALE)
    out = _round(rounded_p @ v / unnormalized.sum(-1, keepdim=True), dtype, v_scale)
    return float((out - reference).abs().max() / reference.abs().max())


# The FP8 backward recipes simulated: (inputs and O, dO, the gradients). The first is the default
# (config.resolved_do_dtype: TransformerEngine's hybrid recipe, dO in e5m2).
RECIPES = (("fp8_e4m3", "fp8_e5m2", "fp8_e4m3"), ("fp8_e4m3", "fp8_e4m3", "fp8_e4m3"),
           ("fp8_e5m2", "fp8_e5m2", "fp8_e5m2"))


def gradient_errors(recipe: tuple[str, str, str], head_dim: int, length: int, causal: bool, seed: int = 0,
                    batch: int = 2, heads: int = 4) -> dict[str, float]:
    """max |g - reference| / max |reference| of dQ, dK, dV of one simulated FP8 backward (see above)."""
    dtype, do_type, grad_type = recipe
    ((q, _), (k, _), (v, v_scale)), keep = _problem(dtype, head_dim, length, causal, seed, batch, heads, 3)
    d_o = _quantized(torch.randn(batch, heads, length, head_dim, generator=torch.Generator().manual_seed(seed + 1)),
                     do_type)[0]
    s = 1.0 / math.sqrt(head_dim)
    p = torch.softmax((s * q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf")), -1)
    o = p @ v
    dp = d_o @ v.transpose(-1, -2)
    d_s = s * p * (dp - (d_o * o).sum(-1, keepdim=True))
    reference = {"dQ": d_s @ k, "dK": d_s.transpose(-1, -2) @ q, "dV": p.transpose(-1, -2) @ d_o}
    bounds = dtypes.fp8_gradient_bounds(s, 1.0, length, float(q.abs().max()), float(k.abs().max()),
                                        float(d_o.abs().max()), float(d_o.norm(dim=-1).max()), float(v.norm(dim=-1).max()))
    # cuDNN's order: s dS from the rounded O's row sums, scaled by scale_dP and stored in dO's type.
    rounded_ds = _round(s * p * (dp - (d_o * _round(o, dtype, v_scale)).sum(-1, keepdim=True)), do_type,
                        dtypes.fp8_scale(bounds["dP"], do_type, dtypes.FP8_INTERNAL_RANGE))
    kernel = {"dQ": rounded_ds @ k, "dK": rounded_ds.transpose(-1, -2) @ q,
              "dV": _round(p, dtype, dtypes.FP8_SOFTMAX_SCALE).transpose(-1, -2) @ d_o}
    return {name: float((_round(kernel[name], grad_type, dtypes.fp8_scale(bounds[name], grad_type)) - want).abs().max()
                        / want.abs().max()) for name, want in reference.items()}


def main() -> int:
    grid = list(itertools.product(HEAD_DIMS, LENGTHS, (False, True)))
    for dtype in dtypes.FP8_DTYPES:
        roundoff = tolerances.UNIT_ROUNDOFF_FP8[dtype]
        errors = [relative_error(dtype, d, n, causal) / roundoff for d, n, causal in grid]
        print(f"{dtype}: O error {min(errors):.2f}-{max(errors):.2f} unit roundoffs over head dims {HEAD_DIMS}, "
              f"lengths {LENGTHS}, causal or not; tolerance {tolerances.fp8_tolerance(dtype, dtype) / roundoff:.0f}")
    for recipe in RECIPES:
        tolerance = tolerances.fp8_tolerance(*recipe)
        print(f"backward, inputs and O {recipe[0]}, dO {recipe[1]}, gradients {recipe[2]}: largest error over "
              f"head dims {HEAD_DIMS} in tolerances ({tolerance:g}), by length {LENGTHS}")
        gradients = {(n, causal): [gradient_errors(recipe, d, n, causal) for d in HEAD_DIMS] for _, n, causal in grid}
        for name in ("dQ", "dK", "dV"):
            for causal in (False, True):
                cells = [f"{max(g[name] for g in gradients[n, causal]) / tolerance:.2f}" for n in LENGTHS]
                print(f"  {name} {'causal' if causal else 'no mask'}: {', '.join(cells)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
