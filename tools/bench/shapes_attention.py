"""Section 7, shape buckets, parts A and B on one problem class (32/8 heads, head dim 128, causal,
bf16, BSHD tensors): the first forward+backward call at a new (batch, seqlen) of a warm class, and
the steady GPU time of a repeated shape vs the exact dense cuDNN graph of that shape and torch flash.

torch is passed in by the caller; the library and cuDNN are imported inside the functions.
"""

from __future__ import annotations

import statistics
import time
import traceback
from typing import Any, Callable, Mapping

from tools.bench.common import (
    RESULT_STATUS_OK,
    Partial,
    error_status,
    first_line,
    log,
    ratio,
    rotated,
    settle,
    steady_plans,
    summarize,
)
from tools.bench.raw_graph import RawGraph
from tools.bench.tensors import cuda_times, kernel_profile, rel_err, to_bhsd

HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
ATTENTION = "attention()"
SDPA_CUDNN = "torch SDPA CUDNN_ATTENTION"
SDPA_FLASH = "torch SDPA FLASH_ATTENTION"
RAW_DENSE = "raw cuDNN graph (dense, this shape)"

Step = Callable[[Any, Any, Any, Any], Any]


def problem_text() -> str:
    return f"h{HEADS_Q}/{HEADS_KV} d{HEAD_DIM} causal bf16, bshd tensors"


def _tensors(torch: Any, batch: int, seqlen: int) -> tuple:
    """q, k, v (B, S, H, D) requiring grad, and an output gradient (normal(0, 1))."""
    def make(heads: int, grad: bool) -> Any:
        return torch.randn(batch, seqlen, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                           requires_grad=grad)

    return make(HEADS_Q, True), make(HEADS_KV, True), make(HEADS_KV, True), make(HEADS_Q, False)


def attention_step(torch: Any) -> Step:
    """Forward+backward of attention() on BSHD tensors (causal)."""
    from fusedattn_select.runtime.api import attention

    def step(q: Any, k: Any, v: Any, g: Any) -> Any:
        out = attention(q, k, v, layout="bshd", mask="causal")
        return torch.autograd.grad(out, (q, k, v), g)

    return step


def sdpa_step(torch: Any, backend_name: str, expand: bool) -> Step:
    """Forward+backward of torch SDPA pinned to one backend on the BHSD views of the same memory;
    `expand`: K/V repeated to the query heads instead of enable_gqa."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    groups = HEADS_Q // HEADS_KV

    def step(q: Any, k: Any, v: Any, g: Any) -> Any:
        qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
        if expand:
            kb, vb = kb.repeat_interleave(groups, dim=1), vb.repeat_interleave(groups, dim=1)
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=not expand)
        return torch.autograd.grad(out, (q, k, v), g.transpose(1, 2))

    return step


def _working_sdpa(torch: Any, backend_name: str, batch: int, seqlen: int) -> tuple[Step, str]:
    """The SDPA step that runs on this device (enable_gqa, else K/V expanded) and a note."""
    q, k, v, g = _tensors(torch, batch, seqlen)
    try:
        step = sdpa_step(torch, backend_name, expand=False)
        step(q, k, v, g)
        return step, ""
    except RuntimeError as err:
        log(f"{backend_name} with enable_gqa: {first_line(err)}; trying K/V expanded to {HEADS_Q} heads")
        step = sdpa_step(torch, backend_name, expand=True)
        step(q, k, v, g)
        return step, f"K/V repeated to {HEADS_Q} heads (enable_gqa rejected: {first_line(err, 120)})"


def _wall_ms(torch: Any, step: Step, tensors: tuple) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    step(*tensors)
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1e3


# ----- part A: the first call at a new shape -----------------------------------------------------
def first_calls(torch: Any, args: Mapping, res: Partial) -> None:
    """Warm each implementation on args["warm_shape"], then time the first forward+backward call at
    each of args["shapes"] (and the second, same shape), with attention()'s plan builds."""
    from fusedattn_select.buckets import Bucket

    warm_b, warm_s = (int(x) for x in args["warm_shape"])
    res["problem"] = problem_text()
    res["warm_shape"] = [warm_b, warm_s]
    impls: dict[str, dict] = {}
    res["impls"] = impls
    for name, make in ((ATTENTION, lambda: (attention_step(torch), "")),
                       (SDPA_CUDNN, lambda: _working_sdpa(torch, "CUDNN_ATTENTION", warm_b, warm_s)),
                       (SDPA_FLASH, lambda: _working_sdpa(torch, "FLASH_ATTENTION", warm_b, warm_s))):
        info: dict[str, Any] = {}
        impls[name] = info
        try:
            step, info["note"] = make()
            warm = _tensors(torch, warm_b, warm_s)
            info["warm_ms"] = [_wall_ms(torch, step, warm) for _ in range(2)]
            info["step"] = step
            info["status"] = RESULT_STATUS_OK
        except Exception as err:  # noqa: BLE001
            info["status"] = error_status(err)
            log(traceback.format_exc())
    steps = {name: info.pop("step") for name, info in impls.items() if "step" in info}
    res["rows"] = []
    for index, (batch, seqlen) in enumerate(args["shapes"]):
        bucket = Bucket.of(batch, seqlen, seqlen)
        row: dict[str, Any] = {"batch": batch, "seqlen": seqlen, "bucket": [bucket.batch, bucket.seqlen_q],
                               "order": rotated(list(impls), index), "impls": {}}
        res["rows"].append(row)
        if res.skipped_past(row, args.get("deadline"), 5):
            continue
        for name in row["order"]:
            row["impls"][name] = _first_call(torch, steps.get(name), impls[name], (batch, seqlen), name == ATTENTION)
        row["status"] = RESULT_STATUS_OK
        res.save()
    settle(torch, "first calls")


