"""What a steady shape's promotion to its own plans costs the caller: per-call wall time of a
forward+backward across the promotion, with the worker process building the plans (twice: the
first job starts the worker) and built inline. `python -m tools.bench_promotion [out.json]`."""

from __future__ import annotations

import json
import statistics
import sys
import time


def across_promotion(torch, mode: str, seqlen: int) -> dict:
    from fusedattn_select.runtime.api import attention
    from fusedattn_select.runtime.run_settings import run_settings
    from tools.bench.common import call_entry

    run_settings.replace(dense_builds=mode)
    q = torch.randn(2, seqlen, 8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, seqlen, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    g = torch.randn_like(q)
    times, started, promoted = [], time.perf_counter(), None
    for i in range(20000):
        t = time.perf_counter()
        torch.autograd.grad(attention(q, k, v, mask="causal"), (q, k, v), g)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
        if promoted is None and not call_entry(q, k, v, True, mask="causal").bucketed:
            promoted = {"call": i, "after_s": time.perf_counter() - started, "call_ms": times[-1]}
        if promoted is not None and i > promoted["call"] + 20:
            break
        time.sleep(0.002)
    later = times[1:]
    return {"mode": mode, "shape": f"b2 s{seqlen} h8/2 d64 causal bf16 fwd+bwd", "first_call_ms": times[0],
            "later_max_ms": max(later), "later_median_ms": statistics.median(later), "promotion": promoted,
            "calls_over_5_ms": sum(1 for x in later if x > 5)}


def main() -> None:
    import cudnn
    import torch

    rows = [across_promotion(torch, "process", 300), across_promotion(torch, "process", 420),
            across_promotion(torch, "inline", 520)]
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn_backend": cudnn.backend_version(), "cudnn_frontend": cudnn.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    text = json.dumps(out, indent=1)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
