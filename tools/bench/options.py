"""Command-line arguments, the sections, what each mode measures, and the time budget."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

SECTIONS = ("selection", "probe_cost", "warm_start", "warmup_scaling", "dispatch", "plan_rebuild", "shapes")
SECTION_TITLES = {
    "selection": "1. Selection latency",
    "probe_cost": "2. Probe cost",
    "warm_start": "3. Warm start",
    "warmup_scaling": "4. Warmup scaling",
    "dispatch": "5. Dispatch",
    "plan_rebuild": "6. Plan build for a new batch size",
    "shapes": "7. Shape buckets",
}
# Order the sections run in (the report keeps SECTIONS order): the cheap ones first, warmup
# scaling last because it is the one that can be trimmed to whatever time is left.
RUN_ORDER = ("selection", "probe_cost", "warm_start", "dispatch", "plan_rebuild", "shapes", "warmup_scaling")

FULL_BUDGET_S = 715.0
QUICK_BUDGET_S = 295.0
# Seconds each section may use (before scaling to --budget); slack left by a section carries over
# to the ones after it because deadlines are cumulative.
SHARES_FULL = {"env": 15, "selection": 20, "probe_cost": 100, "warm_start": 80, "dispatch": 110,
               "plan_rebuild": 25, "shapes": 255, "warmup_scaling": 95}
SHARES_QUICK = {"env": 12, "selection": 15, "probe_cost": 30, "warm_start": 30, "dispatch": 40,
                "plan_rebuild": 15, "shapes": 120, "warmup_scaling": 33}

DISPATCH_FILES_QUICK = ("llama-3-8b", "mistral-7b", "gemma-2-9b", "deepseek-v3-mla", "qwen2.5-7b", "gpt2")
DISPATCH_FILES_FULL = DISPATCH_FILES_QUICK + ("llama-3-70b", "vit-b16")
PROBE_FILES_QUICK = ("llama-3-8b", "gpt2", "llama-3-8b-fp8")
WARMUP_RUNS = (("threads", 1), ("processes", 8), ("threads", 8), ("processes", 4), ("processes", 2),
               ("threads", 4), ("threads", 2))


def parse_sections(text: str) -> tuple[str, ...]:
    """"all", or a comma list of section numbers (1-7) or names; returned in SECTIONS order."""
    text = (text or "all").strip().lower()
    if text == "all":
        return SECTIONS
    chosen = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part.isdigit() and 1 <= int(part) <= len(SECTIONS):
            chosen.add(SECTIONS[int(part) - 1])
        elif part in SECTIONS:
            chosen.add(part)
        else:
            raise argparse.ArgumentTypeError(
                f"unknown section {part!r}: use 1-{len(SECTIONS)} or one of {', '.join(SECTIONS)}")
    if not chosen:
        raise argparse.ArgumentTypeError("no section chosen")
    return tuple(s for s in SECTIONS if s in chosen)


def parse_args(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench", description="fusedattn-select benchmark (writes bench.json and bench.md)")
    parser.add_argument("--out", default=None, help="output folder (default: $OUT, else ./bench-out)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and configs (~5 minutes)")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"time budget in seconds (default {FULL_BUDGET_S:.0f}, quick {QUICK_BUDGET_S:.0f})")
    parser.add_argument("--sections", default="all", help="'all' or a comma list of 1-7 / section names")
    parser.add_argument("--dispatch-files", default=None,
                        help="comma list of configs/ stems the dispatch section measures (default: the mode's)")
    parser.add_argument("--render", default=None, type=Path, metavar="BENCH_JSON",
                        help="print the markdown report of a written bench.json and measure nothing "
                             "(tools/results keeps only the JSON)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-args", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out = Path(args.out or env.get("OUT") or "bench-out")
    if args.budget is not None and args.budget <= 0:
        parser.error("--budget must be positive")
    args.budget = float(args.budget or (QUICK_BUDGET_S if args.quick else FULL_BUDGET_S))
    try:
        args.sections = parse_sections(args.sections)
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))
    if args.dispatch_files is not None:
        args.dispatch_files = tuple(p.strip() for p in args.dispatch_files.split(",") if p.strip())
        if not args.dispatch_files:
            parser.error("--dispatch-files: name at least one configs/ stem")
    return args


def plan_for(quick: bool) -> dict[str, Any]:
    """What each section measures in this mode (repetitions, configs)."""
    if quick:
        return {
            "mode": "quick",
            "selection_calls": 50_000, "selection_batches": 10,
            "probe_files": PROBE_FILES_QUICK, "memory_hit_calls": 1000,
            "warm_runs": ("cold", "warm", "warm+jit"),
            "warmup_configs": 8,
            "warmup_runs": WARMUP_RUNS,
            "dispatch_files": DISPATCH_FILES_QUICK, "dispatch_per_file": 1,
            "dispatch_warmup": 3, "dispatch_reps": 10, "raw_dynamic": False,
            "tiny_batches": 10, "tiny_calls": 200,
            "rebuild_batches": (3, 4, 5), "rebuild_seqlens": (2048, 6144),
        }
    return {
        "mode": "full",
        "selection_calls": 100_000, "selection_batches": 20,
        "probe_files": None, "memory_hit_calls": 2000,
        "warm_runs": ("cold", "warm", "warm+jit", "cold", "warm", "warm+jit", "cold-full", "warm-full"),
        "warmup_configs": 24,
        "warmup_runs": WARMUP_RUNS,
        "dispatch_files": DISPATCH_FILES_FULL, "dispatch_per_file": 2,
        "dispatch_warmup": 5, "dispatch_reps": 20, "raw_dynamic": True,
        "tiny_batches": 30, "tiny_calls": 150,
        "rebuild_batches": (3, 4, 5, 6, 7), "rebuild_seqlens": (2048, 6144, 3072),
    }


def section_deadlines(start: float, budget: float, quick: bool, order: Sequence[str]) -> dict[str, float]:
    """Absolute (cumulative) deadlines for "env" and each section in `order`, scaled to `budget`."""
    shares = SHARES_QUICK if quick else SHARES_FULL
    names = ["env", *order]
    total = sum(shares[n] for n in names)
    scale = budget / total if total else 1.0
    deadlines, t = {}, start
    for name in names:
        t += shares[name] * scale
        deadlines[name] = t
    return deadlines
