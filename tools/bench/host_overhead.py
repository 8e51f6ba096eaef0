"""Section 5, tiny-problem part: per-call host+GPU time of attention() vs a raw cuDNN graph execute
vs torch SDPA on a problem small enough that the host's work per call dominates."""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable, Mapping

from tools.bench.common import (
    RESULT_STATUS_OK,
    error_status,
    first_line,
    fmt_ratio,
    fmt_stat,
    log,
    md_table,
    ratio,
    steady_plans,
    summarize,
)
from tools.bench.raw_graph import RawGraph
from tools.bench.tensors import rel_err, to_bhsd


def _per_call_us(torch: Any, fn: Callable[[], Any], calls: int, batches: int) -> list[float]:
    """µs per call over `batches` timed batches of `calls` back-to-back calls, synchronized."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(batches):
        started = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter_ns() - started) / calls / 1e3)
    return samples


def measure(torch: Any, F: Any, r: dict, args: Mapping) -> None:
    from fusedattn_select.runtime.api import attention, config_from_tensors
    from fusedattn_select.types import Phase

    b, h, s, d = 1, 1, 64, 64
    r["shape"] = f"bshd b{b} h{h} s{s} d{d} bf16 no_mask"
    calls, batches = int(args["tiny_calls"]), int(args["tiny_batches"])
    r["calls"] = calls
    r["rows"] = rows = []
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qb, kb, vb = (to_bhsd(t, "bshd") for t in (q, k, v))

    def add(name: str, fn: Callable[[], Any]) -> None:
        try:
            rows.append({"name": name, "us": summarize(_per_call_us(torch, fn, calls, batches), "us")})
        except Exception as err:  # noqa: BLE001
            rows.append({"name": name, "status": error_status(err)})
            log(traceback.format_exc())

    with torch.no_grad():
        # A repeated shape: timed once it runs its own plans (built by the worker process).
        r["attention_plan"] = steady_plans(lambda: attention(q, k, v), q, k, v, False)
        add("attention()", lambda: attention(q, k, v))
        try:
            raw = RawGraph(torch, config_from_tensors(q, k, v, is_training=False), Phase.FORWARD,
                           {"q": qb, "k": kb, "v": vb}, kernel_cache=True)
            add("raw cuDNN graph execute (preallocated output)", raw)
            r["raw_check_rel_err"] = rel_err(to_bhsd(attention(q, k, v), "bshd"), raw.tensors["o"])
        except Exception as err:  # noqa: BLE001
            rows.append({"name": "raw cuDNN graph execute", "status": error_status(err)})
        _sdpa_rows(F, add, rows, "", lambda: F.scaled_dot_product_attention(qb, kb, vb))
    r["attention_plan_training"] = _training_rows(torch, F, add, rows, (q, k, v))
    r["status"] = RESULT_STATUS_OK


def _sdpa_rows(F: Any, add: Callable, rows: list, suffix: str, fn: Callable[[], Any]) -> None:
    """torch SDPA with its default choice and with each backend forced."""
    add("torch SDPA (its default backend choice)" + suffix, fn)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as err:
        rows.append({"name": "torch SDPA backends" + suffix, "status": f"n/a: {first_line(err)}"})
        return
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
        try:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                add(f"torch SDPA {backend}{suffix}", fn)
        except Exception as err:  # noqa: BLE001
            rows.append({"name": f"torch SDPA {backend}{suffix}", "status": f"n/a: {first_line(err)}"})


def _training_rows(torch: Any, F: Any, add: Callable, rows: list, tensors: tuple) -> str:
    """Forward + backward (torch.autograd.grad of q, k, v) per call: attention() vs torch SDPA; the
    plans attention() ran ("dense" or "bucket")."""
    from fusedattn_select.runtime.api import attention

    q, k, v = (t.detach().clone().requires_grad_(True) for t in tensors)
    grad = torch.randn_like(q)
    plan = steady_plans(lambda: torch.autograd.grad(attention(q, k, v), (q, k, v), grad), q, k, v, True)
    add("attention() fwd+bwd (training)", lambda: torch.autograd.grad(attention(q, k, v), (q, k, v), grad))
    qb, kb, vb = (to_bhsd(t, "bshd").detach().contiguous().requires_grad_(True) for t in (q, k, v))
    grad_b = to_bhsd(grad, "bshd").contiguous()
    _sdpa_rows(F, add, rows, " fwd+bwd (training)", lambda: torch.autograd.grad(
        F.scaled_dot_product_attention(qb, kb, vb), (qb, kb, vb), grad_b))
    return plan


def render(tiny: Mapping) -> str:
    if tiny.get("rows"):
        def base(row: Mapping) -> Any:
            name = "attention() fwd+bwd (training)" if "training" in str(row.get("name")) else "attention()"
            return next((r.get("us") for r in tiny["rows"] if r.get("name") == name), None)
        return (f"Per-call host+GPU time on a tiny problem ({tiny.get('shape', '')}), inference and training "
                f"(forward+backward), {tiny.get('calls', '?')} back-to-back calls per timed batch:\n\n" + md_table(
                    ("call", "µs per call", "ratio to attention() (of its kind)"),
                    [(r.get("name"), fmt_stat(r.get("us")) if r.get("us") else r.get("status", "n/a"),
                      fmt_ratio(ratio(r.get("us"), base(r)))) for r in tiny["rows"]]))
    if tiny.get("status"):
        return f"Tiny problem: {tiny.get('status')}"
    return ""
