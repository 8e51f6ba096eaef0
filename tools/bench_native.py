#!/usr/bin/env python3
"""attention() on the compiled lean path vs the Python lean path vs torch SDPA, taken in turns.

    FUSEDATTN_SELECT_NATIVE_DIR=DIR python3 -m fusedattn_select.cli native build
    FUSEDATTN_SELECT_NATIVE_DIR=DIR python3 tools/bench_native.py [--rounds 7] [--out DIR]

For each problem, in one process, each implementation times a batch of back-to-back calls (the
host+GPU time a user sees: wall clock around the batch, synchronised at both ends), one batch of
each before the next round of any, the order rotating (tools/bench/common.in_turns):

    compiled       attention(), its lean entry run by the compiled module (runtime/native), found
                   in the module's table of call signatures
    python         the same entry with the compiled plan taken away: the pure-Python lean path
    sdpa cudnn     torch SDPA with only its cuDNN backend enabled
    sdpa default   torch SDPA with its own backend choice
    sdpa flash     torch SDPA with only its flash backend enabled

Training problems time forward+backward (autograd.grad); decode is one query token against a
1024-token cache (bhsd), as generate() calls it. Medians and minimums of the per-call times are
printed and written to DIR/bench-native.json and .md with the device and versions.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fusedattn_select.runtime import native  # noqa: E402
from fusedattn_select.runtime.api import attention  # noqa: E402
from tools.bench.common import call_entry, in_turns, steady_plans  # noqa: E402
from tools.bench.host_overhead import _batch_timer  # noqa: E402

# name: (b, s_q, s_kv, heads_q, heads_kv, d, mask, training, layout, calls per batch)
PROBLEMS = {
    "tiny inference (b1 h1 s64 d64)": (1, 64, 64, 1, 1, 64, "no_mask", False, "bshd", 300),
    "tiny training (b1 h1 s64 d64)": (1, 64, 64, 1, 1, 64, "no_mask", True, "bshd", 300),
    "decode (b1 h32/8 q1 kv1024 d128)": (1, 1, 1024, 32, 8, 128, "no_mask", False, "bhsd", 300),
    "GPT-2 (b8 h12 s1024 d64 causal) training": (8, 1024, 1024, 12, 12, 64, "causal", True, "bshd", 50),
    "ViT-B/16 224 (b64 h12 s197 d64) training": (64, 197, 197, 12, 12, 64, "no_mask", True, "bshd", 50),
    "ViT-B/16 384 (b16 h12 s577 d64) training": (16, 577, 577, 12, 12, 64, "no_mask", True, "bshd", 50),
    "llama-3-8b heads (b2 h32/8 s2048 d128 causal) training": (2, 2048, 2048, 32, 8, 128, "causal", True, "bshd", 20),
}
SDPA = {"sdpa cudnn": ("cudnn",), "sdpa default": ("cudnn", "flash", "mem_efficient", "math"), "sdpa flash": ("flash",)}


def _sdpa_backends(enabled: tuple[str, ...]) -> None:
    for name in ("cudnn", "flash", "mem_efficient", "math"):
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(name in enabled)


def _after(setup):
    """A context (for host_overhead's batch timer) that runs `setup` before its batch."""
    @contextlib.contextmanager
    def context():
        setup()
        yield
    return context


def measure(name: str, spec: tuple, rounds: int) -> dict:
    b, sq, skv, hq, hkv, d, mask, training, layout, calls = spec
    shape = (lambda h, s: (b, s, h, d)) if layout == "bshd" else (lambda h, s: (b, h, s, d))
    q = torch.randn(shape(hq, sq), device="cuda", dtype=torch.bfloat16, requires_grad=training)
    k, v = (torch.randn(shape(hkv, skv), device="cuda", dtype=torch.bfloat16, requires_grad=training) for _ in range(2))
    grad = torch.randn_like(q)
    to_bhsd = (lambda t: t.transpose(1, 2)) if layout == "bshd" else (lambda t: t)
    qs, ks, vs = (to_bhsd(t.detach()).requires_grad_(training) for t in (q, k, v))
    gs = to_bhsd(grad)
    causal = mask == "causal"

    def ours():
        out = attention(q, k, v, layout=layout, mask=mask)
        if training:
            torch.autograd.grad(out, (q, k, v), grad)

    def sdpa():
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=hq != hkv)
        if training:
            torch.autograd.grad(out, (qs, ks, vs), gs)

    row: dict = {"problem": name, "calls_per_batch": calls}
    with torch.set_grad_enabled(training):
        row["plans"] = steady_plans(lambda: attention(q, k, v, layout=layout, mask=mask), q, k, v, training,
                                    layout=layout, mask=mask)
        entry = call_entry(q, k, v, training, layout=layout, mask=mask)
        if entry is None or entry.lean is None or entry.lean.native is None:
            row["status"] = "no compiled plan for this call (not lean, or the module is not built)"
            return row
        compiled = entry.lean
        python = dataclasses.replace(compiled, native=None)
        def use(lean):
            def setup():
                entry.lean = lean
                native.forget_calls()  # the table holds the compiled plan: the next call decides again
                _sdpa_backends(SDPA["sdpa default"])
            return setup

        def backend(enabled):
            return lambda: _sdpa_backends(enabled)

        timers = [("compiled", _batch_timer(torch, ours, calls, _after(use(compiled)))),
                  ("python", _batch_timer(torch, ours, calls, _after(use(python))))]
        timers += [(label, _batch_timer(torch, sdpa, calls, _after(backend(enabled)))) for label, enabled in SDPA.items()]
        try:
            results = in_turns(timers, rounds)
        finally:
            use(compiled)()
    for label, samples in results.items():
        if "error" in samples:
            row[label] = {"error": f"{type(samples['error']).__name__}: {samples['error']}"[:200]}
        else:
            row[label] = {"median_us": round(statistics.median(samples["us"]), 2), "min_us": round(min(samples["us"]), 2)}
    return row


