"""Decode steps whose K and V are slices of a preallocated cache, side by side.

    python -m tools.bench_cache_slices [-o results.json]

b4, 32/8 heads, d128, bf16, one query token, K and V caches of 16384 tokens, in BSHD memory
(k_cache[:, :L]) and in BHSD memory (k_cache[:, :, :L], run with the KV heads as batch). attention()
on the slices as they are (its bucket plans read the cache's rows in place), attention() on contiguous
copies of the slices (what every such step cost before: a copy of K and V, then the plans), and
torch SDPA pinned to flash on the same slices. Host+GPU µs per call over 48 consecutive lengths
from about 1024, 4000 and 12000 (each length decided by an untimed pass first: the per-call cost,
not the first call's decision), and at one fixed length (4096, 300 calls), in turns over 3 rounds.
Prints the device, versions and figures; writes them as JSON with -o.
"""

from __future__ import annotations

import argparse
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


def _layout(torch: Any, layout: str) -> dict[str, dict[str, float]]:
    """µs per call of each way, per case, with caches in `layout` memory."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fusedattn_select.runtime.api import attention

    bhsd = layout == "bhsd"
    dims = (B, HKV, CAPACITY, D) if bhsd else (B, CAPACITY, HKV, D)
    k_cache, v_cache = (torch.randn(*dims, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(*((B, HQ, 1, D) if bhsd else (B, 1, HQ, D)), device="cuda", dtype=torch.bfloat16)

    def sliced(n: int) -> tuple[Any, Any]:
        return (k_cache[:, :, :n], v_cache[:, :, :n]) if bhsd else (k_cache[:, :n], v_cache[:, :n])

    def as_bhsd(t: Any) -> Any:
        return t if bhsd else t.transpose(1, 2)

    def flash(n: int) -> Any:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(as_bhsd(q), *(as_bhsd(t) for t in sliced(n)), enable_gqa=True)

    ways = {
        "attention() on the slices (read in place)": lambda n: attention(q, *sliced(n), layout=layout),
        "attention() on contiguous copies (copy, then the plans: as before)": lambda n: attention(
            q, *(t.contiguous() for t in sliced(n)), layout=layout),
        "torch SDPA FLASH_ATTENTION on the slices": flash,
    }
    cases = {f"lengths {s}..{s + 47} (+300 per round)": lambda r, s=s: list(range(s + 300 * r, s + 300 * r + 48))
             for s in STARTS}
    cases[f"fixed length {FIXED} (copies: promoted to dense plans where not heads as batch)"] = lambda r: [FIXED] * 300
    out = {}
    with torch.no_grad():
        for case, lengths in cases.items():
            times: dict[str, list[float]] = {name: [] for name in ways}
            for r in range(3):
                for name, way in ways.items():
                    times[name].append(_per_call_us(torch, way, lengths(r)))
            out[case] = {name: round(statistics.median(t), 1) for name, t in times.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    import torch

    from tools.bench.environment import emit, standalone_record

    record = dict(standalone_record(torch), shape=f"b{B} h{HQ}/{HKV} d{D} bf16, s_q 1, cache {CAPACITY}",
                  us_per_call={layout: _layout(torch, layout) for layout in ("bshd", "bhsd")})
    emit(record, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
