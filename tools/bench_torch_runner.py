"""The torch runner's kernel (runtime/fallback.torch_kernel): flash against memory-efficient by shape,
and what the choice gives a whole model's forward.

    python -m tools.bench_torch_runner [-o results.json]

1. Per shape (bf16 inference, BHSD, flash's and the memory-efficient kernel's own checks passing),
   each kernel called directly as the torch runner calls it: the median of 150 calls with the device
   synchronised around each ("synced_us": what one call costs its caller), the mean of 200 calls
   back to back ("back_to_back_us": the host's cost per call where the kernel is shorter, the
   kernel's where it is longer), whether the outputs agree, and which kernel torch_kernel picks. A
   pick is "faster" when its synced time is the lower of the two.
2. A 12-layer encoder's inference forward (hidden 768, 12 heads of 64, bf16, no mask; b1 s128, b4
   s128, b1 s384, all within the bounds the memory-efficient kernel is picked for) in turns in one
   process, 10 rounds, the order alternating: attention() (no cuDNN plans in reach of these calls:
   its torch runner), torch SDPA's own choice, and SDPA pinned to flash and to the memory-efficient
   kernel. Each figure: the mean µs of 20 forwards; per side the median over the rounds, and paired
   ratios per round (their medians).

attention() here serves every call on its torch runner only where the cuDNN frontend is not
installed or its plans are not ready; run it without the frontend on the path to keep it there
(the tool says which runner served the calls).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from tools.first_contact.sides import timed_ms

SHAPES = [(kind, b, h, s, d) for s in (64, 128, 256, 384, 512, 768, 1024, 2048) for b, h in ((1, 1), (1, 12), (4, 32))
          for kind, d in (("no_mask", 64), ("causal", 128))]
ENCODERS = ((1, 128), (4, 128), (1, 384))
HEADS, HEAD_DIM, LAYERS, ROUNDS, FORWARDS = 12, 64, 12, 10, 20


def _synced_us(torch: Any, fn: Any, calls: int = 150) -> float:
    return statistics.median(timed_ms(torch, fn) * 1e3 for _ in range(calls))


def _back_to_back_us(torch: Any, fn: Any, calls: int = 200, warm: bool = True) -> float:
    if warm:
        fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / calls * 1e6


def _kernels(torch: Any, q: Any, k: Any, v: Any, causal: bool) -> dict[str, Any]:
    """Each kernel as the torch runner calls it for an inference call."""
    return {"flash": lambda: torch._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)[0],
            "efficient": lambda: torch._scaled_dot_product_efficient_attention(q, k, v, None, False, 0.0, causal)[0]}


def kernel_rows(torch: Any) -> list[dict[str, Any]]:
    """Part 1 (see the module docstring)."""
    from fusedattn_select.runtime import fallback

    rows = []
    for mask, b, h, s, d in SHAPES:
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
        causal = mask == "causal"
        kernels = _kernels(torch, q, k, v, causal)
        disagree = (kernels["flash"]() - kernels["efficient"]()).abs().max().item()
        row: dict[str, Any] = {"mask": mask, "b": b, "h": h, "s": s, "d": d,
                               "picked": fallback.torch_kernel(q, k, v, 0.0, causal, False),
                               "max_difference": disagree}
        for name, fn in kernels.items():
            row[name] = {"synced_us": round(_synced_us(torch, fn), 2),
                         "back_to_back_us": round(_back_to_back_us(torch, fn), 2)}
        faster = min(kernels, key=lambda name: row[name]["synced_us"])
        row["picked_faster"] = row["picked"] == faster
        rows.append(row)
        print(f"{mask:8} b{b} h{h} s{s} d{d}: flash {row['flash']['synced_us']} us, efficient "
              f"{row['efficient']['synced_us']} us, picked {row['picked']}", flush=True)
    return rows


def encoder_rows(torch: Any) -> list[dict[str, Any]]:
    """Part 2 (see the module docstring)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fusedattn_select.runtime.api import attention, dispatch_info

    hidden = HEADS * HEAD_DIM
    pinned = {"sdpa flash": SDPBackend.FLASH_ATTENTION, "sdpa efficient": SDPBackend.EFFICIENT_ATTENTION}
    results = []
    for batch, seqlen in ENCODERS:
        torch.manual_seed(0)
        blocks = [torch.nn.ModuleDict({"ln1": torch.nn.LayerNorm(hidden), "qkv": torch.nn.Linear(hidden, 3 * hidden),
                                       "o": torch.nn.Linear(hidden, hidden), "ln2": torch.nn.LayerNorm(hidden),
                                       "up": torch.nn.Linear(hidden, 4 * hidden),
                                       "down": torch.nn.Linear(4 * hidden, hidden)}).to("cuda", torch.bfloat16)
                  for _ in range(LAYERS)]
        x0 = torch.randn(batch, seqlen, hidden, device="cuda", dtype=torch.bfloat16)

        def forward(attend: Any, blocks: list = blocks, x0: Any = x0, batch: int = batch, seqlen: int = seqlen) -> Any:
            x = x0
            for m in blocks:
                q, k, v = m["qkv"](m["ln1"](x)).view(batch, seqlen, 3, HEADS, HEAD_DIM).unbind(2)
                x = x + m["o"](attend(q, k, v).reshape(batch, seqlen, hidden))
                x = x + m["down"](F.gelu(m["up"](m["ln2"](x))))
            return x

        def sdpa(q: Any, k: Any, v: Any) -> Any:
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

        def run(side: str) -> float:
            with torch.no_grad():
                if side in pinned:
                    with sdpa_kernel(pinned[side]):
                        return _back_to_back_us(torch, lambda: forward(sdpa), FORWARDS, warm=False)
                return _back_to_back_us(torch, lambda: forward(attention if side == "attention()" else sdpa), FORWARDS,
                                        warm=False)

        sides = ("attention()", "sdpa default", "sdpa flash", "sdpa efficient")
        before = dispatch_info()
        for side in sides:
            run(side)
        rounds = []
        for turn in range(ROUNDS):
            rounds.append({side: run(side) for side in (sides if turn % 2 == 0 else sides[::-1])})
        after = dispatch_info()
        median = {side: round(statistics.median(r[side] for r in rounds), 1) for side in sides}
        paired = {f"{a} / {b}": round(statistics.median(r[a] / r[b] for r in rounds), 4)
                  for a, b in (("attention()", "sdpa default"), ("sdpa efficient", "sdpa flash"),
                               ("attention()", "sdpa flash"))}
        served = {key: after[key] - before[key] for key in ("torch_calls", "fused_calls", "fallback_calls")}
        results.append({"batch": batch, "seqlen": seqlen, "median_us_per_forward": median,
                        "paired_time_ratio_median": paired, "attention_calls": served, "rounds": rounds})
        print(f"encoder b{batch} s{seqlen}: {median}; {paired}; attention() calls {served}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    from tools.bench.environment import emit, standalone_args, standalone_record

    args = standalone_args(__doc__, argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_torch_runner: no CUDA device")
        return 1
    from fusedattn_select.runtime import fallback

    record = dict(standalone_record(torch), small_keys=fallback.SMALL_KEYS, small_scores=fallback.SMALL_SCORES,
                  kernels=kernel_rows(torch), encoder=encoder_rows(torch))
    emit(record, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