def render(result: dict) -> str:
    labels = ("compiled", "python") + tuple(SDPA)
    lines = [f"Device: {result['device']}; torch {result['torch']}, cuDNN {result['cudnn']}, "
             f"cudnn-frontend {result['frontend']}. Per-call µs (median of {result['rounds']} batches taken in "
             "turns; min in brackets); ratios are compiled / the named one.", "",
             "| problem | " + " | ".join(labels) + " | compiled/python | compiled/sdpa cudnn | compiled/sdpa default |",
             "|---|" + "---|" * (len(labels) + 3)]
    for row in result["rows"]:
        if "status" in row:
            lines.append(f"| {row['problem']} | {row['status']} |" + " |" * (len(labels) + 2))
            continue
        cells = [f"{row[x]['median_us']:.1f} ({row[x]['min_us']:.1f})" if "median_us" in row[x] else row[x]["error"]
                 for x in labels]
        base = row["compiled"].get("median_us")
        ratios = [f"{base / row[x]['median_us']:.3f}" if base and "median_us" in row[x] else "-"
                  for x in ("python", "sdpa cudnn", "sdpa default")]
        lines.append(f"| {row['problem']} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--only", nargs="*", help="problem names to run (default: all)")
    args = parser.parse_args()
    if native.load() is None:
        print(f"error: the compiled module is not built for this torch and frontend ({native.status()}); "
              "run `fusedattn-select native build`", file=sys.stderr)
        return 1
    import cudnn

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "frontend": cudnn.__version__, "rounds": args.rounds,
              "revision": os.environ.get("FUSEDATTN_BENCH_REV", ""), "rows": []}
    for name, spec in PROBLEMS.items():
        if args.only and name not in args.only:
            continue
        row = measure(name, spec, args.rounds)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-native.json").write_text(json.dumps(result, indent=2))
    (out / "bench-native.md").write_text(render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
