"""How the offsets and lengths of a new shape reach the device, side by side (host µs per new shape).

    python -m tools.bench_bindings [-o results.json]

A bucket plan runs a new (batch, length) with a few small int32 tensors: ragged offsets per tensor
and the sequence lengths. This times making them for 200 new decode lengths (b1, 16/4 heads, d64),
interleaved over 5 rounds: every tensor by a few device kernels each (arange, clamp, zeros, fill:
the way before) and by `ragged.bindings` (one non-blocking copy from pageable memory, then a view per
tensor); and, for the transfer alone, the same values copied through pinned memory, blocking from
pageable memory, and non-blocking from pageable memory. Then, with ~30 ms of matrix products queued
on the GPU, whether each one waits for that work (host ms of the call, and GPU work left after it).
Prints the device, versions and figures; writes them as JSON with -o.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from types import SimpleNamespace
from typing import Any, Callable


def _plan(torch: Any) -> Any:
    from fusedattn_select.runtime.plans import TensorSpec

    def spec(dims: tuple, strides: tuple, dtype: Any = torch.bfloat16) -> TensorSpec:
        return TensorSpec(dims, strides, dtype)

    one = ((1, 1, 1, 1), (1, 1, 1, 1), torch.int32)
    specs = {"q": spec((1, 16, 512, 64), (512 * 1024, 64, 1024, 1)),
             "k": spec((1, 4, 512, 64), (512 * 256, 64, 256, 1)),
             "o": spec((1, 16, 512, 64), (512 * 1024, 64, 1024, 1)),
             "seq_len_q": spec(*one), "seq_len_kv": spec(*one)}
    offsets = ("ragged_offset_q", "ragged_offset_kv", "ragged_offset_o")
    for name in offsets:
        specs[name] = spec((2, 1, 1, 1), (1, 1, 1, 1), torch.int32)
    return SimpleNamespace(inputs=("q", "k", *offsets, "seq_len_q", "seq_len_kv"), specs=specs)


def _ways(torch: Any, plan: Any, device: Any) -> dict[str, Callable[[Any], Any]]:
    from fusedattn_select.runtime import ragged

    def values(shape: Any) -> list[int]:
        flat = []
        for name in plan.inputs:
            if name.startswith("ragged_offset_"):
                flat += ragged._offsets(plan, name, shape)[1]
        return flat + [shape.seqlen_q, shape.seqlen_kv]

    def kernels(shape: Any) -> dict:
        feeds, made = {}, {}
        for name in plan.inputs:
            if name.startswith("ragged_offset_"):
                key, _ = ragged._offsets(plan, name, shape)
                if key not in made:  # tensors of one token stride share their offsets, as before
                    _, slots, step, batch = key
                    offsets = torch.arange(0, slots * step, step, device=device, dtype=torch.int32)
                    made[key] = offsets.clamp_(max=batch * step).view(slots, 1, 1, 1)
                feeds[name] = made[key]
        for name, length in (("seq_len_q", shape.seqlen_q), ("seq_len_kv", shape.seqlen_kv)):
            lengths = torch.zeros(1, 1, 1, 1, dtype=torch.int32, device=device)
            lengths[:shape.batch] = length
            feeds[name] = lengths
        return feeds

    return {
        "every tensor, by kernels per tensor (before)": kernels,
        "every tensor, by ragged.bindings (one pageable non-blocking copy)": lambda s: ragged.bindings(
            [plan], s, device),
        "the values only, pinned non-blocking copy": lambda s: torch.tensor(
            values(s), dtype=torch.int32, pin_memory=True).to(device, non_blocking=True),
        "the values only, pageable blocking copy": lambda s: torch.tensor(values(s), dtype=torch.int32,
                                                                           device=device),
        "the values only, pageable non-blocking copy": lambda s: torch.tensor(
            values(s), dtype=torch.int32).to(device, non_blocking=True),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    import torch

    from fusedattn_select.runtime import ragged

    device = torch.device("cuda")
    ways = _ways(torch, _plan(torch), device)
    from tools.bench.environment import emit, standalone_record

    record: dict[str, Any] = dict(standalone_record(torch), host_us_per_new_shape={}, with_queued_work={})
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(5):
        for name, way in ways.items():
            torch.cuda.synchronize()
            for n in range(300, 500):
                started = time.perf_counter()
                way(ragged.Shape(1, 1, n))
                times[name].append((time.perf_counter() - started) * 1e6)
            torch.cuda.synchronize()
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for name, way in ways.items():
        torch.cuda.synchronize()
        for _ in range(20):
            a @ a
        started = time.perf_counter()
        way(ragged.Shape(1, 1, 777))
        host = (time.perf_counter() - started) * 1e3
        started = time.perf_counter()
        torch.cuda.synchronize()
        record["with_queued_work"][name] = {"host_ms": round(host, 3),
                                            "gpu_ms_left": round((time.perf_counter() - started) * 1e3, 2)}
        record["host_us_per_new_shape"][name] = round(statistics.median(times[name]), 1)
    emit(record, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
