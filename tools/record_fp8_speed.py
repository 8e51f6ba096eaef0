"""Record the speed of cuDNN's FP8 attention graphs against bf16 ones on this GPU.

    python -m tools.record_fp8_speed -o fusedattn_select/snapshots/h100-fp8-speed.json

Builds the raw forward and backward graphs of each problem in bf16 and in FP8 (TransformerEngine's
HYBRID recipe: e4m3 forward, e5m2 gradients; FP8 outputs), times each with CUDA events (median of
20 back-to-back runs after 5 warm-up runs), then times attention(fp8=True) (quantization of q, k, v
and the pass back to bf16 included) against bf16 attention() on its own plans, for inference
("forward_quantized" rows), and writes a record fusedattn_select.selection.fp8_speed reads, with the
device fingerprint and versions inside. Exit status 0 when every graph was timed, 1 otherwise
(nothing is written then).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from tools.bench.raw_graph import fp8_graph_config, graph_runner

# (batch, q heads, kv heads, seqlen, head dim): llama-3-8b's heads, the shapes issue benches use.
PROBLEMS = ((2, 32, 8, 4096, 128), (2, 32, 8, 8192, 128))
REPS, WARMUP = 20, 5


def _median_ms(torch: Any, run: Callable[[], None]) -> float:
    from tools.bench.tensors import cuda_times

    return statistics.median(cuda_times(torch, lambda _: run(), REPS, WARMUP))


def _attention_forward_ms(torch: Any, b: int, hq: int, hkv: int, s: int, d: int) -> tuple[float, float]:
    """(bf16 attention(), attention(fp8=True)) inference ms on bshd tensors, causal; the bf16 call
    on its shape's own plans (promoted at its first call, built here)."""
    from fusedattn_select.runtime.api import attention
    from fusedattn_select.runtime.run_settings import run_settings

    run_settings.replace(dense_builds="inline", dense_after=1)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv))
    with torch.no_grad():
        for _ in range(3):
            attention(q, k, v, mask="causal")
            attention(q, k, v, mask="causal", fp8=True)
        return (_median_ms(torch, lambda: attention(q, k, v, mask="causal")),
                _median_ms(torch, lambda: attention(q, k, v, mask="causal", fp8=True)))


def record() -> dict:
    """Time every problem's graphs; the record as JSON data."""
    import torch

    from fusedattn_select.config import AttnConfig
    from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine
    from fusedattn_select.selection.fp8_speed import FORWARD_QUANTIZED, SCHEMA
    from fusedattn_select.types import Backend, Phase

    fingerprint = CudnnEngine().fingerprint()
    rows = []
    for b, hq, hkv, s, d in PROBLEMS:
        base = dict(batch_size=b, num_heads_q=hq, num_heads_kv=hkv, seqlen_q=s, seqlen_kv=s, head_dim_qk=d,
                    mask="causal", is_training=True, qkv_layout="bshd_bshd_bshd")
        bf16 = AttnConfig(qkv_dtype="bf16", **base)
        fp8 = fp8_graph_config(bf16)
        problem = f"b{b} h{hq}/{hkv} s{s} d{d} causal"
        for phase in (Phase.FORWARD, Phase.BACKWARD):
            times = {}
            for name, cfg, backend in (("bf16", bf16, Backend.F16), ("fp8", fp8, Backend.FP8)):
                times[name] = round(_median_ms(torch, graph_runner(torch, cfg, backend, phase)), 4)
                torch.cuda.empty_cache()
            rows.append({"problem": problem, "phase": phase.value, "bf16_ms": times["bf16"], "fp8_ms": times["fp8"]})
            print(f"{problem} {phase.value}: bf16 {times['bf16']} ms, fp8 {times['fp8']} ms", flush=True)
        bf16_ms, fp8_ms = (round(t, 4) for t in _attention_forward_ms(torch, b, hq, hkv, s, d))
        rows.append({"problem": problem, "phase": FORWARD_QUANTIZED, "bf16_ms": bf16_ms, "fp8_ms": fp8_ms})
        print(f"{problem} {FORWARD_QUANTIZED}: bf16 {bf16_ms} ms, fp8 {fp8_ms} ms", flush=True)
        torch.cuda.empty_cache()
    import cudnn

    return {
        "schema": SCHEMA,
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "recorder": "tools/record_fp8_speed.py",
        "fingerprint": dataclasses.asdict(fingerprint),
        "versions": {"torch": torch.__version__, "cudnn_frontend": cudnn.__version__,
                     "cudnn_backend": cudnn.backend_version()},
        "method": f"raw graphs built at FULL depth, median of {REPS} back-to-back CUDA-event-timed runs after "
                  f"{WARMUP}; "
                  "FP8 = e4m3 q/k/v/O, e5m2 dO/dQ/dK/dV, unit scales; inputs normal(0, 1); forward_quantized = "
                  "attention(fp8=True) (current scaling, bf16 in and out) vs bf16 attention() on its own "
                  "plans, inference, bshd",
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True, type=Path, help="record JSON to write")
    args = parser.parse_args(argv)
    try:
        data = record()
    except Exception as err:  # noqa: BLE001 - any failure: say so in the exit status, write nothing
        print(f"record_fp8_speed: not recorded: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    args.output.write_text(json.dumps(data, indent=1) + "\n")
    print(f"record_fp8_speed: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
