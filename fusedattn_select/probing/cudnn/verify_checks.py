"""The forward and backward checks of depth `verify` (tolerances.py): build, run, compute the reference,
compare. Imported only when depth verify runs (it imports torch)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from fusedattn_select.config import AttnConfig
from fusedattn_select.probing.cudnn import tolerances
from fusedattn_select.probing.cudnn import verify_run as run
from fusedattn_select.probing.cudnn.graphs import build_graph
from fusedattn_select.probing.cudnn.messages import CudnnUnsupported
from fusedattn_select.probing.cudnn.verify_run import Unbindable
from fusedattn_select.reference import chunked_reference
from fusedattn_select.types import Backend, Phase, ProbeDepth

__all__ = ["Unbindable", "backward", "forward"]

Result = tuple[dict[str, float], list[tolerances.Check], str]


def _static_build(cfg: AttnConfig, backend: Backend, phase: Phase, handle: Any) -> Any:
    """The graph as runtime/plans.build_plan builds what attention() runs: static, no kernel cache."""
    return build_graph(cfg, backend, phase, handle=handle, depth=ProbeDepth.FULL)


def _elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1e3


def _graph(cfg: AttnConfig, backend: Backend, phase: Phase, handle: Any, seam: tolerances.Planted) -> Any:
    built_from = seam.graph_config(cfg) if seam.graph_config is not None else cfg
    return _static_build(built_from, backend, phase, handle)


def _note(bound: run.Bound, *builds: Any) -> str:
    e = bound.extent
    parts = [f"batch {e.batch}, lengths q {_lengths(e.lens_q)}, kv {_lengths(e.lens_kv)}"]
    if e.ragged:
        parts.append(f"ragged as a bucket plan runs a call of {e.seqlen_q}x{e.seqlen_kv} in "
                     f"{bound.cfg.seqlen_q}x{bound.cfg.seqlen_kv}")
    parts += [b.note for b in builds if b.note]
    return "; ".join(parts)


def _lengths(values: tuple[int, ...]) -> str:
    return str(values[0]) if len(set(values)) == 1 else ",".join(str(v) for v in values)


def _rows(rows_ok: torch.Tensor, heads: int) -> torch.Tensor:
    return rows_ok.expand(rows_ok.shape[0], heads, rows_ok.shape[2])


def _worse(first: tolerances.Check, second: tolerances.Check) -> tolerances.Check:
    """The check to report of one result of two executions: the worse (failed, else the larger
    error), named for the second execution where only that one failed (the graph races)."""
    if (not second.passed, second.error) <= (not first.passed, first.error):
        return first
    if first.passed and not second.passed:
        return dataclasses.replace(second, name=f"{second.name} ({SECOND})")
    return second


# Every graph runs twice on the same inputs, and both executions are compared with the reference:
# a kernel that races writes different results from run to run, and one run can pass by chance.
SECOND = "second execution"


def _twice(checks_of: Any, execute: Any) -> list[tolerances.Check]:
    """`checks_of()` after the execution that ran, then after `execute()` runs the graph again."""
    first = checks_of()
    execute()
    return [_worse(a, b) for a, b in zip(first, checks_of())]


def _largest(t: torch.Tensor) -> float:
    """The largest finite magnitude of `t` (rows with no key to attend to may hold NaN)."""
    return float(t.nan_to_num(0.0, 0.0, 0.0).abs().max())


def _stats_comparable(cfg: AttnConfig) -> bool:
    """Whether the graph's stats mean the reference's log-sum-exp: with an extra softmax logit, or
    ALiBi measured from a bottom-right diagonal, they may differ by a per-row constant by convention."""
    return cfg.softmax == "vanilla" and not (cfg.bias == "alibi" and cfg.resolved_bottom_right_diagonal)


def _run_forward(cfg: AttnConfig, backend: Backend, handle: Any, device: int, seam: tolerances.Planted
                 ) -> tuple[run.Bound, Any, dict[str, float]]:
    build = _graph(cfg, backend, Phase.FORWARD, handle, seam)
    started = time.perf_counter()
    bound = run.new_bound(cfg, torch.device("cuda", device), tolerances.SEED)
    run.execute(bound, build, Phase.FORWARD, handle, seam.after_execute)
    timings = dict(build.timings_ms)
    timings["execute"] = _elapsed_ms(started)
    return bound, build, timings


def forward(cfg: AttnConfig, backend: Backend, handle: Any, device: int, seam: tolerances.Planted,
            local: Any) -> Result:
    """(timings, checks, note) of the forward graph: O, and the stats of a training problem."""
    local.forward = None
    bound, build, timings = _run_forward(cfg, backend, handle, device, seam)
    started = time.perf_counter()
    problem = run.reference_problem(bound)
    out, lse, rows_ok = chunked_reference.forward(problem)
    moments = chunked_reference.dropout_moments(problem, out) if cfg.dropout > 0.0 else None
    rows = _rows(rows_ok, cfg.num_heads_q)
    if cfg.is_fp8:
        tol = tolerances.fp8_tolerance(cfg.qkv_dtype, cfg.resolved_o_dtype)
    else:
        dtype = tolerances.coarsest(cfg.qkv_dtype, cfg.resolved_o_dtype)
        tol = tolerances.tolerance(dtype, cfg.resolved_head_dim_v, "output")

    def checks_of() -> list[tolerances.Check]:
        if moments is None:
            found = [tolerances.compare("O", bound.dequantized("o"), out, tol, rows)]
        else:  # what every correct mask's result has (its own mask differs from any simulated one)
            found = [tolerances.compare_under_dropout("O", bound.dequantized("o"), out, moments, cfg.dropout,
                                                        tolerances.roundoff(cfg.qkv_dtype, cfg.resolved_o_dtype), rows)]
        # FP8 stats are not compared: a kernel may sum the probabilities it rounded to FP8.
        if "stats" in bound.tensors and _stats_comparable(cfg) and not cfg.is_fp8:
            found.append(tolerances.compare("stats", run.stats_rows(bound), lse, tolerances.STATS_TOLERANCE, rows,
                                            absolute_floor=1.0))
        return found

    checks = _twice(checks_of, lambda: run.execute(bound, build, Phase.FORWARD, handle, seam.after_execute))
    timings["numerics"] = _elapsed_ms(started)
    if cfg.is_training:
        # The backward check of this problem, next on this thread, reads this forward's tensors.
        local.forward = (cfg.cache_key(), backend, device, bound)
    return timings, checks, _note(bound, build)


def _forward_for_backward(cfg: AttnConfig, backend: Backend, handle: Any, device: int, seam: tolerances.Planted,
                          local: Any) -> tuple[run.Bound, dict[str, float]]:
    kept = getattr(local, "forward", None)
    local.forward = None
    if kept is not None and kept[:3] == (cfg.cache_key(), backend, device):
        return kept[3], {}
    # The backward graph reads O and the softmax stats only: the forward that makes them is built
    # without the max-logit output, whose graph cuDNN may refuse while the backward runs fine.
    forward_cfg = dataclasses.replace(cfg, return_max_logit=False) if cfg.return_max_logit else cfg
    try:
        bound, _, forward_timings = _run_forward(forward_cfg, backend, handle, device, seam)
    except CudnnUnsupported as refused:  # says nothing of the backward graph: not checked, not refused
        raise Unbindable(f"the forward graph that makes its inputs is refused ({refused.message})") from refused
    return bound, {"forward_graph": sum(forward_timings.values())}


def backward(cfg: AttnConfig, backend: Backend, handle: Any, device: int, seam: tolerances.Planted,
             local: Any) -> Result:
    """(timings, checks, note) of the backward graph: dQ, dK, dV (dBias, dSink where it has them)."""
    bound, timings = _forward_for_backward(cfg, backend, handle, device, seam, local)
    build = _graph(cfg, backend, Phase.BACKWARD, handle, seam)
    timings.update(build.timings_ms)
    # The reference first: an FP8 backward's gradient scales are sized from the real gradients.
    started = time.perf_counter()
    run.bind_input(bound, build, "dO")
    grad_out = bound.dequantized("dO")
    bias_grad = "dBias" in build.tensors
    problem = run.reference_problem(bound)
    grads = chunked_reference.backward(problem, grad_out, bias_grad=bias_grad)
    sample = moments = row_terms = None
    if cfg.dropout > 0.0:  # by what every mask gives: dK, dBias and dSink once the row term O shows is removed
        moments = dict(zip(("dQ", "dV"), chunked_reference.gradient_moments(problem, grad_out, grads,
                                                                            bound.dequantized("o"))))
        row_terms = chunked_reference.row_term_moments(problem, grad_out, grads, bound.dequantized("o"))
        moments.update(dK=row_terms.dk, dBias=row_terms.dbias)
        if cfg.is_fp8:  # a simulated dropout's gradients size the FP8 gradients' scales (below)
            sample = chunked_reference.backward(run.reference_problem(bound, dropout_sample=True), grad_out,
                                                bias_grad=bias_grad)
    if cfg.is_fp8:  # the largest real gradient, with dropout's sample too: its kept values are rescaled
        bound.gradient_amax = {name: max(_largest(getattr(g, field)) for g in (grads, sample) if g is not None)
                               for name, field in (("dQ", "dq"), ("dK", "dk"), ("dV", "dv"))}
    reference_ms = _elapsed_ms(started)
    started = time.perf_counter()
    outputs = run.execute(bound, build, Phase.BACKWARD, handle, seam.after_execute)
    timings["execute"] = _elapsed_ms(started)
    started = time.perf_counter()
    if cfg.is_fp8:
        tol_qk = tol_v = tolerances.fp8_tolerance(cfg.qkv_dtype, cfg.resolved_do_dtype, cfg.resolved_dqkv_dtype)
    else:
        dtype = tolerances.coarsest(cfg.qkv_dtype, cfg.resolved_do_dtype, cfg.resolved_dqkv_dtype)
        tol_qk = tolerances.tolerance(dtype, cfg.head_dim_qk, "gradient")
        tol_v = tolerances.tolerance(dtype, cfg.resolved_head_dim_v, "gradient")
    rows = _rows(grads.rows_ok, cfg.num_heads_q)
    roundoff = tolerances.roundoff(cfg.qkv_dtype, cfg.resolved_do_dtype, cfg.resolved_dqkv_dtype)
    shifts = {} if row_terms is None else {"dK": row_terms.dk_shift, "dBias": row_terms.dbias_shift}

    def linear(name: str, got: torch.Tensor, want: torch.Tensor, tol: float, units: Any) -> tolerances.Check:
        if moments is None:
            return tolerances.compare(name, got, want, tol, units)
        if shifts.get(name) is not None:  # the row term's change, which the kernel's own O fixes
            got = got.double() - shifts[name]
        return tolerances.compare_under_dropout(name, got, want, moments[name], cfg.dropout, roundoff, units)

    def checks_of() -> list[tolerances.Check]:
        found = [  # FP8 gradients in real values (divided by their scales); amax_dQ/dK/dV/dP are not compared
            linear("dQ", bound.dequantized("dQ"), grads.dq, tol_qk, rows),
            linear("dK", bound.dequantized("dK"), grads.dk, tol_qk, None),
            linear("dV", bound.dequantized("dV"), grads.dv, tol_v, None),
        ]
        written = bound.tensors
        if "dBias" in outputs and grads.dbias is not None:
            d_bias = written["dBias"][..., :bound.extent.seqlen_q, :bound.extent.seqlen_kv]
            found.append(linear("dBias", d_bias, grads.dbias, tol_qk, None))
        if "dSink_token" in outputs and grads.dsink is not None:
            # A function of the row terms only: given the kernel's own O, determined but for roundings.
            want = grads.dsink if row_terms is None else grads.dsink.double() + row_terms.dsink_shift
            found.append(tolerances.compare("dSink", written["dSink_token"].reshape(-1), want, tol_qk))
        return found

    checks = _twice(checks_of, lambda: run.execute(bound, build, Phase.BACKWARD, handle, seam.after_execute))
    timings["numerics"] = reference_ms + _elapsed_ms(started)
    return timings, checks, _note(bound, build)
