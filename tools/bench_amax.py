"""The FP8 amax pass (current scaling) by launch shape: µs and read bandwidth per variant.

    python -m tools.bench_amax [-o results.json]

Times the Triton amax kernel of runtime/fp8_kernels.py over q, k, v of llama-3-8b heads (b2 h32/8
d128 bf16 bshd, s4096 and s8192) for every (elements per program step, programs per SM, warps) of a
small grid, after checking that each variant's per-tensor maxima equal torch's; the variant
attention(fp8=True) uses is marked. CUDA-event mean of 50 launches after 5 warm-up launches.
Prints the device, versions and figures; writes them as JSON with -o.
"""

from __future__ import annotations

import itertools
from typing import Any

BLOCKS = (2048, 4096, 8192, 16384)
PROGRAMS_PER_SM = (3, 4, 6, 8)
WARPS = (4, 8)


def _mean_us(torch: Any, fn: Any, launches: int = 50) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(launches):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / launches * 1e3


def main(argv: list[str] | None = None) -> int:
    from tools.bench.environment import emit, standalone_args, standalone_record, triton_missing

    args = standalone_args(__doc__, argv)
    import torch

    from fusedattn_select.runtime import fp8_kernels as fk

    if triton_missing("bench_amax"):
        return 1
    import triton

    used = (fk._AMAX_BLOCK, fk._AMAX_PROGRAMS_PER_SM, 8)
    record: dict[str, Any] = dict(standalone_record(torch), triton=triton.__version__,
                                  used={"block": used[0], "programs_per_sm": used[1], "warps": used[2]}, shapes={})
    failed = False
    for seqlen in (8192, 4096):
        q = torch.randn(2, seqlen, 32, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(2, seqlen, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        xs = (q, k, v)
        gbytes = sum(x.numel() * x.element_size() for x in xs) / 1e9
        want = torch.stack([x.abs().amax().float() for x in xs])
        out = torch.empty(3 * fk._MAX_PARTIALS, device="cuda")
        rows = []
        for block, per_sm, warps in itertools.product(BLOCKS, PROGRAMS_PER_SM, WARPS):
            ends = fk._launch_amax(xs, out, False, block, per_sm, warps)
            got = torch.stack([out[a:b].max() for a, b in zip((0,) + ends[:2], ends)])
            exact = torch.equal(got, want)
            failed |= not exact
            us = _mean_us(torch, lambda b=block, p=per_sm, w=warps: fk._launch_amax(xs, out, False, b, p, w))
            rows.append({"block": block, "programs_per_sm": per_sm, "warps": warps, "us": round(us, 1),
                         "tb_per_s": round(gbytes / us * 1e3, 2), "exact": exact,
                         "used": (block, per_sm, warps) == used})
        rows.sort(key=lambda r: r["us"])
        record["shapes"][f"b2 h32/8 s{seqlen} d128 bf16"] = {"gbytes_read": round(gbytes, 3), "variants": rows}
    emit(record, args.output)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
