#!/usr/bin/env python3
"""Per-call time of attention() vs raw cudnn-frontend execute vs torch SDPA, forward and backward.

    python3 tools/bench_dispatch.py [--reps 30] [--warmup 5] [--json FILE]

Shapes: the Llama-3-8B attention (b2, 32 query / 8 KV heads, s4096, d128, causal, bf16), where the
kernels dominate, and a tiny problem (b1 h1 s128 d64), where per-call host overhead dominates.

For each shape and pass the three contenders run side by side in one process:

    attention()   fusedattn_select.attention on BSHD tensors (the dispatch layer: hot-path lookup,
                  binding, output allocation, stream/handle, autograd for the backward pass)
    raw execute   the very graph dispatch built, executed with a variant pack and workspace
                  prepared once outside the timed loop (the floor for any cuDNN caller)
    torch SDPA    torch.nn.functional.scaled_dot_product_attention (its own backend choice) on
                  the same BSHD memory viewed as BHSD, enable_gqa=True

A timed sample is `--inner` back-to-back calls between two CUDA events on the current stream,
divided by `--inner`; the medians of `--reps` samples are printed with their ratios. Backward
times are the backward alone (autograd.grad with retain_graph on a saved forward).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fusedattn_select.runtime import api as dispatch  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.api import attention  # noqa: E402

SHAPES = {
    "llama3-8b": dict(b=2, hq=32, hkv=8, s=4096, d=128),
    "tiny": dict(b=1, hq=1, hkv=1, s=128, d=64),
}


def _time(fn, reps: int, warmup: int, inner: int) -> float:
    """Median milliseconds per call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / inner)
    return statistics.median(samples)


def _raw_runner(plan, feeds: dict, outputs: dict):
    """A closure executing `plan`'s graph with a pack and workspace built once."""
    from fusedattn_select.runtime import plans
    pack = {plan.cudnn_tensors[name]: feeds[name] for name in plan.inputs}
    pack.update({plan.cudnn_tensors[name]: outputs[name] for name in plan.outputs})
    workspace = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    handle, _ = plans._prepare_handle(plan.device)
    graph = plan.graph

    def run():
        graph.execute(pack, workspace, handle=handle)

    return run


def bench_shape(name: str, b: int, hq: int, hkv: int, s: int, d: int, reps: int, warmup: int) -> dict:
    inner = 1 if name == "llama3-8b" else 50
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    grad_out = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    result: dict = {"shape": dict(b=b, hq=hq, hkv=hkv, s=s, d=d, causal=True, dtype="bf16")}

    # ----- forward (inference) -----
    with torch.no_grad():
        attention(q, k, v, mask="causal")
    entry = list(dispatcher.entries.values())[-1]
    if not entry.fused:
        raise SystemExit(f"{name}: attention() fell back ({entry.reason}); nothing to benchmark")
    plan = entry.forward
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
    feeds = {"q": plan.conform("q", qb), "k": plan.conform("k", kb), "v": plan.conform("v", vb)}
    outputs = {n: plan.allocate(n) for n in plan.outputs}
    raw_fwd = _raw_runner(plan, feeds, outputs)

    def ours_fwd():
        with torch.no_grad():
            attention(q, k, v, mask="causal")

    def torch_fwd():
        with torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=hq != hkv)

    fwd = {
        "attention": _time(ours_fwd, reps, warmup, inner),
        "raw_execute": _time(raw_fwd, reps, warmup, inner),
        "torch_sdpa": _time(torch_fwd, reps, warmup, inner),
    }

    # ----- backward -----
    ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))
    out = attention(ql, kl, vl, mask="causal")
    train_entry = list(dispatcher.entries.values())[-1]
    bplan = train_entry.backward
    stats = train_entry.forward.execute(
        {"q": feeds["q"], "k": feeds["k"], "v": feeds["v"]})["stats"]
    bfeeds = {
        "q": feeds["q"], "k": feeds["k"], "v": feeds["v"], "o": bplan.conform("o", out.detach().transpose(1, 2)),
        "dO": bplan.conform("dO", grad_out.transpose(1, 2)), "stats": bplan.conform("stats", stats),
    }
    boutputs = {n: bplan.allocate(n) for n in bplan.outputs}
    raw_bwd = _raw_runner(bplan, bfeeds, boutputs)
    ref_out = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (ql, kl, vl)), is_causal=True, enable_gqa=hq != hkv)
    ref_grad = grad_out.transpose(1, 2)

    def ours_bwd():
        torch.autograd.grad(out, (ql, kl, vl), grad_out, retain_graph=True)

    def torch_bwd():
        torch.autograd.grad(ref_out, (ql, kl, vl), ref_grad, retain_graph=True)

    bwd = {
        "attention": _time(ours_bwd, reps, warmup, inner),
        "raw_execute": _time(raw_bwd, reps, warmup, inner),
        "torch_sdpa": _time(torch_bwd, reps, warmup, inner),
    }
    flops = 4 * b * hq * s * s * d / 2  # causal: half the score matrix
    for label, times, mult in (("forward", fwd, 1.0), ("backward", bwd, 2.5)):
        result[label] = {
            "ms": {k: round(v, 4) for k, v in times.items()},
            "attention_over_raw": round(times["attention"] / times["raw_execute"], 3),
            "attention_over_torch_sdpa": round(times["attention"] / times["torch_sdpa"], 3),
            "tflops": {k: round(flops * mult / (v * 1e-3) / 1e12, 1) for k, v in times.items()},
        }
    return result


def _profile_tiny(calls: int) -> None:
    import cProfile
    import pstats

    shape = SHAPES["tiny"]
    q, k, v = (torch.randn(shape["b"], shape["s"], shape["hq"], shape["d"], device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    with torch.no_grad():
        attention(q, k, v, mask="causal")
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            attention(q, k, v, mask="causal")
        profiler.disable()
    torch.cuda.synchronize()
    print(f"cProfile of {calls} warm tiny forward calls (tottime, top 15):")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--json", default=None, help="write results here (default: $OUT/bench_dispatch.json if $OUT is set)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also cProfile N warm tiny forward calls and print where the host time goes")
    args = parser.parse_args()

    import cudnn

    versions = {
        "torch": torch.__version__, "cudnn_backend": cudnn.backend_version(),
        "cudnn_frontend": getattr(cudnn, "__version__", "?"), "device": torch.cuda.get_device_name(),
    }
    print("versions:", json.dumps(versions))
    results = {"versions": versions, "shapes": {}}
    for name in args.shapes.split(","):
        res = bench_shape(name, **SHAPES[name], reps=args.reps, warmup=args.warmup)
        results["shapes"][name] = res
        for label in ("forward", "backward"):
            r = res[label]
            ms = r["ms"]
            print(f"{name:10s} {label:8s} attention {ms['attention']:.4f} ms | raw execute {ms['raw_execute']:.4f} ms"
                  f" | torch SDPA {ms['torch_sdpa']:.4f} ms | attention/raw {r['attention_over_raw']:.3f}"
                  f" | attention/torch {r['attention_over_torch_sdpa']:.3f}"
                  + (f" | TFLOPS {r['tflops']}" if name != "tiny" else ""))
    if args.profile:
        _profile_tiny(args.profile)
    print("dispatch_info:", json.dumps(dispatch.dispatch_info()))
    target = args.json or (os.path.join(os.environ["OUT"], "bench_dispatch.json") if os.environ.get("OUT") else None)
    if target:
        Path(target).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
