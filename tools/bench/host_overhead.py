"""Section 5, tiny-problem part: per-call host+GPU time of attention() vs a raw cuDNN graph execute
vs torch SDPA on a problem small enough that the host's work per call dominates. The timed batches
of the implementations take turns (common.in_turns): a host busy for a while weighs on all alike.

A training call's backward runs on autograd's device thread: handing it over and back costs two
thread wake-ups, as much for every implementation and often more than the work itself. The rows
"on the calling thread" (autograd multithreading off) time the same calls without that handoff."""

from __future__ import annotations

import contextlib
import time
import traceback
from typing import Any, Callable, Mapping

from tools.bench.common import (
    RESULT_STATUS_OK,
    call_entry,
    error_status,
    first_line,
    fmt_ratio,
    fmt_stat,
    in_turns,
    log,
    md_table,
    ratio,
    steady_plans,
    summarize,
)
from tools.bench.raw_graph import RawGraph
from tools.bench.tensors import rel_err, to_bhsd


def _batch_timer(torch: Any, fn: Callable[[], Any], calls: int, context: Callable[[], Any]) -> Any:
    """A common.in_turns timer: µs per call over one batch of `calls` back-to-back calls of fn (inside
    `context()`), synchronized; 50 calls to warm up before the first batch."""
    def timer(first: bool) -> dict[str, list[float]]:
        with context():
            for _ in range(50 if first else 1):
                fn()
            torch.cuda.synchronize()
            started = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            return {"us": [(time.perf_counter_ns() - started) / calls / 1e3]}

    return timer


def measure(torch: Any, F: Any, r: dict, args: Mapping) -> None:
    """Per-call time of each implementation, inference and training, the batches taken in turns."""
    from fusedattn_select.runtime.api import attention, config_from_tensors
    from fusedattn_select.types import Phase

    b, h, s, d = 1, 1, 64, 64
    r["shape"] = f"bshd b{b} h{h} s{s} d{d} bf16 no_mask"
    calls, batches = int(args["tiny_calls"]), int(args["tiny_batches"])
    r["calls"] = calls
    r["rows"] = rows = []
    timers: list[tuple[str, Any]] = []
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qb, kb, vb = (to_bhsd(t, "bshd") for t in (q, k, v))

    def add(name: str, fn: Callable[[], Any], context: Callable[[], Any] = contextlib.nullcontext) -> None:
        rows.append({"name": name, "kind": _kind(name)})
        timers.append((name, _batch_timer(torch, fn, calls, context)))

    with torch.no_grad():
        # A repeated shape: timed once it runs its own plans (built by the worker process).
        r["attention_plan"] = steady_plans(lambda: attention(q, k, v), q, k, v, False)
        add("attention()", lambda: attention(q, k, v), torch.no_grad)
        try:
            raw = RawGraph(torch, config_from_tensors(q, k, v, is_training=False), Phase.FORWARD,
                           {"q": qb, "k": kb, "v": vb}, kernel_cache=True)
            add("raw cuDNN graph execute (preallocated output)", raw, torch.no_grad)
            r["raw_check_rel_err"] = rel_err(to_bhsd(attention(q, k, v), "bshd"), raw.tensors["o"])
        except Exception as err:  # noqa: BLE001
            rows.append({"name": "raw cuDNN graph execute", "status": error_status(err)})
    _sdpa_rows(torch, F, add, rows, "", lambda: F.scaled_dot_product_attention(qb, kb, vb), torch.no_grad)
    r["attention_plan_training"] = _training_rows(torch, F, add, rows, (q, k, v))
    r["attention_path"] = {kind: _path(call_entry(q, k, v, kind == "training")) for kind in ("inference", "training")}
    by_name = in_turns(timers, batches)
    for row in rows:
        got = by_name.get(row["name"])
        if got is None or "status" in row:
            continue
        if "error" in got:
            row["status"] = error_status(got["error"])
            log("".join(traceback.format_exception(got["error"])))
        else:
            row["us"] = summarize(got["us"], "us")
    r["status"] = RESULT_STATUS_OK


TRAINING = " fwd+bwd (training)"
CALLING_THREAD = ", autograd on the calling thread"


def _kind(name: str) -> str:
    """The kind of call a row times, which its ratio compares within."""
    if CALLING_THREAD in name:
        return "training on the calling thread"
    return "training" if TRAINING in name else "inference"