def _first_call(torch: Any, step: Step | None, info: Mapping, shape: tuple[int, int], counted: bool) -> dict:
    """One implementation's first and second forward+backward call at a new shape (wall ms), with
    the dispatch counters' change over the first call when `counted` (attention())."""
    from fusedattn_select.runtime.api import dispatch_info

    if step is None:
        return {"status": info.get("status", "failed: not warmed")}
    try:
        tensors = _tensors(torch, *shape)
        before = dispatch_info()
        first = _wall_ms(torch, step, tensors)
        after = dispatch_info()
        out = {"first_ms": first, "again_ms": _wall_ms(torch, step, tensors), "status": RESULT_STATUS_OK}
        if counted:
            for key in ("plan_builds", "plan_loads", "fallback_calls", "plan_build_ms"):
                out[key] = after.get(key, 0) - before.get(key, 0)
        return out
    except Exception as err:  # noqa: BLE001
        log(traceback.format_exc())
        return {"status": error_status(err)}


# ----- part B: a repeated shape ------------------------------------------------------------------
def steady(torch: Any, args: Mapping, res: Partial) -> None:
    """GPU time (CUDA events) of forward+backward at each (batch, seqlen): attention(), the exact
    dense raw cuDNN graph of the shape, torch flash."""
    from fusedattn_select.buckets import Bucket

    res["problem"] = problem_text()
    res["rows"] = []
    flash: dict[str, Any] = {}
    for batch in args["batches"]:
        for seqlen in args["seqlens"]:
            bucket = Bucket.of(batch, seqlen, seqlen)
            row: dict[str, Any] = {"batch": batch, "seqlen": seqlen, "bucket": [bucket.batch, bucket.seqlen_q],
                                   "impls": {}}
            res["rows"].append(row)
            if res.skipped_past(row, args.get("deadline"), 8):
                continue
            try:
                _steady_shape(torch, row, args, flash)
                row["status"] = RESULT_STATUS_OK
            except Exception as err:  # noqa: BLE001
                row["status"] = error_status(err)
                log(traceback.format_exc())
            settle(torch, f"b{batch} s{seqlen}")
            res.save()


def _steady_shape(torch: Any, row: dict, args: Mapping, flash: dict) -> None:
    from fusedattn_select.runtime.api import attention, dispatch_info

    reps, warm = int(args["reps"]), int(args["warmup"])
    tensors = _tensors(torch, row["batch"], row["seqlen"])
    q, k, v, g = tensors
    att = attention_step(torch)
    before = dispatch_info()
    out = attention(q, k, v, layout="bshd", mask="causal")
    torch.autograd.grad(out, (q, k, v), g)
    out_att = out.detach()
    torch.cuda.synchronize()
    after = dispatch_info()
    row["attention_plan_builds"] = after.get("plan_builds", 0) - before.get("plan_builds", 0)
    row["attention_fused"] = after.get("fallback_calls", 0) == before.get("fallback_calls", 0)
    # A repeated shape gets its own plans (built by a worker process after its dense_after-th call):
    # time the steady state.
    row["attention_plan"] = steady_plans(lambda: att(*tensors), q, k, v, True, layout="bshd", mask="causal")
    row["impls"][ATTENTION] = _timed(torch, lambda _: att(*tensors), reps, warm)
    row["impls"][RAW_DENSE] = _raw_dense(torch, row, tensors, out_att, (reps, warm))
    if "step" not in flash:
        try:
            flash["step"], flash["note"] = _working_sdpa(torch, "FLASH_ATTENTION", row["batch"], row["seqlen"])
        except Exception as err:  # noqa: BLE001
            flash["step"], flash["status"] = None, error_status(err)
    if flash["step"] is None:
        row["impls"][SDPA_FLASH] = {"status": flash["status"]}
    else:
        row["impls"][SDPA_FLASH] = _timed(torch, lambda _: flash["step"](*tensors), reps, warm, flash["note"])
    _kernel_times(torch, row, lambda _: att(*tensors), reps)
    row["attention_over_dense_kernels"] = ratio(row["impls"][ATTENTION].get("kernel_ms"),
                                                row["impls"][RAW_DENSE].get("kernel_ms"))
    base = row["impls"][ATTENTION].get("fwd_bwd_ms")
    row["attention_over_dense"] = ratio(base, row["impls"][RAW_DENSE].get("fwd_bwd_ms"))
    row["attention_over_flash"] = ratio(base, row["impls"][SDPA_FLASH].get("fwd_bwd_ms"))


