"""generate() with our attention and with torch SDPA pinned to flash, in turns in one process.

    python -m tools.generate_turns [--model llama qwen2] [--turns 10] [--profile] [-o "$OUT/generate-turns.json"]

Row 2 of the first-contact bench compares fresh processes, and one fresh process's decode step moves
by a third or more from one process to the next for flash alone, so five processes per side cannot
tell a gap of a tenth from chance. Here one model (bench row 2's, random weights, bf16) runs in one
process and switches between "fusedattn" and "sdpa" under sdpa_kernel(FLASH_ATTENTION) with
`set_attn_implementation`, so both sides share the process, its allocator and its host. After one
generate() per side that is not kept (each side's first call), `turns` rounds each run the same
generate() once per side, the order alternating; per round the ratio of our tokens/s to flash's,
and how our calls ran in it (dispatch_info's torch, fused and fallback calls and swaps in that round).
Per model, in "runs", a document (device, versions, per-round figures, median tokens/s per side,
median and range of the paired ratios; with --profile, per side one profiled generate(): kernels
launched, their device time, the host ops that took most self time) goes to -o and stdout. Several
models run one after the other in one process. FIRST_CONTACT_DEVICE=cpu runs the code paths on the
CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from tools.bench.common import clean_json
from tools.bench.environment import _git_rev
from tools.first_contact import options
from tools.first_contact.models import build_model, token_ids
from tools.first_contact.sides import device, hf_context, hf_implementation, timed_ms

SIDES = ("ours", "flash")
SCHEMA = "fusedattn-generate-turns/2"  # {"schema", "runs": [one document per model]}
COUNTED = ("torch_calls", "fused_calls", "fallback_calls", "swaps")


def _generate_once(torch: Any, model: Any, ids: Any, new_tokens: int, side: str) -> float:
    """tokens/s of one greedy generate() of exactly `new_tokens` new tokens on `side`'s attention."""
    model.set_attn_implementation(hf_implementation(side))

    def run() -> None:
        with hf_context(side), torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)

    ms = timed_ms(torch, run)
    return ids.shape[0] * new_tokens / (ms / 1e3)


def _counts() -> dict[str, int]:
    from fusedattn_select import dispatch_info

    info = dispatch_info()
    return {key: int(info.get(key, 0)) for key in COUNTED}


def _profile(torch: Any, model: Any, ids: Any, new_tokens: int, side: str, top: int = 10) -> dict[str, Any]:
    """What one generate() of `side` launched and where its host time went (torch.profiler, CPU+CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device() == "cuda" else [])
    with profile(activities=activities) as prof:
        tokens_per_s = _generate_once(torch, model, ids, new_tokens, side)
    events = prof.key_averages()

    def device_us(event: Any) -> float:
        return float(getattr(event, "self_device_time_total", 0.0) or 0.0)

    kernels = [e for e in events if device_us(e) > 0 and e.self_cpu_time_total == 0]
    def rows(chosen: list[Any], time_us: Any) -> list[dict[str, Any]]:
        return [{"name": e.key[:90], "count": e.count, "us": round(time_us(e), 1)} for e in chosen]

    by_host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {
        "tokens_per_s": tokens_per_s,
        "kernel_launches": sum(e.count for e in kernels),
        "kernel_us": round(sum(device_us(e) for e in kernels), 1),
        "host_self_us": round(sum(e.self_cpu_time_total for e in events), 1),
        "top_host_ops": rows(by_host, lambda e: e.self_cpu_time_total),
        "top_kernels": rows(sorted(kernels, key=device_us, reverse=True)[:top], device_us),
    }


def measure(model_name: str, turns: int, profiled: bool = False) -> dict[str, Any]:
    """The document of one run (see the module docstring)."""
    import torch
    import transformers

    config, batch, prompt, new_tokens, _ = options.GENERATE[model_name]
    hf_implementation("ours")  # registers "fusedattn" before the model is built
    model = build_model(torch, config, "flash", options.SEED).eval()
    ids = token_ids(torch, int(config["vocab_size"]), batch, prompt, options.SEED + prompt)
    first = {side: _generate_once(torch, model, ids, new_tokens, side) for side in SIDES}
    rounds = []
    for turn in range(turns):
        order = SIDES if turn % 2 == 0 else SIDES[::-1]
        before = _counts()
        speeds = {side: _generate_once(torch, model, ids, new_tokens, side) for side in order}
        after = _counts()
        rounds.append({"order": list(order), "tokens_per_s": speeds, "ratio": speeds["ours"] / speeds["flash"],
                       "ours_calls": {key: after[key] - before[key] for key in COUNTED}})
    ratios = [r["ratio"] for r in rounds]
    profiles = {side: _profile(torch, model, ids, new_tokens, side) for side in SIDES} if profiled else None
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_commit": _git_rev(), "device": device(), "gpu_name": _gpu_name(torch), "torch": torch.__version__,
        "transformers": transformers.__version__, "model": model_name, "batch": batch, "prompt": prompt,
        "new_tokens": new_tokens, "turns": turns, "first_calls_tokens_per_s": first, "rounds": rounds,
        "median_tokens_per_s": {side: statistics.median(r["tokens_per_s"][side] for r in rounds) for side in SIDES},
        "ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
        "profiles": profiles,
    }


def _gpu_name(torch: Any) -> str | None:
    return torch.cuda.get_device_name() if device() == "cuda" and torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.generate_turns", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(options.GENERATE), nargs="+", default=["llama"],
                        help="one or more models, measured one after the other in this process")
    parser.add_argument("--turns", type=int, default=10, help="rounds kept, each one generate() per side (>= 1)")
    parser.add_argument("--profile", action="store_true",
                        help="after the rounds, one profiled generate() per side: kernels launched, top host ops")
    parser.add_argument("-o", "--output", type=Path, help="write the JSON document here too")
    args = parser.parse_args(argv)
    if args.turns < 1:
        parser.error(f"--turns={args.turns}: must be at least 1")
    runs = [measure(model, args.turns, args.profile) for model in args.model]
    document = clean_json({"schema": SCHEMA, "runs": runs})
    text = json.dumps(document, indent=1)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