def _path(entry: Any) -> str:
    """How attention() ran a call: the compiled lean path, the Python lean path, or another."""
    if entry is None or entry.lean is None:
        return "general" if entry is not None else "unknown"
    return "compiled" if entry.lean.native is not None else "python"


def _calling_thread(torch: Any) -> Any:
    return torch.autograd.set_multithreading_enabled(False)


def _sdpa_rows(torch: Any, F: Any, add: Callable, rows: list, suffix: str, fn: Callable[[], Any],
               grad_mode: Callable[[], Any] = contextlib.nullcontext) -> None:
    """torch SDPA with its default choice and with each backend forced (each in `grad_mode()`)."""
    add("torch SDPA (its default backend choice)" + suffix, fn, grad_mode)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as err:
        rows.append({"name": "torch SDPA backends" + suffix, "status": f"n/a: {first_line(err)}"})
        return
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
        try:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                fn()  # a backend that cannot run this problem says so here, not in a timed batch
        except Exception as err:  # noqa: BLE001
            rows.append({"name": f"torch SDPA {backend}{suffix}", "status": f"n/a: {first_line(err)}"})
            continue

        def context(b: Any = getattr(SDPBackend, backend)) -> Any:
            stack = contextlib.ExitStack()
            stack.enter_context(grad_mode())
            stack.enter_context(sdpa_kernel(b))
            return stack

        add(f"torch SDPA {backend}{suffix}", fn, context)


def _training_rows(torch: Any, F: Any, add: Callable, rows: list, tensors: tuple) -> str:
    """Forward + backward (torch.autograd.grad of q, k, v) per call: attention() vs torch SDPA; the
    plans attention() ran ("dense" or "bucket")."""
    from fusedattn_select.runtime.api import attention

    q, k, v = (t.detach().clone().requires_grad_(True) for t in tensors)
    grad = torch.randn_like(q)
    plan = steady_plans(lambda: torch.autograd.grad(attention(q, k, v), (q, k, v), grad), q, k, v, True)
    ours = lambda: torch.autograd.grad(attention(q, k, v), (q, k, v), grad)  # noqa: E731
    add("attention()" + TRAINING, ours)
    qb, kb, vb = (to_bhsd(t, "bshd").detach().contiguous().requires_grad_(True) for t in (q, k, v))
    grad_b = to_bhsd(grad, "bshd").contiguous()
    sdpa = lambda: torch.autograd.grad(F.scaled_dot_product_attention(qb, kb, vb), (qb, kb, vb), grad_b)  # noqa: E731
    _sdpa_rows(torch, F, add, rows, TRAINING, sdpa)
    add("attention()" + TRAINING + CALLING_THREAD, ours, lambda: _calling_thread(torch))
    add("torch SDPA (its default backend choice)" + TRAINING + CALLING_THREAD, sdpa, lambda: _calling_thread(torch))
    return plan


def render(tiny: Mapping) -> str:
    if tiny.get("rows"):
        def base(row: Mapping) -> Any:
            kind = row.get("kind") or _kind(str(row.get("name")))
            return next((r.get("us") for r in tiny["rows"]
                         if (r.get("kind") or _kind(str(r.get("name")))) == kind
                         and str(r.get("name")).startswith("attention()")), None)
        paths = tiny.get("attention_path") or {}
        ran = (f" attention() ran the {paths.get('inference')} path for inference and the "
               f"{paths.get('training')} path for training." if paths else "")
        if any(CALLING_THREAD in str(r.get("name")) for r in tiny["rows"]):
            ran += (" The training rows on the calling thread turn autograd's device thread off, which takes "
                    "the two thread wake-ups of handing the backward over and back out of every "
                    "implementation's time.")
        return (f"Per-call host+GPU time on a tiny problem ({tiny.get('shape', '')}), inference and training "
                f"(forward+backward), {tiny.get('calls', '?')} back-to-back calls per timed batch, the "
                f"implementations' batches in turns.{ran}\n\n" + md_table(
                    ("call", "µs per call", "ratio to attention() (of its kind)"),
                    [(r.get("name"), fmt_stat(r.get("us")) if r.get("us") else r.get("status", "n/a"),
                      fmt_ratio(ratio(r.get("us"), base(r)))) for r in tiny["rows"]]))
    if tiny.get("status"):
        return f"Tiny problem: {tiny.get('status')}"
    return ""