# GPU kernel time of attention() and the dense graph: KERNEL_ROUNDS profiles of each, taken in turns,
# of at least KERNEL_REPS calls (a single 20-call profile moved a 0.056 ms shape by 2%).
KERNEL_ROUNDS, KERNEL_REPS = 3, 100


def _kernel_times(torch: Any, row: dict, att: Callable[[Any], Any], reps: int) -> None:
    """`kernel_ms` (median of the rounds), its rounds and kernel names for attention() and the dense
    graph, and whether both launched the same kernels."""
    calls = {}
    for name in (ATTENTION, RAW_DENSE):
        timed = row["impls"][name]
        fn = att if name == ATTENTION else timed.pop("_call", None)
        if timed.get("status") == RESULT_STATUS_OK and fn is not None:
            calls[name] = fn
        timed.pop("_call", None)
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in calls}
    try:
        for _ in range(KERNEL_ROUNDS):
            for name, fn in calls.items():
                rounds[name].append(kernel_profile(torch, fn, max(reps, KERNEL_REPS)))
    except Exception as err:  # noqa: BLE001
        log(traceback.format_exc())
        for name in calls:
            row["impls"][name]["kernel_status"] = error_status(err)
        return
    for name, profiles in rounds.items():
        totals = [sum(p.values()) for p in profiles]
        row["impls"][name].update(kernel_ms=statistics.median(totals), kernel_rounds_ms=totals,
                                  kernels=sorted(profiles[0]))
    if len(rounds) == 2:
        row["same_kernels"] = row["impls"][ATTENTION]["kernels"] == row["impls"][RAW_DENSE]["kernels"]


def _timed(torch: Any, fn: Callable[[Any], Any], reps: int, warm: int, note: str = "") -> dict:
    try:
        out = {"fwd_bwd_ms": summarize(cuda_times(torch, fn, reps, warm), "ms"), "status": RESULT_STATUS_OK}
    except Exception as err:  # noqa: BLE001
        log(traceback.format_exc())
        out = {"status": error_status(err)}
    if note:
        out["note"] = note
    return out


def _raw_dense(torch: Any, row: dict, tensors: tuple, out_att: Any, timing: tuple[int, int]) -> dict:
    """The exact dense forward and backward graphs of this shape (probing.cudnn.build_graph, FULL,
    static) executed directly on the same memory; their forward output is checked against attention()."""
    from fusedattn_select.runtime.api import config_from_tensors
    from fusedattn_select.types import Phase

    q, k, v, g = tensors
    try:
        dcfg = config_from_tensors(q, k, v, is_training=True, layout="bshd", mask="causal")
        qb, kb, vb, gb = (to_bhsd(t, "bshd") for t in tensors)
        fwd = RawGraph(torch, dcfg, Phase.FORWARD, {"q": qb, "k": kb, "v": vb}, kernel_cache=False)
        bwd = RawGraph(torch, dcfg, Phase.BACKWARD, {"q": qb, "k": kb, "v": vb, "o": fwd.tensors["o"],
                                                     "stats": fwd.tensors["stats"], "dO": gb}, kernel_cache=False)
        fwd()
        torch.cuda.synchronize()
        row["check_rel_err"] = rel_err(to_bhsd(out_att, "bshd"), fwd.tensors["o"])
    except Exception as err:  # noqa: BLE001
        log(traceback.format_exc())
        return {"status": error_status(err)}

    def both(_: Any) -> None:
        fwd()
        bwd()

    out = _timed(torch, both, *timing)
    out["build_ms"] = {"fwd": fwd.build_ms, "bwd": bwd.build_ms}
    out["_call"] = both  # for the kernel time (not saved)
    return out
