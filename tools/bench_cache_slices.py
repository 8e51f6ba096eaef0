"""Decode steps whose K and V are slices of a preallocated BSHD cache (k_cache[:, :L]), side by side.

    python -m tools.bench_cache_slices [-o results.json]

b4, 32/8 heads, d128, bf16, one query token, a (4, 16384, 8, 128) K and V cache. attention() on the
slices as they are (its bucket plans read the cache's rows in place), attention() on contiguous
copies of the slices (what every such step cost before: a copy of K and V, then the plans), and
torch SDPA pinned to flash on the same slices. Host+GPU µs per call over 48 consecutive lengths
from about 1024, 4000 and 12000 (each length decided by an untimed pass first: the per-call cost,
not the first call's decision), and at one fixed length (4096, 300 calls), in turns over 3 rounds.
Prints the device, versions and figures; writes them as JSON with -o.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

STARTS = (1024, 4000, 12000)
FIXED = 4096
B, HQ, HKV, D, CAPACITY = 4, 32, 8, 128, 16384


def _per_call_us(torch: Any, fn: Callable[[int], Any], lengths: list[int]) -> float:
    for length in lengths:  # decided before the timed pass
        fn(length)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for length in lengths:
        fn(length)
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / len(lengths) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fusedattn_select.runtime.api import attention
    from tools.bench.environment import _cudnn_versions, _git_rev

    k_cache, v_cache = (torch.randn(B, CAPACITY, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)

    def flash(length: int) -> Any:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k_cache[:, :length].transpose(1, 2),
                                                  v_cache[:, :length].transpose(1, 2), enable_gqa=True)

    ways = {
        "attention() on the slices (read in place)": lambda n: attention(q, k_cache[:, :n], v_cache[:, :n]),
        "attention() on contiguous copies (copy, then the plans: as before)": lambda n: attention(
            q, k_cache[:, :n].contiguous(), v_cache[:, :n].contiguous()),
        "torch SDPA FLASH_ATTENTION on the slices": flash,
    }
    record: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              **_cudnn_versions(), "fusedattn_select": _git_rev(),
                              "shape": f"b{B} h{HQ}/{HKV} d{D} bf16, s_q 1, cache {CAPACITY}", "us_per_call": {}}
    cases = {f"lengths {s}..{s + 47} (+300 per round)": lambda r, s=s: list(range(s + 300 * r, s + 300 * r + 48))
             for s in STARTS}
    cases[f"fixed length {FIXED} (copies: promoted to dense plans)"] = lambda r: [FIXED] * 300
    with torch.no_grad():
        for case, lengths in cases.items():
            times: dict[str, list[float]] = {name: [] for name in ways}
            for r in range(3):
                for name, way in ways.items():
                    times[name].append(_per_call_us(torch, way, lengths(r)))
            record["us_per_call"][case] = {name: round(statistics.median(t), 1) for name, t in times.items()}
    print(json.dumps(record, indent=1))
    if args.output:
        with open(args.output, "w") as out:
            json.dump(record, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
