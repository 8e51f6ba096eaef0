"""First contact, side by side: what a fresh process with an empty store meets on its first calls.

Each side runs in its own fresh process (an empty FUSEDATTN_SELECT_CACHE_DIR, nothing imported
before): attention() (ours), torch SDPA pinned to flash, and torch SDPA's own choice. Each process
times, with the device synchronised around every call:
- a forward+backward (causal, bf16, 32/8 heads, d128) at one shape, the same call again, a shape of
  a new bucket, and that call again;
- a tiny forward (b1 h1 s64 d64): the first call, then the median of calls 2-101 and 1001-1100.
Prints one JSON document (device and versions inside), and writes it to -o:
`python -m tools.bench_first_contact -o tools/results/first-contact-h100.json`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SIDES = ("ours", "flash", "default")
SHAPES = ((2, 1000), (2, 3000))  # (batch, sequence length): the second lies in another bucket
HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
TINY = (1, 64, 1, 64)  # b, s, h, d


def _call(torch, side: str):
    """f(q, k, v, causal) on BSHD tensors for `side`."""
    functional = torch.nn.functional
    if side == "ours":
        from fusedattn_select import attention

        return lambda q, k, v, causal: attention(q, k, v, mask="causal" if causal else "no_mask")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(q, k, v, causal):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        gqa = q.shape[1] != k.shape[1]
        if side == "flash":
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                out = functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        else:
            out = functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        return out.transpose(1, 2)

    return sdpa


def _timed(torch, work) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    work()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1e3


def side_process(side: str) -> dict:
    """The measurements of one side, in this (fresh) process."""
    started = time.perf_counter()
    import torch

    call = _call(torch, side)
    result = {"side": side, "import_ms": (time.perf_counter() - started) * 1e3}
    result["cuda_init_ms"] = _timed(torch, lambda: torch.zeros(1, device="cuda"))
    torch.manual_seed(0)
    steps = []
    for batch, seqlen in SHAPES:
        q = torch.randn(batch, seqlen, HEADS_Q, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(batch, seqlen, HEADS_KV, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                            requires_grad=True) for _ in range(2))
        grad = torch.randn_like(q)
        for repeat in ("first", "again"):
            ms = _timed(torch, lambda: torch.autograd.grad(call(q, k, v, True), (q, k, v), grad))
            steps.append({"shape": f"b{batch} s{seqlen} h{HEADS_Q}/{HEADS_KV} d{HEAD_DIM} causal bf16 fwd+bwd",
                          "call": repeat, "ms": ms})
    result["steps"] = steps
    b, s, h, d = TINY
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    tiny = [_timed(torch, lambda: call(q, k, v, False)) * 1e3 for _ in range(1100)]
    result["tiny_us"] = {"shape": f"b{b} s{s} h{h} d{d} bf16 fwd", "first": tiny[0],
                         "calls_2_101_median": statistics.median(tiny[1:101]),
                         "calls_1001_1100_median": statistics.median(tiny[1000:1100])}
    if side == "ours":
        from fusedattn_select.runtime.api import dispatch_info

        info = dispatch_info()
        result["dispatch"] = {key: info.get(key) for key in ("calls", "fused_calls", "fallback_calls",
                                                             "plan_builds", "plan_build_ms", "plan_loads")}
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--side":  # one side, in the fresh process main() started
        print(json.dumps(side_process(argv[1])))
        return
    from tools.bench.environment import standalone_args, standalone_record

    args = standalone_args(__doc__, argv)
    import torch

    sides = []
    for side in SIDES:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, FUSEDATTN_SELECT_CACHE_DIR=cache)
            done = subprocess.run([sys.executable, "-m", "tools.bench_first_contact", "--side", side], env=env,
                                  capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            sides.append({"side": side, "error": done.stderr[-2000:]})
            continue
        sides.append(json.loads(done.stdout.strip().splitlines()[-1]))
    flash = next((s for s in sides if s["side"] == "flash" and "steps" in s), None)
    for side in sides:
        if flash is not None and "steps" in side:
            for step, base in zip(side["steps"], flash["steps"]):
                step["vs_flash"] = step["ms"] / base["ms"]
    document = {**standalone_record(torch), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "sides": sides}
    text = json.dumps(document, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
