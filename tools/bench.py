#!/usr/bin/env python3
"""fusedattn-select benchmark: one command, one run, every figure side by side.

    python tools/bench.py [--out DIR] [--quick] [--budget SECONDS] [--sections 1,2,5]

Measures on the GPU machine and writes DIR/bench.json and DIR/bench.md (DIR: --out, else $OUT,
else ./bench-out), plus DIR/bench.log with the output of every measuring subprocess:

  1. selection latency   get_backend() on a cached config vs torch._fused_sdp_choice and
                         torch.backends.cuda.can_use_cudnn_attention on the same shape
  2. probe cost          process init (first cuDNN call), cold fast / full probes per graph for
                         every configs/ entry, the same graph again in-process (memory cache hit,
                         rebuild with a warm kernel cache); one fresh process per config file
  3. warm start          a whole model file (selection of every entry + one forward+backward
                         attention() step) in a fresh process, with an empty vs a warmed
                         persistent cache
  4. warmup scaling      warmup(depth="full") of a probe-suite subset with 1, 2, 4, 8 jobs,
                         each in a fresh process with an empty cache directory
  5. dispatch            forward / backward / forward+backward time and TFLOPS of attention() vs
                         raw cudnn-frontend graph execution vs torch SDPA backends; FP8 vs bf16;
                         per-call host overhead on a tiny problem
  6. plan rebuild        building the graph for a new batch size or sequence length (dynamic
                         shapes, kernel cache) vs a cold build

Every figure is a median over repetitions with its spread; every comparison is a ratio of two
medians measured in the same run. The benchmark never asserts speed: it reports. Each section
(and each item inside one) records "failed: reason" instead of aborting the run, and the run
keeps to a time budget (default 460 s, --quick 175 s): what does not fit is "skipped: time budget".

Measurements run in subprocesses of this script (`--worker NAME`), so "cold" means a fresh
process and a crash in one section cannot take the others down. Workers run with
CUDA_CACHE_DISABLE=1 so the driver's on-disk JIT cache cannot make a later process look warmer
than the first one.

Only the pure parts (statistics, formatting, argument parsing, the JSON schema) run without a GPU;
tests/test_bench_cpu.py covers them.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "fusedattn-select-bench/1"

SECTIONS = ("selection", "probe_cost", "warm_start", "warmup_scaling", "dispatch", "plan_rebuild")
SECTION_TITLES = {
    "selection": "1. Selection latency",
    "probe_cost": "2. Probe cost",
    "warm_start": "3. Warm start",
    "warmup_scaling": "4. Warmup scaling",
    "dispatch": "5. Dispatch",
    "plan_rebuild": "6. Plan build for a new batch size",
}
# Order the sections run in (the report keeps SECTIONS order): the cheap ones first, warmup
# scaling last because it is the one that can be trimmed to whatever time is left.
RUN_ORDER = ("selection", "probe_cost", "warm_start", "dispatch", "plan_rebuild", "warmup_scaling")

FULL_BUDGET_S = 460.0
QUICK_BUDGET_S = 175.0
# Seconds each section may use (before scaling to --budget); slack left by a section carries over
# to the ones after it because deadlines are cumulative.
SHARES_FULL = {"env": 15, "selection": 20, "probe_cost": 100, "warm_start": 80, "dispatch": 110,
               "plan_rebuild": 25, "warmup_scaling": 95}
SHARES_QUICK = {"env": 12, "selection": 15, "probe_cost": 30, "warm_start": 30, "dispatch": 40,
                "plan_rebuild": 15, "warmup_scaling": 33}

DISPATCH_FILES_QUICK = ("llama-3-8b", "mistral-7b", "gemma-2-9b", "deepseek-v3-mla", "qwen2.5-7b", "gpt2")
DISPATCH_FILES_FULL = DISPATCH_FILES_QUICK + ("llama-3-70b", "vit-b16")
PROBE_FILES_QUICK = ("llama-3-8b", "gpt2", "llama-3-8b-fp8")
SDPA_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")
RESULT_STATUS_OK = "ok"


# =================================================================================================
# Pure helpers (no torch, no cuDNN): statistics, formatting, arguments, schema, markdown
# =================================================================================================
def summarize(samples: Iterable[float | None], unit: str = "") -> dict | None:
    """Median and spread of `samples` (None and non-finite values dropped); None when empty.

    p25/p75 are the inclusive quartiles when there are at least 4 samples, else min and max.
    """
    xs = sorted(float(x) for x in samples if x is not None and math.isfinite(float(x)))
    if not xs:
        return None
    n = len(xs)
    if n >= 4:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1, q3 = xs[0], xs[-1]
    return {"median": statistics.median(xs), "p25": q1, "p75": q3, "min": xs[0], "max": xs[-1],
            "n": n, "unit": unit}


def median_of(stat: Mapping | None) -> float | None:
    if not isinstance(stat, Mapping):
        return None
    value = stat.get("median")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def ratio(numerator: Mapping | float | None, denominator: Mapping | float | None) -> float | None:
    """numerator / denominator of two medians (or plain numbers); None when either is missing or 0."""
    a = numerator if isinstance(numerator, (int, float)) else median_of(numerator)
    b = denominator if isinstance(denominator, (int, float)) else median_of(denominator)
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b == 0:
        return None
    return a / b


def fmt_num(x: float | None) -> str:
    """A short human figure: 3 significant digits below 100, integers above."""
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "n/a"
    ax = abs(x)
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    if ax == 0:
        return "0"
    return f"{x:.3g}"


def fmt_stat(stat: Mapping | None) -> str:
    """"median [p25–p75]" (n >= 4), "median (min–max)" (n 2-3), "median (n=1)", or "n/a"."""
    med = median_of(stat)
    if med is None:
        return "n/a"
    n = int(stat.get("n", 1))
    if n >= 4:
        return f"{fmt_num(med)} [{fmt_num(stat['p25'])}–{fmt_num(stat['p75'])}]"
    if n >= 2:
        return f"{fmt_num(med)} ({fmt_num(stat['min'])}–{fmt_num(stat['max'])})"
    return f"{fmt_num(med)} (n=1)"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{fmt_num(value)}x"


def md_cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return " ".join(text.replace("|", "\\|").split())


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub markdown table; pipes in cells are escaped, newlines folded."""
    head = "| " + " | ".join(md_cell(h) for h in headers) + " |"
    rule = "|" + "|".join("---" for _ in headers) + "|"
    body = []
    for row in rows:
        cells = [md_cell(c) for c in row]
        cells += [""] * (len(headers) - len(cells))
        body.append("| " + " | ".join(cells[: len(headers)]) + " |")
    return "\n".join([head, rule, *body])


def attention_flops(batch: int, heads_q: int, seqlen_q: int, seqlen_kv: int, head_dim_qk: int,
                    head_dim_v: int | None = None, causal: bool = False) -> float:
    """Forward FLOPs: 2*B*H*Sq*Skv*(Dqk + Dv) (= 4*B*H*Sq*Skv*D), halved for a causal mask.
    The backward pass is counted as 2.5x the forward pass (BACKWARD_FLOP_FACTOR)."""
    dv = head_dim_qk if head_dim_v is None else head_dim_v
    flops = 2.0 * batch * heads_q * seqlen_q * seqlen_kv * (head_dim_qk + dv)
    return flops / 2 if causal else flops


BACKWARD_FLOP_FACTOR = 2.5


def tflops(flops: float | None, ms: float | None) -> float | None:
    if flops is None or ms is None or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12


def stride_subset(items: Sequence[Any], n: int) -> list[Any]:
    """n items evenly spread over `items` (all of them when n >= len), order kept."""
    if n <= 0:
        return []
    if n >= len(items):
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def first_line(text: Any, limit: int = 240) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def failed(reason: Any) -> str:
    return "failed: " + first_line(reason, 400)


def skipped(reason: str = "time budget") -> str:
    return "skipped: " + reason


def is_ok(status: Any) -> bool:
    return status == RESULT_STATUS_OK


def clean_json(value: Any) -> Any:
    """A JSON-safe copy: NaN/inf -> None, tuples -> lists, unknown objects -> str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [clean_json(v) for v in value]
    return str(value)


def parse_sections(text: str) -> tuple[str, ...]:
    """"all", or a comma list of section numbers (1-6) or names; returned in SECTIONS order."""
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
        prog="bench.py", description="fusedattn-select benchmark (writes bench.json and bench.md)")
    parser.add_argument("--out", default=None, help="output folder (default: $OUT, else ./bench-out)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and configs (~3 minutes)")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"time budget in seconds (default {FULL_BUDGET_S:.0f}, quick {QUICK_BUDGET_S:.0f})")
    parser.add_argument("--sections", default="all", help="'all' or a comma list of 1-6 / section names")
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
            "warmup_runs": (("threads", 1), ("processes", 8), ("threads", 8), ("processes", 4), ("processes", 2),
                            ("threads", 4), ("threads", 2)),
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
        "warmup_runs": (("threads", 1), ("processes", 8), ("threads", 8), ("processes", 4), ("processes", 2),
                        ("threads", 4), ("threads", 2)),
        "dispatch_files": DISPATCH_FILES_FULL, "dispatch_per_file": 2,
        "dispatch_warmup": 5, "dispatch_reps": 20, "raw_dynamic": True,
        "tiny_batches": 15, "tiny_calls": 300,
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


# ----- training entries to run in dispatch --------------------------------------------------------
DISPATCH_LAYOUTS = {"bshd_bshd_bshd": "bshd", "sbhd_sbhd_sbhd": "sbhd", "bhsd_bhsd_bhsd": "bhsd"}


def dispatch_eligible(cfg: Any) -> bool:
    """F16 training problems attention() and torch SDPA both take as plain tensors."""
    return (
        getattr(cfg, "is_training", False)
        and cfg.qkv_dtype in ("fp16", "bf16")
        and cfg.qkv_layout in DISPATCH_LAYOUTS
        and cfg.mask in ("no_mask", "causal")
        and not cfg.dropout
        and not cfg.deterministic
        and cfg.bias == "no_bias"
        and cfg.softmax == "vanilla"
        and not getattr(cfg, "return_max_logit", False)
    )


def pick_dispatch_entries(entries: Sequence[Any], per_file: int) -> list[Any]:
    """The first `per_file` eligible training entries (NamedConfig-like: .name, .config)."""
    return [e for e in entries if dispatch_eligible(e.config)][:per_file]


def sdpa_blocker(mask: str, window_size: Sequence[int], seqlen_q: int, seqlen_kv: int) -> str:
    """Why torch SDPA cannot compute this masking exactly ("" when it can, as causal or none)."""
    left, right = int(window_size[0]), int(window_size[1])
    if left == -1 and right in (-1, 0 if mask == "causal" else -1):
        return ""
    if mask == "causal" and right in (0, -1) and left >= seqlen_kv - 1:
        return ""  # the window never cuts at this length: plain causal
    return f"window_size=({left}, {right}) (torch SDPA has no sliding window)"


# ----- the result document --------------------------------------------------------------------
STAT_KEYS = ("median", "p25", "p75", "min", "max", "n", "unit")


def validate_result(doc: Any) -> list[str]:
    """Problems with a bench.json document (empty list when it follows the schema)."""
    problems: list[str] = []
    if not isinstance(doc, Mapping):
        return ["document is not an object"]
    if doc.get("schema") != SCHEMA:
        problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    meta = doc.get("meta")
    if not isinstance(meta, Mapping):
        problems.append("meta missing")
    else:
        for key in ("device", "date_utc", "mode", "torch", "cudnn_backend", "cudnn_frontend", "driver"):
            if key not in meta:
                problems.append(f"meta.{key} missing")
    sections = doc.get("sections")
    if not isinstance(sections, Mapping):
        problems.append("sections missing")
        sections = {}
    for name in SECTIONS:
        section = sections.get(name)
        if not isinstance(section, Mapping):
            problems.append(f"sections.{name} missing")
            continue
        status = section.get("status")
        if not isinstance(status, str) or not (
                status == RESULT_STATUS_OK or status.startswith(("failed: ", "skipped: ", "partial: "))):
            problems.append(f"sections.{name}.status invalid: {status!r}")
    problems.extend(_check_stats(doc, "$"))
    if not isinstance(doc.get("wall_seconds"), (int, float)):
        problems.append("wall_seconds missing")
    return problems


def _check_stats(value: Any, path: str) -> list[str]:
    """Every object that has a 'median' must be a full stat object."""
    problems: list[str] = []
    if isinstance(value, Mapping):
        if "median" in value and "n" in value:
            missing = [k for k in STAT_KEYS if k not in value]
            if missing:
                problems.append(f"{path}: stat without {', '.join(missing)}")
            elif not (value["min"] <= value["median"] <= value["max"]):
                problems.append(f"{path}: median outside [min, max]")
        for key, item in value.items():
            problems.extend(_check_stats(item, f"{path}.{key}"))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems.extend(_check_stats(item, f"{path}[{index}]"))
    return problems


# ----- markdown ------------------------------------------------------------------------------
def render_markdown(doc: Mapping) -> str:
    meta = doc.get("meta", {}) or {}
    sections = doc.get("sections", {}) or {}
    out = ["# fusedattn-select benchmark", ""]
    out.append(md_table(("", ""), [
        ("device", meta.get("device", "n/a")),
        ("GPU", meta.get("gpu", "n/a")),
        ("driver", meta.get("driver", "n/a")),
        ("cuDNN backend", meta.get("cudnn_backend", "n/a")),
        ("cudnn-frontend", meta.get("cudnn_frontend", "n/a")),
        ("torch", meta.get("torch", "n/a")),
        ("fusedattn-select", meta.get("library", "n/a")),
        ("python", meta.get("python", "n/a")),
        ("date", meta.get("date_utc", "n/a")),
        ("run", f"{meta.get('mode', '?')} mode, {fmt_num(doc.get('wall_seconds'))} s wall, "
                f"budget {fmt_num(meta.get('budget_s'))} s"),
    ]))
    out += ["", "Figures are `median [p25–p75]` over the repetitions (`median (min–max)` for 2-3, "
            "`(n=1)` for one); ratios divide two medians measured in this run. Nothing here is "
            "asserted: the benchmark reports.", ""]
    renderers = {
        "selection": _md_selection, "probe_cost": _md_probe_cost, "warm_start": _md_warm_start,
        "warmup_scaling": _md_warmup, "dispatch": _md_dispatch, "plan_rebuild": _md_rebuild,
    }
    for name in SECTIONS:
        section = sections.get(name) or {"status": skipped("not run")}
        out.append(f"## {SECTION_TITLES[name]}")
        out.append("")
        status = section.get("status", "")
        if not is_ok(status):
            out.append(f"**{status}**")
            out.append("")
        try:
            body = renderers[name](section)
        except Exception as err:  # noqa: BLE001 -- a broken renderer must not lose the document
            body = f"(cannot render this section: {type(err).__name__}: {err})"
        if body:
            out.append(body)
            out.append("")
        for note in section.get("notes", []) or []:
            out.append(f"- {note}")
        if section.get("notes"):
            out.append("")
    notes = doc.get("notes") or []
    if notes:
        out.append("## Notes")
        out.append("")
        out += [f"- {n}" for n in notes]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _md_selection(s: Mapping) -> str:
    rows = s.get("rows") or []
    if not rows:
        return ""
    lines = [f"Problem: {s.get('problem', '?')}; engine {s.get('engine', '?')}; {s.get('calls', '?')} calls in "
             f"{s.get('batches', '?')} timed batches per row (µs per call).", ""]
    if s.get("engine_unavailable"):
        lines[0] += f" No probing engine: {s['engine_unavailable']}."
    table = []
    base = next((r.get("us") for r in rows if r.get("name") == "get_backend(cfg)"), None)
    for r in rows:
        value = fmt_stat(r.get("us")) if r.get("us") else (r.get("status") or "n/a")
        table.append((r.get("name"), value, fmt_ratio(ratio(r.get("us"), base)) if r.get("us") else "n/a",
                      r.get("answer", "")))
    lines.append(md_table(("call", "µs per call", "ratio to get_backend", "answer"), table))
    return "\n".join(lines)


def _md_probe_cost(s: Mapping) -> str:
    parts = []
    init = s.get("init") or {}
    if init:
        parts.append(md_table(("process init (fresh process)", "ms", "fresh processes"), [
            ("import cudnn", fmt_stat(init.get("import_cudnn_ms")), (init.get("import_cudnn_ms") or {}).get("n", "")),
            ("CudnnEngine() (first cuDNN call, incl. its warm-up graph)", fmt_stat(init.get("engine_init_ms")),
             (init.get("engine_init_ms") or {}).get("n", "")),
            ("  of which the engine's warm-up graph", fmt_stat(init.get("engine_warm_up_ms")),
             (init.get("engine_warm_up_ms") or {}).get("n", "")),
            ("first fast probe of the process", fmt_stat(init.get("first_probe_ms")),
             (init.get("first_probe_ms") or {}).get("n", "")),
        ]))
    rows = []
    for f in s.get("files") or []:
        if not is_ok(f.get("status", RESULT_STATUS_OK)) and not (f.get("summary") or {}).get("graphs"):
            rows.append((f.get("file"), f.get("status"), "", "", "", "", "", "", "", "", ""))
            continue
        sm = f.get("summary") or {}
        rows.append((
            f.get("file") + ("" if is_ok(f.get("status", RESULT_STATUS_OK)) else f" ({f.get('status')})"),
            f"{sm.get('supported', 0)}/{sm.get('graphs', 0)}",
            fmt_stat(sm.get("fast_fwd_ms")), fmt_stat(sm.get("fast_bwd_ms")),
            fmt_stat(sm.get("full_cold_fwd_ms")), fmt_stat(sm.get("full_cold_bwd_ms")),
            fmt_stat(sm.get("full_class_seen_ms")),
            fmt_stat(sm.get("rebuild_fwd_ms")), fmt_stat(sm.get("rebuild_bwd_ms")),
            fmt_stat(sm.get("rejected_fast_ms")),
            fmt_stat(sm.get("memory_hit_us")),
        ))
    total = s.get("all") or {}
    if total:
        rows.append((
            "**all files**", f"{total.get('supported', 0)}/{total.get('graphs', 0)}",
            fmt_stat(total.get("fast_fwd_ms")), fmt_stat(total.get("fast_bwd_ms")),
            fmt_stat(total.get("full_cold_fwd_ms")), fmt_stat(total.get("full_cold_bwd_ms")),
            fmt_stat(total.get("full_class_seen_ms")),
            fmt_stat(total.get("rebuild_fwd_ms")), fmt_stat(total.get("rebuild_bwd_ms")),
            fmt_stat(total.get("rejected_fast_ms")),
            fmt_stat(total.get("memory_hit_us")),
        ))
    if rows:
        parts.append(md_table((
            "config file", "graphs built/probed", "fast fwd ms", "fast bwd ms", "full cold fwd ms",
            "full cold bwd ms", "full, class built earlier in process ms",
            "again fwd: rebuild, warm kernel cache ms", "again bwd: rebuild ms", "rejection (fast) ms",
            "again: memory cache hit µs",
        ), rows))
    r = s.get("ratios") or {}
    if r:
        parts.append("Ratios (all files): full cold fwd / fast fwd = {}, full cold bwd / fast bwd = {}, "
                     "full cold fwd / fwd rebuild with warm kernel cache = {}, full cold fwd / memory hit = {}.".format(
                         fmt_ratio(r.get("full_over_fast_fwd")), fmt_ratio(r.get("full_over_fast_bwd")),
                         fmt_ratio(r.get("cold_over_rebuild")), fmt_ratio(r.get("cold_over_memory_hit"))))
    return "\n\n".join(parts)


def _md_warm_start(s: Mapping) -> str:
    runs = s.get("runs") or []
    if not runs:
        return ""
    rows = []
    for r in runs:
        if not is_ok(r.get("status", RESULT_STATUS_OK)):
            rows.append((r.get("kind"), r.get("status"), "", "", "", "", "", "", "", ""))
            continue
        rows.append((
            r.get("kind"), fmt_num(r.get("process_wall_s")), fmt_num(r.get("import_s")),
            fmt_num(r.get("cuda_init_s")), fmt_num(r.get("select_s")),
            f"{fmt_num(r.get('first_step_s'))} ({fmt_num(r.get('first_fwd_s'))})",
            fmt_num(r.get("steady_step_s")), fmt_num(r.get("select_plus_step_s")),
            f"{r.get('probes', '?')} / {r.get('persistent_hits', '?')}",
            f"{r.get('plan_builds', '?')} ({fmt_num(r.get('plan_build_ms'))} ms)"
            + (f" / {r['plan_loads']} ({fmt_num(r.get('plan_load_ms'))} ms)"
               if r.get("plan_loads") is not None else ""),
        ))
    lines = [f"Model file {s.get('file', '?')}: select() of {s.get('entries') or '?'} entries "
             f"(depth {s.get('depth', 'fast')} unless the run says -full), then one forward+backward "
             f"attention() step of {s.get('step', '?')}. Seconds, each run a fresh process.", "",
             md_table(("run", "process wall s", "imports s", "CUDA init s", "select all s",
                       "first step s (its forward)",
                       "steady step s", "select+first step s", "probes / persistent hits",
                       "plan builds / loads (ms)"), rows)]
    summary = s.get("summary") or {}
    if summary:
        lines += ["", md_table(("seconds", "cold", "warm (store)", "warm (store + JIT cache)", "cold / warm",
                                "cold / warm+jit"), [
            (WARM_LABELS.get(k, k), fmt_stat(v.get("cold")),
             fmt_stat(v.get("warm")), fmt_stat(v.get("warm+jit")), fmt_ratio(v.get("ratio")),
             fmt_ratio(v.get("ratio_jit")))
            for k, v in summary.items()
        ])]
    return "\n".join(lines)


WARM_LABELS = {
    "process_wall_s": "process wall", "select_s": "select all", "first_step_s": "first step",
    "select_plus_step_s": "select + first step", "select_s_depth_full": "select all, depth full",
}


def _md_warmup(s: Mapping) -> str:
    runs = s.get("runs") or []
    if not runs:
        return ""
    rows = []
    for r in sorted(runs, key=lambda r: (r.get("workers", "threads") != "threads", r.get("jobs", 0))):
        label = (r.get("workers", "threads"), r.get("jobs"))
        if not is_ok(r.get("status", RESULT_STATUS_OK)):
            rows.append((*label, r.get("status"), "", "", "", "", ""))
            continue
        totals = r.get("totals") or {}
        rows.append((
            *label, fmt_stat(r.get("wall_s")), fmt_ratio(r.get("speedup")),
            f"{totals.get('accepted', '?')}/{totals.get('rejected', '?')}/{totals.get('failed', '?')}",
            totals.get("plans_built", "n/a"),
            fmt_num(r.get("row_seconds_sum")), fmt_num(r.get("init_s")),
        ))
    return "\n".join([
        f"{s.get('configs', '?')} problems of {s.get('suite', '?')} (evenly spread), warmup(depth=\"full\"), "
        "each level in a fresh process with an empty cache directory.", "",
        md_table(("workers", "jobs", "warmup wall s", "speedup vs 1 thread", "accepted/rejected/failed",
                  "execution plans built", "sum of per-problem s", "process init s (not in wall)"), rows),
    ])


def _md_dispatch(s: Mapping) -> str:
    parts = []
    rows = []
    for c in s.get("configs") or []:
        label = f"{c.get('file')} {c.get('name')}"
        if not is_ok(c.get("status", RESULT_STATUS_OK)) and not c.get("impls"):
            rows.append((label, c.get("status"), "", "", "", "", "", "", ""))
            continue
        if not is_ok(c.get("status", RESULT_STATUS_OK)):
            rows.append((label, f"(config {c.get('status')})", "", "", "", "", "", "", ""))
            label = ""
        base = None
        for impl in c.get("impls") or []:
            if impl.get("name") == "attention()":
                base = impl.get("fwd_bwd_ms")
        for impl in c.get("impls") or []:
            if not is_ok(impl.get("status", RESULT_STATUS_OK)):
                rows.append((label, impl.get("name"), impl.get("status"), "", "", "", "", "", ""))
                continue
            rows.append((
                label, impl.get("name") + (f" ({impl['note']})" if impl.get("note") else ""),
                fmt_stat(impl.get("fwd_ms")), fmt_stat(impl.get("bwd_ms")),
                fmt_stat(impl.get("fwd_bwd_ms")), fmt_num(impl.get("fwd_tflops")),
                fmt_num(impl.get("bwd_tflops")), fmt_num(impl.get("fwd_bwd_tflops")),
                fmt_ratio(ratio(impl.get("fwd_bwd_ms"), base)),
            ))
            label = ""  # the config name once per group
    if rows:
        parts.append(md_table(("config (shape)", "implementation", "fwd ms", "bwd ms", "fwd+bwd ms",
                               "fwd TFLOPS", "bwd TFLOPS", "fwd+bwd TFLOPS", "fwd+bwd time / attention()"),
                              rows))
    shapes = [(f"{c.get('file')} {c.get('name')}", c.get("shape", ""), fmt_num(c.get("fwd_tflop")),
               c.get("check", "")) for c in s.get("configs") or [] if c.get("shape")]
    if shapes:
        parts.append(md_table(("config", "shape", "fwd TFLOP (nominal)", "check"), shapes))
    fp8 = s.get("fp8") or {}
    if fp8:
        if fp8.get("rows"):
            parts.append(f"FP8 ({fp8.get('shape', '')}): `attention(fp8=True)` (quantization of q, k, v "
                         "inside the call) vs bf16 `attention()`.\n\n" + md_table(
                             ("measurement", "ms", "TFLOPS", "ratio to bf16"),
                             [(r.get("name"), fmt_stat(r.get("ms")) if r.get("ms") else r.get("status", "n/a"),
                               fmt_num(r.get("tflops")), fmt_ratio(r.get("ratio_to_bf16")))
                              for r in fp8["rows"]]))
        elif fp8.get("status"):
            parts.append(f"FP8: {fp8.get('status')}")
    tiny = s.get("tiny") or {}
    if tiny:
        if tiny.get("rows"):
            base = next((r.get("us") for r in tiny["rows"] if r.get("name") == "attention()"), None)
            parts.append(f"Per-call host+GPU time on a tiny problem ({tiny.get('shape', '')}, inference), "
                         f"{tiny.get('calls', '?')} back-to-back calls per timed batch:\n\n" + md_table(
                             ("call", "µs per call", "ratio to attention()"),
                             [(r.get("name"), fmt_stat(r.get("us")) if r.get("us") else r.get("status", "n/a"),
                               fmt_ratio(ratio(r.get("us"), base))) for r in tiny["rows"]]))
        elif tiny.get("status"):
            parts.append(f"Tiny problem: {tiny.get('status')}")
    return "\n\n".join(parts)


def _md_rebuild(s: Mapping) -> str:
    parts = []
    rows = []
    for g in s.get("graphs") or []:
        if not is_ok(g.get("status", RESULT_STATUS_OK)) and not g.get("cold_ms"):
            rows.append((g.get("phase"), g.get("status"), "", "", "", "", ""))
            continue
        dyn = g.get("dynamic_shapes") or []
        kind = "dynamic" if dyn and all(dyn) else "static (cuDNN rejects dynamic shapes)" if dyn and not any(dyn) \
            else "mixed" if dyn else "?"
        rows.append((
            f"{g.get('phase')} ({kind})", fmt_stat(g.get("cold_ms")), fmt_stat(g.get("new_batch_ms")),
            fmt_stat(g.get("new_seqlen_ms")), fmt_stat(g.get("static_new_batch_ms")),
            fmt_stat(g.get("static_again_ms")), fmt_ratio(ratio(g.get("cold_ms"), g.get("new_batch_ms"))),
        ))
    if rows:
        parts.append(f"Problem class: {s.get('problem', '?')}; graphs built with build_graph(depth=FULL) "
                     "on one thread, in a fresh process.\n\n" + md_table(
                         ("graph", "cold build ms (dynamic shapes)", "new batch ms (kernel cache)",
                          "new seqlen ms (kernel cache)", "static build, new batch ms",
                          "static build, same graph again ms", "cold / new batch"), rows))
    checks = s.get("checks") or []
    if checks:
        parts.append("Forward output of the kernel-cache graph vs the static graph on the same inputs: " + "; ".join(
            (f"{c.get('name')}: {c.get('status')}" if c.get("status") else
             f"{c.get('name')}: rel err {fmt_num(c.get('rel_err_vs_static'))}"
             f"{', NaN in output' if c.get('nan') else ''}"
             f"{'' if c.get('dynamic_shapes') else ' (built static)'}") for c in checks) + ".")
    d = s.get("dispatch") or {}
    if d.get("rows"):
        parts.append(f"Through attention() ({d.get('problem', '')}, forward+backward, wall ms incl. sync):\n\n"
                     + md_table(("call", "ms", "plan builds", "plan build ms", "probes"), [
                         (r.get("name"), fmt_stat(r.get("ms")) if r.get("ms") else r.get("status", "n/a"),
                          r.get("plan_builds", ""), fmt_num(r.get("plan_build_ms")), r.get("probes", ""))
                         for r in d["rows"]]))
    elif d.get("status"):
        parts.append(f"Through attention(): {d.get('status')}")
    return "\n\n".join(parts)


# =================================================================================================
# Worker side: measurements in subprocesses (GPU, torch, cuDNN are imported here only)
# =================================================================================================
class Partial(dict):
    """A worker's result, written to disk after every item so a crash keeps what was measured."""

    def __init__(self, path: str | None) -> None:
        super().__init__()
        self.path = path

    def save(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(clean_json(dict(self)), fh)
        os.replace(tmp, self.path)


def _log(*parts: Any) -> None:
    print("[bench worker]", *parts, file=sys.stderr, flush=True)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - started) * 1e3


def _time_calls(fn: Callable[[], Any], calls: int, batches: int) -> list[float]:
    """µs per call over `batches` timed batches of calls//batches back-to-back calls (GC off)."""
    per = max(1, calls // batches)
    for _ in range(min(per, 200)):
        fn()
    samples = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(batches):
            started = time.perf_counter_ns()
            for _ in range(per):
                fn()
            samples.append((time.perf_counter_ns() - started) / per / 1e3)
    finally:
        if enabled:
            gc.enable()
    return samples


def _past(deadline: float | None, margin: float = 0.0) -> bool:
    return deadline is not None and time.time() + margin > deadline


def _load_file(stem: str) -> Any:
    from fusedattn_select.config_files import load_config_file

    return load_config_file(ROOT / "configs" / f"{stem}.yaml")


def _cudnn_versions() -> dict:
    out = {}
    try:
        import cudnn

        out["cudnn_frontend"] = str(getattr(cudnn, "__version__", "unknown"))
        from fusedattn_select.types import format_cudnn_version

        out["cudnn_backend"] = format_cudnn_version(int(cudnn.backend_version()))
    except Exception as err:  # noqa: BLE001
        out["cudnn_error"] = f"{type(err).__name__}: {err}"
    return out


# ----- env ---------------------------------------------------------------------------------------
def worker_env(args: Mapping, res: Partial) -> None:
    res["python"] = platform.python_version()
    res["host"] = platform.node()
    try:
        import fusedattn_select

        res["library"] = fusedattn_select.__version__
    except Exception as err:  # noqa: BLE001
        res["library"] = f"import failed: {err}"
    import torch

    res["torch"] = torch.__version__
    res["torch_cuda"] = torch.version.cuda
    res["torch_cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        res["gpu_name"] = props.name
        res["capability"] = f"{props.major}.{props.minor}"
        res["sm_count"] = props.multi_processor_count
        res["memory_gib"] = round(props.total_memory / 2**30, 1)
        res["device_count"] = torch.cuda.device_count()
    res.update(_cudnn_versions())
    try:
        from fusedattn_select.probing.cudnn.engine import CudnnEngine

        fp = CudnnEngine().fingerprint()
        res["driver"] = fp.driver_version
        res["fingerprint"] = fp.describe()
    except Exception as err:  # noqa: BLE001
        res["engine_error"] = f"{type(err).__name__}: {err}"
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit,pstate",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        res["nvidia_smi"] = smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else smi.stderr.strip()
    except Exception as err:  # noqa: BLE001
        res["nvidia_smi"] = f"n/a: {err}"


# ----- 1. selection ------------------------------------------------------------------------------
def worker_selection(args: Mapping, res: Partial) -> None:
    import fusedattn_select as fas

    entry = _load_file(args["file"]).get(args["entry"])
    cfg = entry.config
    calls, batches = int(args["calls"]), int(args["batches"])
    res.update(problem=f"{args['file']} {args['entry']} (b{cfg.batch_size} h{cfg.num_heads_q}/{cfg.num_heads_kv} "
                       f"s{cfg.seqlen_q} d{cfg.head_dim_qk} {cfg.qkv_dtype} {cfg.mask} train)",
               calls=calls, batches=batches, rows=[])
    rows = res["rows"]

    def add(name: str, fn: Callable[[], Any], answer: Any = "") -> None:
        try:
            rows.append({"name": name, "us": summarize(_time_calls(fn, calls, batches), "us"), "answer": str(answer)})
        except Exception as err:  # noqa: BLE001
            rows.append({"name": name, "status": f"n/a: {type(err).__name__}: {first_line(err)}"})
        res.save()

    from fusedattn_select.selection.selector import default_selector

    selector = default_selector()
    res["engine"] = selector.engine_name
    if selector.engine is None:
        res["engine_unavailable"] = selector.unavailable_reason
    first, first_ms = _timed(lambda: fas.get_backend(cfg))
    res["first_call_ms"] = first_ms
    add("get_backend(cfg)", lambda: fas.get_backend(cfg), f"{first[0].value} (first call {first_ms:.1f} ms, probed)")
    add("cfg.cache_key() (part of every select)", cfg.cache_key)
    add("empty Python call (loop overhead)", lambda: None)

    import torch

    dev = torch.device("cuda")
    dtype = torch.bfloat16 if cfg.qkv_dtype == "bf16" else torch.float16
    b, hq, hk, s, skv, d = (cfg.batch_size, cfg.num_heads_q, cfg.num_heads_kv, cfg.seqlen_q, cfg.seqlen_kv,
                            cfg.head_dim_qk)
    q = torch.randn(b, hq, s, d, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hk, skv, d, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(b, hk, skv, cfg.resolved_head_dim_v, device=dev, dtype=dtype, requires_grad=True)
    causal, gqa = cfg.is_causal, hq != hk
    try:
        from torch.nn.attention import SDPBackend

        names = {int(m): n for n, m in SDPBackend.__members__.items()}
    except Exception:  # noqa: BLE001
        names = {}
    try:
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, causal, scale=None, enable_gqa=gqa)
        add("torch._fused_sdp_choice(q, k, v, ...)",
            lambda: torch._fused_sdp_choice(q, k, v, None, 0.0, causal, scale=None, enable_gqa=gqa),
            names.get(int(choice), choice))
    except Exception as err:  # noqa: BLE001
        rows.append({"name": "torch._fused_sdp_choice(q, k, v, ...)",
                     "status": f"n/a: {type(err).__name__}: {first_line(err)}"})
    try:
        from torch.backends.cuda import SDPAParams, can_use_cudnn_attention

        params = SDPAParams(q, k, v, None, 0.0, causal, gqa)
        answer = can_use_cudnn_attention(params, False)
        add("can_use_cudnn_attention(params)", lambda: can_use_cudnn_attention(params, False), answer)
        add("SDPAParams(...) + can_use_cudnn_attention",
            lambda: can_use_cudnn_attention(SDPAParams(q, k, v, None, 0.0, causal, gqa), False), answer)
    except Exception as err:  # noqa: BLE001
        rows.append({"name": "can_use_cudnn_attention(SDPAParams(...))",
                     "status": f"n/a: {type(err).__name__}: {first_line(err)}"})
    res["cache_info"] = fas.cache_info()


# ----- 2. probe cost -----------------------------------------------------------------------------
def worker_probe_file(args: Mapping, res: Partial) -> None:
    started = time.perf_counter()
    import cudnn  # noqa: F401 -- timed: part of the process init

    res["import_cudnn_ms"] = (time.perf_counter() - started) * 1e3
    from fusedattn_select.probing.cudnn.engine import CudnnEngine, operation_for
    from fusedattn_select.selection.selector import Selector
    from fusedattn_select.types import Phase, ProbeDepth

    engine, init_ms = _timed(CudnnEngine)
    res["engine_init_ms"] = init_ms
    res["engine_init_internal_ms"] = getattr(engine, "init_ms", None)
    res["engine_warm_up_ms"] = getattr(engine, "warm_up_ms", None)
    res["fingerprint"] = engine.fingerprint().describe()
    cf = _load_file(args["file"])
    res["entries"] = []
    deadline = args.get("deadline")
    seen: set = set()
    hit_calls = int(args["hit_calls"])
    for entry in cf.entries:
        cfg = entry.config
        row: dict[str, Any] = {"name": entry.name, "graphs": []}
        res["entries"].append(row)
        if _past(deadline, 3):
            row["status"] = skipped()
            res.save()
            continue
        try:
            backend = cfg.candidate
            phases = [Phase.FORWARD] + ([Phase.BACKWARD] if cfg.is_training else [])
            for phase in phases:
                g: dict[str, Any] = {"phase": phase.value}
                row["graphs"].append(g)
                klass = (cfg.shape_class_key(), operation_for(cfg, backend, phase))
                g["class_seen_in_process"] = klass in seen
                seen.add(klass)
                fast, g["fast_ms"] = _timed(lambda: engine.probe(cfg, backend, phase, ProbeDepth.FAST))
                g["fast"] = _verdict_brief(fast)
                full, g["full_ms"] = _timed(lambda: engine.probe(cfg, backend, phase, ProbeDepth.FULL))
                g["full"] = _verdict_brief(full)
                g["build_plans_ms"] = dict(full.timings_ms).get("build_plans")
                if full.supported:
                    again, g["rebuild_ms"] = _timed(lambda: engine.probe(cfg, backend, phase, ProbeDepth.FULL))
                    g["rebuild"] = _verdict_brief(again)
            selector = Selector(engine, store=None)
            selector.select(cfg)
            row["memory_hit_us"] = summarize(_time_calls(lambda: selector.select(cfg), hit_calls, 10), "us")
            row["status"] = RESULT_STATUS_OK
        except Exception as err:  # noqa: BLE001
            row["status"] = failed(f"{type(err).__name__}: {err}")
        res.save()


def _verdict_brief(v: Any) -> dict:
    return {"outcome": v.outcome.value, "stage": v.stage, "message": first_line(v.message, 200),
            "detail": first_line(v.detail, 200) if v.detail and v.detail != v.message else ""}


# ----- 3. warm start -----------------------------------------------------------------------------
def worker_warm_start(args: Mapping, res: Partial) -> None:
    t0 = time.perf_counter()
    import torch

    import fusedattn_select as fas
    from fusedattn_select.runtime.api import attention, dispatch_info

    res["import_s"] = time.perf_counter() - t0
    t = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    res["cuda_init_s"] = time.perf_counter() - t
    cf = _load_file(args["file"])
    depth = args.get("depth", "fast")
    t = time.perf_counter()
    if args.get("warmup"):
        # The documented way to prepare a model: warmup(depth="full") answers every problem and
        # (where the library stores execution plans) builds and stores the plans attention() runs.
        from fusedattn_select.selection.warmup import warmup

        report = warmup(list(cf.entries), depth=depth)
        res["warmup_totals"] = report.totals
    selections = [fas.select(e.config, depth) for e in cf.entries]
    res["select_s"] = time.perf_counter() - t
    res["entries"] = len(selections)
    res["backends"] = {b: sum(1 for s in selections if s.backend.value == b)
                       for b in sorted({s.backend.value for s in selections})}
    res["from_cache"] = sum(1 for s in selections if s.from_cache)
    info = fas.cache_info()
    res["after_select"] = {k: info.get(k) for k in ("probes", "persistent_hits", "hits", "misses")}
    res.save()

    cfg = cf.get(args["step"]).config
    layout = DISPATCH_LAYOUTS[cfg.qkv_layout]
    q, k, v = _qkv(torch, cfg, layout, requires_grad=True)
    kwargs = _attention_kwargs(cfg, layout)
    grad = None

    def step(split: bool = False) -> float:
        nonlocal grad
        torch.cuda.synchronize()
        started = time.perf_counter()
        out = attention(q, k, v, **kwargs)
        if split:
            torch.cuda.synchronize()
            res["first_fwd_s"] = time.perf_counter() - started
        if grad is None:
            grad = torch.randn_like(out)
        torch.autograd.grad(out, (q, k, v), grad)
        torch.cuda.synchronize()
        return time.perf_counter() - started

    res["first_step_s"] = step(split=True)
    res["steady_step_s"] = statistics.median(step() for _ in range(3))
    res["select_plus_step_s"] = res["select_s"] + res["first_step_s"]
    info, dinfo = fas.cache_info(), dispatch_info()
    res.update(probes=info.get("probes"), persistent_hits=info.get("persistent_hits"),
               hits=info.get("hits"), misses=info.get("misses"),
               plan_builds=dinfo.get("plan_builds"), plan_build_ms=dinfo.get("plan_build_ms"),
               plan_loads=dinfo.get("plan_loads"), plan_load_ms=dinfo.get("plan_load_ms"),
               fused_calls=dinfo.get("fused_calls"), fallback_calls=dinfo.get("fallback_calls"),
               store=info.get("store"))


# ----- 4. warmup scaling -------------------------------------------------------------------------
def worker_warmup(args: Mapping, res: Partial) -> None:
    from fusedattn_select.config_files import load_config_file
    from fusedattn_select.selection.selector import default_selector
    from fusedattn_select.selection.warmup import warmup

    suite = load_config_file(ROOT / args["suite"])
    entries = stride_subset(list(suite.entries), int(args["configs"]))
    t = time.perf_counter()
    selector = default_selector()
    res["init_s"] = time.perf_counter() - t
    res["engine"] = selector.engine_name
    if selector.engine is None:
        raise RuntimeError(f"no probing engine: {selector.unavailable_reason}")
    kind = args.get("workers", "threads")
    if kind == "threads":
        report = warmup(entries, jobs=int(args["jobs"]), depth="full", selector=selector)
    else:
        report = warmup(entries, jobs=int(args["jobs"]), depth="full", selector=selector, workers=kind)
    info = selector.cache_info()
    res.update(
        jobs=report.jobs, wall_s=report.wall_seconds, totals=report.totals, problems=len(report.rows),
        row_seconds_sum=sum(r.seconds for r in report.rows), probes=info.get("probes"),
        probe_failures=info.get("probe_failures"),
        failed_rows=[f"{r.name}: {first_line(r.reason, 160)}" for r in report.rows
                     if r.outcome.value == "failed"][:5],
    )


# ----- 5. dispatch -------------------------------------------------------------------------------
def _qkv(torch: Any, cfg: Any, layout: str, requires_grad: bool, dtype: Any = None) -> tuple:
    """Random q, k, v for `cfg` in the dim order of `layout` (normal(0, 1); never zeros)."""
    dtype = dtype or (torch.bfloat16 if cfg.qkv_dtype == "bf16" else torch.float16)
    dims = {
        "q": (cfg.batch_size, cfg.num_heads_q, cfg.seqlen_q, cfg.head_dim_qk),
        "k": (cfg.batch_size, cfg.num_heads_kv, cfg.seqlen_kv, cfg.head_dim_qk),
        "v": (cfg.batch_size, cfg.num_heads_kv, cfg.seqlen_kv, cfg.resolved_head_dim_v),
    }
    order = {"bshd": (0, 2, 1, 3), "sbhd": (2, 0, 1, 3), "bhsd": (0, 1, 2, 3)}[layout]
    out = []
    for name in ("q", "k", "v"):
        shape = tuple(dims[name][i] for i in order)
        out.append(torch.randn(shape, device="cuda", dtype=dtype).requires_grad_(requires_grad))
    return tuple(out)


def _to_bhsd(t: Any, layout: str) -> Any:
    return t.permute({"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}[layout])


def _attention_kwargs(cfg: Any, layout: str) -> dict:
    kwargs: dict[str, Any] = {"layout": layout, "mask": cfg.mask}
    if tuple(cfg.window_size) != (-1, -1):
        kwargs["window_size"] = tuple(cfg.window_size)
    if cfg.attn_scale is not None:
        kwargs["attn_scale"] = cfg.attn_scale
    return kwargs


def _cuda_times(torch: Any, fn: Callable[[Any], Any], reps: int, warmup: int,
                setup: Callable[[], Any] | None = None) -> list[float]:
    """ms per call of fn(setup()) with CUDA events around fn only (setup is not timed)."""
    for _ in range(warmup):
        fn(setup() if setup else None)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    keep = []
    for i in range(reps):
        arg = setup() if setup else None
        starts[i].record()
        keep.append(fn(arg))
        ends[i].record()
        if len(keep) > 2:
            keep.pop(0)
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _rel_err(a: Any, b: Any) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?")


def sdpa_reason(error_text: str, warning_texts: Sequence[str]) -> str:
    """The specific reasons in torch's "kernel not used because" warnings, without source locations."""
    reasons: list[str] = []
    for text in warning_texts:
        line = " ".join(_TRIGGERED.sub("", str(text)).split())
        if not line or line.endswith("because:") or line in reasons:
            continue
        reasons.append(line if len(line) <= 200 else line[:197] + "...")
    return "n/a: " + ("; ".join(reasons[:2]) or first_line(_TRIGGERED.sub("", error_text), 200))


def _sdpa_reason(err: BaseException, caught: Sequence[Any]) -> str:
    return sdpa_reason(str(err), [str(w.message) for w in caught])


def _torch_dtype(torch: Any, cudnn: Any, data_type: Any) -> Any:
    table = {
        cudnn.data_type.HALF: torch.float16, cudnn.data_type.BFLOAT16: torch.bfloat16,
        cudnn.data_type.FLOAT: torch.float32, cudnn.data_type.INT32: torch.int32,
        cudnn.data_type.INT64: torch.int64, cudnn.data_type.FP8_E4M3: torch.float8_e4m3fn,
        cudnn.data_type.FP8_E5M2: torch.float8_e5m2,
    }
    return table[data_type]


RAW_OUTPUTS = frozenset({"o", "stats", "dQ", "dK", "dV", "max_logit", "dBias", "dSink_token", "amax_s", "amax_o",
                         "amax_dP", "amax_dQ", "amax_dK", "amax_dV"})


class RawGraph:
    """One cudnn-frontend graph built with probing.cudnn.build_graph(depth=FULL), executed directly
    with preallocated tensors (no allocation, no lookup: the floor attention() is compared with)."""

    def __init__(self, torch: Any, cfg: Any, phase: Any, provided: Mapping[str, Any], *, kernel_cache: bool,
                 device_index: int = 0) -> None:
        import cudnn

        from fusedattn_select.probing.cudnn import engine as probe
        from fusedattn_select.types import Backend, ProbeDepth
        self.torch = torch
        self.handle = probe.handle_for(device_index)
        cache = probe.kernel_cache_for(cfg, Backend.F16, phase, device_index) if kernel_cache else None
        started = time.perf_counter()
        with probe.device_context(device_index):
            self.build = probe.build_graph(cfg, Backend.F16, phase, handle=self.handle, depth=ProbeDepth.FULL,
                                           kernel_cache=cache)
        self.build_ms = (time.perf_counter() - started) * 1e3
        self.tensors: dict[str, Any] = {}
        self.copied: list[str] = []
        self.synthesized: list[str] = []
        for name in self.build.tensors:
            dims, strides = self.build.dims_strides[name]
            dtype = _torch_dtype(torch, cudnn, self.build.data_types[name])
            t = provided.get(name)
            if t is not None:
                t = t.detach()
                if tuple(t.shape) != tuple(dims):
                    raise ValueError(f"{name}: shape {tuple(t.shape)} but the graph declares {tuple(dims)}")
                if t.dtype != dtype:
                    raise ValueError(f"{name}: dtype {t.dtype} but the graph declares {dtype}")
                if not all(n == 1 or a == b for n, a, b in zip(dims, t.stride(), strides)):
                    copy = torch.empty_strided(dims, strides, dtype=dtype, device="cuda")
                    copy.copy_(t)
                    t = copy
                    self.copied.append(name)
            else:
                t = torch.empty_strided(dims, strides, dtype=dtype, device="cuda")
                if name in RAW_OUTPUTS:
                    t.zero_()
                elif name.startswith(("scale_", "descale_")):
                    t.fill_(1.0)
                else:
                    t.zero_()
                    self.synthesized.append(name)
            self.tensors[name] = t
        self.pack = {self.build.tensors[n]: t for n, t in self.tensors.items()}
        self.workspace = torch.empty(max(1, int(self.build.workspace_size)), dtype=torch.uint8, device="cuda")
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)

    def __call__(self, _: Any = None) -> None:
        self.build.graph.execute(self.pack, self.workspace, handle=self.handle)


def worker_dispatch(args: Mapping, res: Partial) -> None:
    import torch
    import torch.nn.functional as F

    from fusedattn_select.runtime.api import (
        attention,
        config_from_tensors,
        dispatch_info,
    )
    from fusedattn_select.types import Phase

    reps, warm = int(args["reps"]), int(args["warmup"])
    deadline = args.get("deadline")
    # The short measurements first, so a tight budget trims configs, not them.
    res["tiny"] = {}
    try:
        _dispatch_tiny(torch, F, res["tiny"], args, attention, config_from_tensors, Phase)
    except Exception as err:  # noqa: BLE001
        res["tiny"]["status"] = failed(f"{type(err).__name__}: {err}")
        _log(traceback.format_exc())
    res.save()
    res["fp8"] = {}
    try:
        _dispatch_fp8(torch, res["fp8"], args, attention, config_from_tensors, dispatch_info, reps, warm)
    except Exception as err:  # noqa: BLE001
        res["fp8"]["status"] = failed(f"{type(err).__name__}: {err}")
        _log(traceback.format_exc())
    _settle(torch, "fp8")
    res.save()
    res["configs"] = []
    for stem, name in args["entries"]:
        c: dict[str, Any] = {"file": stem, "name": name, "impls": []}
        res["configs"].append(c)
        if _past(deadline, 8):
            c["status"] = skipped()
            res.save()
            continue
        try:
            _dispatch_one(torch, F, c, _load_file(stem).get(name).config, reps, warm, args, attention,
                          config_from_tensors, dispatch_info, Phase, deadline, res)
            c.setdefault("status", RESULT_STATUS_OK)
        except Exception as err:  # noqa: BLE001
            c["status"] = failed(f"{type(err).__name__}: {err}")
            _log(traceback.format_exc())
        _settle(torch, f"{stem} {name}")
        res.save()
    res["dispatch_info"] = dispatch_info()


def _settle(torch: Any, what: str) -> None:
    try:
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
    except Exception as err:  # noqa: BLE001 -- a broken context fails the items after it too
        _log(f"cannot synchronize after {what}: {err}")


_DYNAMIC_CLASSES: set = set()


def _dispatch_one(torch, F, c, cfg, reps, warm, args, attention, config_from_tensors, dispatch_info, Phase,
                  deadline, res) -> None:
    layout = DISPATCH_LAYOUTS[cfg.qkv_layout]
    causal = cfg.mask == "causal"
    fwd_flops = attention_flops(cfg.batch_size, cfg.num_heads_q, cfg.seqlen_q, cfg.seqlen_kv, cfg.head_dim_qk,
                                cfg.resolved_head_dim_v, causal)
    c["shape"] = (f"{layout} b{cfg.batch_size} h{cfg.num_heads_q}/{cfg.num_heads_kv} s{cfg.seqlen_q}"
                  f"{'' if cfg.seqlen_kv == cfg.seqlen_q else '/' + str(cfg.seqlen_kv)} d{cfg.head_dim_qk}"
                  f"{'' if cfg.resolved_head_dim_v == cfg.head_dim_qk else '/' + str(cfg.resolved_head_dim_v)} "
                  f"{cfg.qkv_dtype} {cfg.mask}"
                  f"{'' if tuple(cfg.window_size) == (-1, -1) else ' window ' + str(tuple(cfg.window_size))}")
    c["fwd_tflop"] = fwd_flops / 1e12
    q, k, v = _qkv(torch, cfg, layout, requires_grad=True)
    kwargs = _attention_kwargs(cfg, layout)
    qkv = (q, k, v)

    def record(name: str, fwd: Callable, setup_bwd: Callable, bwd: Callable, fwd_bwd: Callable,
               note: str = "") -> dict:
        impl: dict[str, Any] = {"name": name}
        if note:
            impl["note"] = note
        c["impls"].append(impl)
        try:
            impl["fwd_ms"] = summarize(_cuda_times(torch, fwd, reps, warm), "ms")
            impl["bwd_ms"] = summarize(_cuda_times(torch, bwd, reps, warm, setup_bwd), "ms")
            impl["fwd_bwd_ms"] = summarize(_cuda_times(torch, fwd_bwd, reps, warm), "ms")
            impl["fwd_tflops"] = tflops(fwd_flops, median_of(impl["fwd_ms"]))
            impl["bwd_tflops"] = tflops(fwd_flops * BACKWARD_FLOP_FACTOR, median_of(impl["bwd_ms"]))
            impl["fwd_bwd_tflops"] = tflops(fwd_flops * (1 + BACKWARD_FLOP_FACTOR), median_of(impl["fwd_bwd_ms"]))
            impl["status"] = RESULT_STATUS_OK
        except Exception as err:  # noqa: BLE001
            impl["status"] = failed(f"{type(err).__name__}: {err}")
            _log(traceback.format_exc())
        res.save()
        return impl

    # attention(): the library's dispatch (autograd Function around cached plans)
    before = dispatch_info()
    out_att = attention(q, k, v, **kwargs)
    grad = torch.randn_like(out_att)
    torch.autograd.grad(out_att, qkv, grad)
    torch.cuda.synchronize()
    after = dispatch_info()
    fused = after.get("fallback_calls", 0) == before.get("fallback_calls", 0)
    c["attention_fused"] = fused
    c["attention_plan_builds"] = after.get("plan_builds", 0) - before.get("plan_builds", 0)
    note = ""
    if not fused:
        from fusedattn_select import select

        sel = select(config_from_tensors(q, k, v, **kwargs))
        note = f"fell back: {first_line(sel.message, 160)}"
    record("attention()",
           lambda _: attention(q, k, v, **kwargs),
           lambda: attention(q, k, v, **kwargs),
           lambda out: torch.autograd.grad(out, qkv, grad),
           lambda _: torch.autograd.grad(attention(q, k, v, **kwargs), qkv, grad), note)
    checks = []

    # raw cudnn-frontend graphs, built at FULL with the kernel cache (dynamic shapes) and optionally static
    dcfg = config_from_tensors(q, k, v, is_training=True, **kwargs)
    qb, kb, vb = (_to_bhsd(t, layout) for t in qkv)
    # attention() builds its plans static (dispatch_plans.build_plan); the dynamic-shape graph from
    # this thread's kernel cache is what a new batch size would get from the cache.
    variants = [("raw cuDNN graph (static)", False)]
    klass = dcfg.shape_class_key()
    if args.get("raw_dynamic") and klass not in _DYNAMIC_CLASSES:
        # Only the first shape of a class: a kernel-cache graph for another batch/seqlen of a class
        # built before gave wrong outputs and once an illegal memory access here (H200, cuDNN 9.19),
        # which ends the process; section 6 checks that case on its own.
        _DYNAMIC_CLASSES.add(klass)
        variants.append(("raw cuDNN graph (dynamic shapes, kernel cache)", True))
    for label, dynamic in variants:
        if _past(deadline, 6):
            c["impls"].append({"name": label, "status": skipped()})
            continue
        try:
            fwd = RawGraph(torch, dcfg, Phase.FORWARD, {"q": qb, "k": kb, "v": vb}, kernel_cache=dynamic)
            d_o = torch.empty_like(fwd.tensors["o"]).normal_()
            bwd = RawGraph(torch, dcfg, Phase.BACKWARD, {"q": qb, "k": kb, "v": vb, "o": fwd.tensors["o"],
                                                         "stats": fwd.tensors["stats"], "dO": d_o},
                           kernel_cache=dynamic)
        except Exception as err:  # noqa: BLE001
            c["impls"].append({"name": label, "status": failed(f"{type(err).__name__}: {err}")})
            _log(traceback.format_exc())
            continue
        fwd()
        torch.cuda.synchronize()
        checks.append(f"raw {'dynamic' if dynamic else 'static'} vs attention() fwd rel err "
                      f"{_rel_err(fwd.tensors['o'], _to_bhsd(out_att.detach(), layout)):.1e}")

        def both(_: Any, fwd=fwd, bwd=bwd) -> None:
            fwd()
            bwd()

        impl = record(label, fwd, None, bwd, both)
        impl["build_ms"] = {"fwd": fwd.build_ms, "bwd": bwd.build_ms}
        impl["dynamic_shapes"] = {"fwd": fwd.build.dynamic_shapes, "bwd": bwd.build.dynamic_shapes}
        if not (fwd.build.dynamic_shapes and bwd.build.dynamic_shapes) and dynamic:
            impl["note"] = "static: " + ", ".join(
                n for n, b in (("fwd", fwd.build), ("bwd", bwd.build)) if not b.dynamic_shapes)
        if fwd.copied or bwd.copied or fwd.synthesized or bwd.synthesized:
            impl["binding"] = {"copied": fwd.copied + bwd.copied, "synthesized": fwd.synthesized + bwd.synthesized}
        del fwd, bwd, d_o

    # torch SDPA with each backend
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    blocker = sdpa_blocker(cfg.mask, cfg.window_size, cfg.seqlen_q, cfg.seqlen_kv)
    sdpa_kwargs = {"is_causal": causal, "scale": cfg.attn_scale, "enable_gqa": cfg.num_heads_q != cfg.num_heads_kv}
    for backend_name in SDPA_BACKENDS:
        label = f"torch SDPA {backend_name}"
        if blocker:
            c["impls"].append({"name": label, "status": f"n/a: {blocker}"})
            continue
        if _past(deadline, 5):
            c["impls"].append({"name": label, "status": skipped()})
            continue
        backend = getattr(SDPBackend, backend_name)

        def sdpa(_: Any = None) -> Any:
            return F.scaled_dot_product_attention(qb, kb, vb, **sdpa_kwargs)

        try:
            with sdpa_kernel(backend):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        out = sdpa()
                        torch.autograd.grad(out, qkv, _from_layout(grad, layout, out))
                        torch.cuda.synchronize()
                    except Exception as err:  # noqa: BLE001
                        c["impls"].append({"name": label, "status": _sdpa_reason(err, caught)})
                        continue
                checks.append(f"attention() vs {backend_name} fwd rel err "
                              f"{_rel_err(_to_bhsd(out_att.detach(), layout), out.detach()):.1e}")
                g_bhsd = _from_layout(grad, layout, out)
                del out
                record(label, sdpa, sdpa, lambda o: torch.autograd.grad(o, qkv, g_bhsd),
                       lambda _: torch.autograd.grad(sdpa(), qkv, g_bhsd))
        except Exception as err:  # noqa: BLE001
            c["impls"].append({"name": label, "status": failed(f"{type(err).__name__}: {err}")})
    c["check"] = "; ".join(checks)


def _from_layout(grad: Any, layout: str, like: Any) -> Any:
    """The output gradient given in the caller's layout, as the BHSD view SDPA returns."""
    g = _to_bhsd(grad, layout)
    return g if tuple(g.shape) == tuple(like.shape) else g.reshape(like.shape)


def _dispatch_fp8(torch, r, args, attention, config_from_tensors, dispatch_info, reps, warm) -> None:
    from fusedattn_select import select
    from fusedattn_select.runtime.fp8 import quantize_qkv

    stem, name = args["fp8_entry"]
    cfg = _load_file(stem).get(name).config
    layout = DISPATCH_LAYOUTS[cfg.qkv_layout]
    causal = cfg.mask == "causal"
    flops = attention_flops(cfg.batch_size, cfg.num_heads_q, cfg.seqlen_q, cfg.seqlen_kv, cfg.head_dim_qk,
                            cfg.resolved_head_dim_v, causal)
    r["shape"] = f"{stem} {name}: {layout} b{cfg.batch_size} h{cfg.num_heads_q}/{cfg.num_heads_kv} " \
                 f"s{cfg.seqlen_q} d{cfg.head_dim_qk} {cfg.mask}"
    r["rows"] = rows = []
    kwargs = _attention_kwargs(cfg, layout)
    q, k, v = _qkv(torch, cfg, layout, requires_grad=False)
    fp8_sel = select(config_from_tensors(q, k, v, fp8=True, is_training=False, **kwargs))
    r["fp8_inference_selection"] = fp8_sel.backend.value + (
        f": {first_line(fp8_sel.message)}" if fp8_sel.message else "")

    def add(name: str, fn: Callable, setup: Callable | None = None, work: float | None = None,
            base: dict | None = None) -> dict:
        row: dict[str, Any] = {"name": name}
        rows.append(row)
        try:
            row["ms"] = summarize(_cuda_times(torch, fn, reps, warm, setup), "ms")
            row["tflops"] = tflops(work, median_of(row["ms"])) if work else None
            row["ratio_to_bf16"] = ratio(row["ms"], base["ms"]) if base and base.get("ms") else None
        except Exception as err:  # noqa: BLE001
            row["status"] = failed(f"{type(err).__name__}: {err}")
            _log(traceback.format_exc())
        return row

    with torch.no_grad():
        before = dispatch_info()
        ref = attention(q, k, v, **kwargs)
        out8 = attention(q, k, v, fp8=True, **kwargs)
        torch.cuda.synchronize()
        after = dispatch_info()
        r["fp8_fallback_calls"] = after.get("fallback_calls", 0) - before.get("fallback_calls", 0)
        r["fp8_vs_bf16_rel_err"] = _rel_err(out8, ref)
        base = add("bf16 attention() fwd (inference)", lambda _: attention(q, k, v, **kwargs), work=flops)
        add("fp8 attention(fp8=True) fwd incl. quantization (inference)",
            lambda _: attention(q, k, v, fp8=True, **kwargs), work=flops, base=base)
        qb, kb, vb = (_to_bhsd(t, layout) for t in (q, k, v))
        add("quantize_qkv alone (amax + scale + cast of q, k, v)",
            lambda _: quantize_qkv(qb, kb, vb, torch.float8_e4m3fn), base=base)
    del ref, out8
    # training: forward + backward
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    qkv = (qg, kg, vg)
    train_sel = select(config_from_tensors(qg, kg, vg, fp8=True, is_training=True, **kwargs))
    r["fp8_training_selection"] = train_sel.backend.value + (
        f": {first_line(train_sel.message)}" if train_sel.message else "")
    grad = torch.randn_like(attention(qg, kg, vg, **kwargs))
    before = dispatch_info()
    torch.autograd.grad(attention(qg, kg, vg, fp8=True, **kwargs), qkv, grad)
    torch.cuda.synchronize()
    r["fp8_training_fallback_calls"] = dispatch_info().get("fallback_calls", 0) - before.get("fallback_calls", 0)
    work = flops * (1 + BACKWARD_FLOP_FACTOR)
    base = add("bf16 attention() fwd+bwd (training)",
               lambda _: torch.autograd.grad(attention(qg, kg, vg, **kwargs), qkv, grad), work=work)
    add("fp8 attention(fp8=True) fwd+bwd incl. quantization (training)",
        lambda _: torch.autograd.grad(attention(qg, kg, vg, fp8=True, **kwargs), qkv, grad), work=work, base=base)
    r["status"] = RESULT_STATUS_OK


def _dispatch_tiny(torch, F, r, args, attention, config_from_tensors, Phase) -> None:
    b, h, s, d = 1, 1, 64, 64
    r["shape"] = f"bshd b{b} h{h} s{s} d{d} bf16 no_mask"
    calls, batches = int(args["tiny_calls"]), int(args["tiny_batches"])
    r["calls"] = calls
    r["rows"] = rows = []
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qb, kb, vb = (_to_bhsd(t, "bshd") for t in (q, k, v))

    def per_call_us(fn: Callable[[], Any]) -> list[float]:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(batches):
            started = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            samples.append((time.perf_counter_ns() - started) / calls / 1e3)
        return samples

    def add(name: str, fn: Callable[[], Any]) -> None:
        try:
            rows.append({"name": name, "us": summarize(per_call_us(fn), "us")})
        except Exception as err:  # noqa: BLE001
            rows.append({"name": name, "status": failed(f"{type(err).__name__}: {err}")})
            _log(traceback.format_exc())

    with torch.no_grad():
        add("attention()", lambda: attention(q, k, v))
        try:
            raw = RawGraph(torch, config_from_tensors(q, k, v, is_training=False), Phase.FORWARD,
                           {"q": qb, "k": kb, "v": vb}, kernel_cache=True)
            add("raw cuDNN graph execute (preallocated output)", raw)
            r["raw_check_rel_err"] = _rel_err(_to_bhsd(attention(q, k, v), "bshd"), raw.tensors["o"])
        except Exception as err:  # noqa: BLE001
            rows.append({"name": "raw cuDNN graph execute", "status": failed(f"{type(err).__name__}: {err}")})
        add("torch SDPA (its default backend choice)", lambda: F.scaled_dot_product_attention(qb, kb, vb))
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                add("torch SDPA CUDNN_ATTENTION", lambda: F.scaled_dot_product_attention(qb, kb, vb))
        except Exception as err:  # noqa: BLE001
            rows.append({"name": "torch SDPA CUDNN_ATTENTION", "status": f"n/a: {first_line(err)}"})
    r["status"] = RESULT_STATUS_OK


# ----- 6. plan rebuild ---------------------------------------------------------------------------
def worker_rebuild(args: Mapping, res: Partial) -> None:
    from fusedattn_select.probing.cudnn import engine as probe
    from fusedattn_select.types import Backend, Phase, ProbeDepth
    cfg = _load_file(args["file"]).get(args["entry"]).config
    if args.get("seqlen"):
        cfg = cfg.replace(seqlen_q=int(args["seqlen"]), seqlen_kv=int(args["seqlen"]))
    res["problem"] = (f"{args['file']} {args['entry']} at b{cfg.batch_size} s{cfg.seqlen_q} "
                      f"(h{cfg.num_heads_q}/{cfg.num_heads_kv} d{cfg.head_dim_qk} {cfg.mask}); new batches "
                      f"{list(args['batches'])}, new seqlens {list(args['seqlens'])}")
    res["graphs"] = []
    with probe.device_context(0):
        handle = probe.handle_for(0)

        def build(c: Any, phase: Any, cache: bool) -> float:
            kc = probe.kernel_cache_for(c, Backend.F16, phase, 0) if cache else None
            started = time.perf_counter()
            built = probe.build_graph(c, Backend.F16, phase, handle=handle, depth=ProbeDepth.FULL, kernel_cache=kc)
            ms = (time.perf_counter() - started) * 1e3
            if cache:
                g.setdefault("dynamic_shapes", []).append(bool(built.dynamic_shapes))
                if built.note:
                    g["note"] = first_line(built.note, 300)
            del built
            return ms

        for phase in (Phase.FORWARD, Phase.BACKWARD):
            g: dict[str, Any] = {"phase": phase.value}
            res["graphs"].append(g)
            try:
                g["cold_ms"] = summarize([build(cfg, phase, True)], "ms")
                g["new_batch_ms"] = summarize([build(cfg.replace(batch_size=b), phase, True)
                                               for b in args["batches"]], "ms")
                g["new_seqlen_ms"] = summarize([build(cfg.replace(seqlen_q=s, seqlen_kv=s), phase, True)
                                                for s in args["seqlens"]], "ms")
                static_cfg = cfg.replace(batch_size=max(args["batches"]) + 1)
                g["static_new_batch_ms"] = summarize([build(static_cfg, phase, False)], "ms")
                g["static_again_ms"] = summarize([build(static_cfg, phase, False) for _ in range(2)], "ms")
                g["status"] = RESULT_STATUS_OK
            except Exception as err:  # noqa: BLE001
                g["status"] = failed(f"{type(err).__name__}: {err}")
                _log(traceback.format_exc())
            res.save()

    # the same through attention(): first call (select + cold builds), a new batch size, steady state
    d: dict[str, Any] = {"rows": []}
    res["dispatch"] = d
    try:
        import torch

        import fusedattn_select as fas
        from fusedattn_select.runtime.api import attention, dispatch_info

        dcfg = _load_file(args["dispatch_file"]).get(args["dispatch_entry"]).config
        layout = DISPATCH_LAYOUTS[dcfg.qkv_layout]
        kwargs = _attention_kwargs(dcfg, layout)
        d["problem"] = (f"{args['dispatch_file']} {args['dispatch_entry']}: h{dcfg.num_heads_q}/{dcfg.num_heads_kv} "
                        f"s{dcfg.seqlen_q} d{dcfg.head_dim_qk} {dcfg.mask}, batch {dcfg.batch_size} then "
                        f"{dcfg.batch_size + 1}; same process as the builds above")
        torch.zeros(1, device="cuda")

        def call(batch: int) -> dict:
            q, k, v = _qkv(torch, dcfg.replace(batch_size=batch), layout, requires_grad=True)
            torch.cuda.synchronize()
            before, info0 = dispatch_info(), fas.cache_info()
            started = time.perf_counter()
            out = attention(q, k, v, **kwargs)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
            torch.cuda.synchronize()
            ms = (time.perf_counter() - started) * 1e3
            after, info1 = dispatch_info(), fas.cache_info()
            return {"ms_value": ms, "plan_builds": after.get("plan_builds", 0) - before.get("plan_builds", 0),
                    "plan_build_ms": after.get("plan_build_ms", 0) - before.get("plan_build_ms", 0),
                    "probes": info1.get("probes", 0) - info0.get("probes", 0)}

        for label, batch in ((f"first call, batch {dcfg.batch_size} (select + plan builds)", dcfg.batch_size),
                             (f"first call, new batch {dcfg.batch_size + 1} (new plans)", dcfg.batch_size + 1)):
            row = call(batch)
            row["name"] = label
            row["ms"] = summarize([row.pop("ms_value")], "ms")
            d["rows"].append(row)
        steady = [call(dcfg.batch_size + 1) for _ in range(5)]
        d["rows"].append({"name": "later call, same shape (plans cached)",
                          "ms": summarize([r["ms_value"] for r in steady], "ms"),
                          "plan_builds": sum(r["plan_builds"] for r in steady), "plan_build_ms": 0.0,
                          "probes": sum(r["probes"] for r in steady)})
        d["status"] = RESULT_STATUS_OK
    except Exception as err:  # noqa: BLE001
        d["status"] = failed(f"{type(err).__name__}: {err}")
        _log(traceback.format_exc())

    # Last, because a wrong kernel-cache graph can end the process (illegal memory access): are the
    # kernel-cache graphs right? Forward outputs vs the static graph on the same inputs.
    res["checks"] = []
    try:
        import torch

        layout = DISPATCH_LAYOUTS.get(cfg.qkv_layout, "bshd")
        for label, c in (("new batch", cfg.replace(batch_size=int(args["batches"][0]))),
                         ("new seqlen", cfg.replace(seqlen_q=int(args["seqlens"][0]),
                                                    seqlen_kv=int(args["seqlens"][0])))):
            q, k, v = (_to_bhsd(t, layout) for t in _qkv(torch, c, layout, requires_grad=False))
            dyn = RawGraph(torch, c, Phase.FORWARD, {"q": q, "k": k, "v": v}, kernel_cache=True)
            sta = RawGraph(torch, c, Phase.FORWARD, {"q": q, "k": k, "v": v}, kernel_cache=False)
            dyn()
            sta()
            torch.cuda.synchronize()
            res["checks"].append({
                "name": label, "dynamic_shapes": bool(dyn.build.dynamic_shapes),
                "rel_err_vs_static": _rel_err(dyn.tensors["o"], sta.tensors["o"]),
                "nan": bool(torch.isnan(dyn.tensors["o"]).any()),
            })
            del dyn, sta, q, k, v
            res.save()
    except Exception as err:  # noqa: BLE001
        res["checks"].append({"name": "check", "status": failed(f"{type(err).__name__}: {err}")})
        _log(traceback.format_exc())


WORKERS: dict[str, Callable[[Mapping, Partial], None]] = {
    "env": worker_env,
    "selection": worker_selection,
    "probe_file": worker_probe_file,
    "warm_start": worker_warm_start,
    "warmup": worker_warmup,
    "dispatch": worker_dispatch,
    "rebuild": worker_rebuild,
}


def run_worker_main(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    res = Partial(args.worker_out)
    try:
        WORKERS[args.worker](json.loads(args.worker_args), res)
        res.setdefault("status", RESULT_STATUS_OK)
        code = 0
    except BaseException as err:  # noqa: BLE001 -- reported to the parent through the result file
        res["status"] = failed(f"{type(err).__name__}: {err}")
        res["traceback"] = traceback.format_exc()[-3000:]
        _log(traceback.format_exc())
        code = 1
    res.save()
    return code


# =================================================================================================
# Parent side: orchestration, aggregation, report
# =================================================================================================
class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.plan = plan_for(args.quick)
        self.start = time.time()
        self.deadline = self.start + args.budget
        order = [s for s in RUN_ORDER if s in args.sections]
        self.deadlines = section_deadlines(self.start, args.budget, args.quick, order)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_path = self.out / "bench.log"
        self.log_path.write_text("")
        self.tmp = Path(tempfile.mkdtemp(prefix="fusedattn-bench-"))
        self.count = 0
        self.notes: list[str] = []

    def remaining(self, section: str) -> float:
        return min(self.deadlines.get(section, self.deadline), self.deadline + 15) - time.time()

    def cache_dir(self) -> str:
        path = Path(tempfile.mkdtemp(prefix="cache-", dir=self.tmp))
        os.chmod(path, 0o700)
        return str(path)

    def worker(self, name: str, wargs: Mapping, section: str, env: Mapping[str, str] | None = None,
               label: str = "") -> dict:
        """Run one worker subprocess; returns its result (with _wall_s) or {"status": "failed: ..."}."""
        self.count += 1
        tag = f"{self.count:02d}-{name}{('-' + label) if label else ''}"
        out_file = self.tmp / f"{tag}.json"
        limit = self.remaining(section) + 20
        if limit < 5:
            return {"status": skipped()}
        wargs = dict(wargs)
        wargs.setdefault("deadline", time.time() + max(1.0, limit - 25))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name,
               "--worker-args", json.dumps(wargs), "--worker-out", str(out_file)]
        penv = dict(os.environ)
        penv["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), penv.get("PYTHONPATH", "")) if p)
        penv["CUDA_CACHE_DISABLE"] = "1"
        penv["FUSEDATTN_SELECT_CACHE_DIR"] = self.cache_dir()
        penv.pop("FUSEDATTN_SELECT_SNAPSHOT", None)
        for key, value in (env or {}).items():
            if value is None:
                penv.pop(key, None)
            else:
                penv[key] = value
        started = time.perf_counter()
        timed_out = False
        worker_log = self.tmp / f"{tag}.log"
        with open(worker_log, "w") as log_file:
            try:
                proc = subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=penv,
                                      timeout=limit, cwd=str(ROOT))
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc, timed_out = None, True
        wall = time.perf_counter() - started
        try:
            text = worker_log.read_text(errors="replace")
        except OSError:
            text = ""
        with open(self.log_path, "a") as log:
            log.write(f"===== {tag} (rc {rc}, {wall:.1f} s) {json.dumps(dict(wargs))}\n{text}\n")
        result: dict = {}
        try:
            result = json.loads(out_file.read_text())
        except (OSError, ValueError):
            result = {}
        result["_wall_s"] = wall
        if timed_out:
            result["status"] = f"partial: timed out after {limit:.0f} s" if len(result) > 1 else \
                failed(f"timed out after {limit:.0f} s")
        elif rc != 0 and is_ok(result.get("status")):
            result["status"] = failed(f"worker exited with {rc}")
        elif rc != 0 and "status" not in result:
            last = [line for line in text.splitlines() if line.strip()]
            result["status"] = failed(f"worker exited with {rc}: {first_line(last[-1] if last else '')}")
        print(f"  [{time.time() - self.start:6.1f} s] {tag}: {result.get('status')} ({wall:.1f} s)", flush=True)
        return result

    # ----- sections ----------------------------------------------------------------------------
    def env(self) -> dict:
        res = self.worker("env", {}, "env")
        meta = {
            "device": _device_text(res),
            "gpu": first_line(res.get("nvidia_smi") or "") or res.get("gpu_name") or "n/a",
            "driver": res.get("driver") or "n/a",
            "cudnn_backend": res.get("cudnn_backend", "n/a"),
            "cudnn_frontend": res.get("cudnn_frontend", "n/a"),
            "torch": _torch_text(res),
            "library": f"{res.get('library', 'n/a')} (git {_git_rev()})",
            "python": res.get("python", platform.python_version()),
            "host": res.get("host", platform.node()),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "mode": self.plan["mode"],
            "budget_s": self.args.budget,
            "nvidia_smi": res.get("nvidia_smi"),
            "fingerprint": res.get("fingerprint"),
            "env_status": res.get("status"),
        }
        for key in ("engine_error", "cudnn_error"):
            if res.get(key):
                meta[key] = res[key]
        return meta

    def selection(self) -> dict:
        res = self.worker("selection", {"file": "llama-3-8b", "entry": "train-bf16",
                                        "calls": self.plan["selection_calls"],
                                        "batches": self.plan["selection_batches"]}, "selection")
        res["notes"] = [
            "get_backend runs the process-wide selector: rules, then the memory cache (this config was "
            "probed once before the timed calls). torch's two calls see the same shape as CUDA tensors "
            "that require grad.",
        ]
        return res

    def probe_cost(self) -> dict:
        files = self.plan["probe_files"] or tuple(sorted(p.stem for p in (ROOT / "configs").glob("*.yaml")))
        section: dict[str, Any] = {"files": []}
        for stem in files:
            if self.remaining("probe_cost") < 8:
                section["files"].append({"file": stem, "status": skipped()})
                continue
            res = self.worker("probe_file", {"file": stem, "hit_calls": self.plan["memory_hit_calls"]},
                              "probe_cost", label=stem)
            res["file"] = stem
            res["summary"] = probe_summary(res.get("entries") or [])
            section["files"].append(res)
        section.update(aggregate_probe_cost(section["files"]))
        section["status"] = _combined_status(section["files"], key="file")
        section["notes"] = [
            "One fresh process per config file (CudnnEngine, no torch). Cold = the first build of that "
            "graph's problem class in the process; graphs whose class (cache key without batch and "
            "sequence lengths) was built earlier in the same process are left out of the cold medians.",
            "fast = engine.probe(depth=fast): graph up to check_support; full = depth=full (kernels "
            "compiled, dynamic shapes + kernel cache); again = the same full probe once more (warm "
            "kernel cache); memory hit = Selector(engine, store=None).select(cfg) after a first call. "
            "Kernel caches are per process and per thread.",
        ]
        return section

    def warm_start(self) -> dict:
        section: dict[str, Any] = {"file": "configs/llama-3-8b.yaml", "step": "train-bf16", "runs": []}
        dirs: dict[str, str] = {}
        jit_dir = ""
        for kind in self.plan["warm_runs"]:
            full = kind.endswith("-full")
            group = "full" if full else "fast"
            if kind.startswith("cold") or group not in dirs:
                dirs[group] = self.cache_dir()
            env: dict[str, str | None] = {"FUSEDATTN_SELECT_CACHE_DIR": dirs[group]}
            if kind == "cold":
                # The cold run fills a fresh driver JIT cache, as a user's first launch does.
                jit_dir = self.cache_dir()
                env.update(CUDA_CACHE_DISABLE=None, CUDA_CACHE_PATH=jit_dir)
            elif kind == "warm+jit":
                env.update(CUDA_CACHE_DISABLE=None, CUDA_CACHE_PATH=jit_dir or self.cache_dir())
            if self.remaining("warm_start") < 10:
                section["runs"].append({"kind": kind, "status": skipped()})
                continue
            res = self.worker("warm_start", {"file": "llama-3-8b", "step": "train-bf16",
                                             "depth": "full" if full else "fast", "warmup": full},
                              "warm_start", env=env, label=kind.replace("+", "-"))
            res["kind"] = kind
            res["process_wall_s"] = res.pop("_wall_s", None)
            section["runs"].append(res)
            section["entries"] = section.get("entries") or res.get("entries")
        section["summary"] = warm_start_summary(section["runs"])
        section["status"] = _combined_status(section["runs"], key="kind")
        section["notes"] = [
            "cold: empty FUSEDATTN_SELECT_CACHE_DIR and an empty driver JIT cache (CUDA_CACHE_PATH) that "
            "it fills; warm: the decision store the cold run before it filled, JIT cache off "
            "(CUDA_CACHE_DISABLE=1: what the store alone gives); warm+jit: that store and that JIT cache "
            "(a user's second launch on the same machine). -full runs call warmup(entries, depth=\"full\") "
            "first (in the select column), which also stores execution plans where the library does.",
            "select all = select() of every entry of the file (includes the cuDNN engine's process init); "
            "first step = the first attention() forward+backward (its plan builds included); steady step "
            "= the median of 3 more.",
            "The persistent store holds decisions and the execution plans attention() built (serialized): a "
            "warm process loads its plans (plan loads) instead of building them (plan builds).",
        ]
        return section

    def warmup_scaling(self) -> dict:
        n = self.plan["warmup_configs"]
        section: dict[str, Any] = {"suite": "probes/hopper-suite.yaml", "configs": n, "runs": []}
        # Most informative first (1 job, then 8 of each kind): a tight budget trims the middle levels.
        for kind, jobs in self.plan["warmup_runs"]:
            if self.remaining("warmup_scaling") < 12:
                section["runs"].append({"workers": kind, "jobs": jobs, "status": skipped()})
                continue
            res = self.worker("warmup", {"suite": "probes/hopper-suite.yaml", "configs": n, "jobs": jobs,
                                         "workers": kind},
                              "warmup_scaling", env={"FUSEDATTN_SELECT_CACHE_DIR": self.cache_dir()},
                              label=f"{kind}{jobs}")
            res["workers"], res["jobs"] = kind, jobs
            if isinstance(res.get("wall_s"), (int, float)):
                res["wall_s"] = summarize([res["wall_s"]], "s")
            section["runs"].append(res)
        base = next((r.get("wall_s") for r in section["runs"]
                     if r.get("jobs") == 1 and r.get("workers") == "threads"), None)
        for r in section["runs"]:
            r["speedup"] = ratio(base, r.get("wall_s"))
        section["status"] = _combined_status(section["runs"], key="jobs")
        section["notes"] = [
            "warmup(entries, jobs=N, depth=\"full\", workers=\"threads\" | \"processes\"): threads share one "
            "process; processes are spawned workers sharing the persistent store. One run per level (n=1 "
            "each): the spread is not measured here. The sum of per-problem seconds above the wall time "
            "shows how long problems overlapped (or waited for each other).",
        ]
        return section

    def dispatch(self) -> dict:
        entries = []
        for stem in self.plan["dispatch_files"]:
            try:
                cf = _load_file(stem)
            except Exception as err:  # noqa: BLE001 -- e.g. pyyaml missing: name it and go on
                self.notes.append(f"dispatch: cannot read configs/{stem}.yaml: {err}")
                continue
            entries += [(stem, e.name) for e in pick_dispatch_entries(cf.entries, self.plan["dispatch_per_file"])]
        res = self.worker("dispatch", {
            "entries": entries, "reps": self.plan["dispatch_reps"], "warmup": self.plan["dispatch_warmup"],
            "raw_dynamic": self.plan["raw_dynamic"], "fp8_entry": ("llama-3-8b", "train-bf16"),
            "tiny_calls": self.plan["tiny_calls"], "tiny_batches": self.plan["tiny_batches"],
        }, "dispatch")
        if is_ok(res.get("status")):
            parts = [dict(c, key=f"{c.get('file')} {c.get('name')}") for c in res.get("configs") or []]
            parts += [dict(res.get(k) or {"status": failed("not measured")}, key=k) for k in ("fp8", "tiny")]
            res["status"] = _combined_status(parts, key="key")
        elif res.get("configs") and not str(res.get("status", "")).startswith("partial"):
            res["status"] = "partial: " + str(res.get("status"))
        res["notes"] = [
            f"CUDA-event times of {self.plan['dispatch_reps']} repetitions after {self.plan['dispatch_warmup']} "
            "warm-up calls; inputs normal(0, 1). bwd = the backward call alone (forward run untimed before "
            "it); fwd+bwd = both, as one training step sees them. attention() and SDPA include autograd.",
            "TFLOPS from nominal FLOPs: fwd 4*B*H*Sq*Skv*D (2*B*H*Sq*Skv*(Dqk+Dv) when they differ), halved "
            "for causal; bwd = 2.5x fwd. Sliding windows are counted as plain causal (nominal).",
            "raw cuDNN graph = probing.cudnn.build_graph(depth=FULL) executed directly with preallocated "
            "tensors: static (as attention() builds its plans), and in full mode also with dynamic shapes "
            "from this thread's kernel cache, for the first shape of each problem class only (where cuDNN "
            "rejects dynamic shapes, e.g. the Hopper backward, that graph is static too: see the note). A "
            "kernel-cache graph for a second shape of a class gave wrong outputs and once an illegal memory "
            "access in an earlier run of this benchmark; section 6 checks that case. check = relative "
            "error of the forward outputs.",
        ]
        return res

    def plan_rebuild(self) -> dict:
        res = self.worker("rebuild", {
            "file": "llama-3-8b", "entry": "train-bf16", "seqlen": 4096,
            "batches": list(self.plan["rebuild_batches"]), "seqlens": list(self.plan["rebuild_seqlens"]),
            "dispatch_file": "qwen2.5-7b", "dispatch_entry": "train-bf16",
        }, "plan_rebuild")
        res["notes"] = [
            "Each build is probing.cudnn.build_graph(depth=FULL); with a kernel cache the graph has dynamic "
            "shapes, so a new batch size or sequence length of the class reuses the compiled kernels (where "
            "cuDNN accepts dynamic shapes for the graph).",
            "attention() builds its plans static (dispatch_plans.build_plan: a kernel-cache forward warmed by "
            "another sequence length returned NaN on H200), so through attention() a new batch size costs a "
            "static build; the correctness line checks the kernel-cache forward here.",
        ]
        return res

    def run(self) -> dict:
        print(f"fusedattn-select bench: {self.plan['mode']} mode, budget {self.args.budget:.0f} s, "
              f"sections {', '.join(self.args.sections)}, out {self.out}", flush=True)
        try:
            meta = self.env()
        except Exception as err:  # noqa: BLE001
            meta = {"device": "n/a", "env_status": failed(err)}
        meta.setdefault("date_utc", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
        meta.setdefault("mode", self.plan["mode"])
        for key in ("torch", "cudnn_backend", "cudnn_frontend", "driver"):
            meta.setdefault(key, "n/a")
        print("versions: " + "; ".join(f"{k} {meta.get(k)}" for k in (
            "device", "gpu", "driver", "cudnn_backend", "cudnn_frontend", "torch", "library")), flush=True)
        sections: dict[str, Any] = {}
        for name in RUN_ORDER:
            if name not in self.args.sections:
                sections[name] = {"status": skipped("not selected (--sections)")}
                continue
            print(f"== {SECTION_TITLES[name]}", flush=True)
            try:
                result = getattr(self, name)()
            except Exception as err:  # noqa: BLE001 -- a section never aborts the run
                result = {"status": failed(f"{type(err).__name__}: {err}"), "traceback": traceback.format_exc()}
            result.setdefault("status", RESULT_STATUS_OK)
            result.pop("_wall_s", None)
            sections[name] = result
        doc = {
            "schema": SCHEMA,
            "meta": meta,
            "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in self.plan.items()},
            "sections": {name: sections.get(name, {"status": skipped("not run")}) for name in SECTIONS},
            "notes": self.notes + [
                "Workers run with CUDA_CACHE_DISABLE=1 (unless a run says otherwise) and their own "
                "FUSEDATTN_SELECT_CACHE_DIR; their output is in bench.log.",
            ],
            "wall_seconds": time.time() - self.start,
        }
        shutil.rmtree(self.tmp, ignore_errors=True)
        return clean_json(doc)


def _device_text(res: Mapping) -> str:
    name = res.get("gpu_name")
    if not name:
        return "n/a (no CUDA device: " + str(res.get("status", "")) + ")"
    extra = ", ".join(x for x in (
        f"sm_{res.get('capability', '?').replace('.', '')}",
        f"{res.get('sm_count', '?')} SMs",
        f"{res.get('memory_gib', '?')} GiB",
        f"{res.get('device_count', 1)} visible",
    ))
    return f"{name} ({extra})"


def _torch_text(res: Mapping) -> str:
    if not res.get("torch"):
        return "n/a"
    return f"{res['torch']} (CUDA {res.get('torch_cuda')}, torch's cuDNN {res.get('torch_cudnn')})"


def _git_rev() -> str:
    """The checkout's commit: git, else $FUSEDATTN_BENCH_REV (a copy of the tree without .git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=str(ROOT), timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return os.environ.get("FUSEDATTN_BENCH_REV") or "n/a"


def _combined_status(items: Sequence[Mapping], key: str) -> str:
    """ok when every item is ok; failed when none is; partial otherwise (naming the first problem)."""
    if not items:
        return failed("nothing was measured")
    bad = [i for i in items if not is_ok(i.get("status", RESULT_STATUS_OK))]
    if not bad:
        return RESULT_STATUS_OK
    first = f"{bad[0].get(key)}: {bad[0].get('status')}"
    if len(bad) == len(items):
        if all(str(i.get("status", "")).startswith("skipped") for i in bad):
            return skipped(f"time budget ({len(bad)} items)")
        return failed(f"all {len(items)} items; first {first}")
    return f"partial: {len(bad)} of {len(items)} not ok; first {first}"


def probe_summary(entries: Sequence[Mapping]) -> dict:
    """Medians of one file's probe measurements (cold = class not seen before in the process)."""
    buckets: dict[str, list[float]] = {k: [] for k in (
        "fast_fwd_ms", "fast_bwd_ms", "full_cold_fwd_ms", "full_cold_bwd_ms", "full_class_seen_ms",
        "rebuild_fwd_ms", "rebuild_bwd_ms", "rejected_fast_ms", "build_plans_cold_ms")}
    hits: list[float] = []
    graphs = supported = rejected = failures = 0
    for e in entries:
        if e.get("memory_hit_us"):
            hits.append(median_of(e["memory_hit_us"]))
        for g in e.get("graphs") or []:
            if "full" not in g:
                continue
            graphs += 1
            phase = "fwd" if g.get("phase") == "forward" else "bwd"
            outcome = (g.get("full") or {}).get("outcome")
            if outcome == "supported":
                supported += 1
                buckets[f"fast_{phase}_ms"].append(g.get("fast_ms"))
                if g.get("class_seen_in_process"):
                    buckets["full_class_seen_ms"].append(g.get("full_ms"))
                else:
                    buckets[f"full_cold_{phase}_ms"].append(g.get("full_ms"))
                    buckets["build_plans_cold_ms"].append(g.get("build_plans_ms"))
                buckets[f"rebuild_{phase}_ms"].append(g.get("rebuild_ms"))
            elif outcome == "unsupported":
                rejected += 1
                buckets["rejected_fast_ms"].append(g.get("fast_ms"))
            else:
                failures += 1
    out: dict[str, Any] = {k: summarize(v, "ms") for k, v in buckets.items()}
    out["memory_hit_us"] = summarize(hits, "us")
    out.update(graphs=graphs, supported=supported, rejected=rejected, failed=failures)
    out["_samples"] = {k: [x for x in v if x is not None] for k, v in buckets.items()}
    out["_samples"]["memory_hit_us"] = [x for x in hits if x is not None]
    return out


def aggregate_probe_cost(files: Sequence[Mapping]) -> dict:
    """Process-init stats over the files' fresh processes and all-file medians and ratios."""
    init = {
        "import_cudnn_ms": summarize((f.get("import_cudnn_ms") for f in files), "ms"),
        "engine_init_ms": summarize((f.get("engine_init_ms") for f in files), "ms"),
        "engine_warm_up_ms": summarize((f.get("engine_warm_up_ms") for f in files), "ms"),
        "first_probe_ms": summarize((_first_fast(f) for f in files), "ms"),
    }
    merged: dict[str, list[float]] = {}
    graphs = supported = rejected = failures = 0
    for f in files:
        sm = f.get("summary") or {}
        for k, v in (sm.get("_samples") or {}).items():
            merged.setdefault(k, []).extend(v)
        graphs += sm.get("graphs", 0)
        supported += sm.get("supported", 0)
        rejected += sm.get("rejected", 0)
        failures += sm.get("failed", 0)
    total: dict[str, Any] = {k: summarize(v, "us" if k.endswith("_us") else "ms") for k, v in merged.items()}
    total.update(graphs=graphs, supported=supported, rejected=rejected, failed=failures)
    for f in files:
        (f.get("summary") or {}).pop("_samples", None)
    hit_ms = median_of(total.get("memory_hit_us"))
    ratios = {
        "full_over_fast_fwd": ratio(total.get("full_cold_fwd_ms"), total.get("fast_fwd_ms")),
        "full_over_fast_bwd": ratio(total.get("full_cold_bwd_ms"), total.get("fast_bwd_ms")),
        "cold_over_rebuild": ratio(total.get("full_cold_fwd_ms"), total.get("rebuild_fwd_ms")),
        "cold_over_memory_hit": ratio(median_of(total.get("full_cold_fwd_ms")), hit_ms / 1e3 if hit_ms else None),
    }
    return {"init": init, "all": total, "ratios": ratios}


def _first_fast(f: Mapping) -> float | None:
    for e in f.get("entries") or []:
        for g in e.get("graphs") or []:
            if "fast_ms" in g:
                return g["fast_ms"]
    return None


def warm_start_summary(runs: Sequence[Mapping]) -> dict:
    """Medians per run kind (cold / warm / warm+jit, depth fast) and cold-over-warm ratios."""
    ok = [r for r in runs if is_ok(r.get("status", RESULT_STATUS_OK))]
    out = {}
    for key in ("process_wall_s", "select_s", "first_step_s", "select_plus_step_s"):
        stats = {kind: summarize((r.get(key) for r in ok if r.get("kind") == kind), "s")
                 for kind in ("cold", "warm", "warm+jit")}
        if any(stats.values()):
            stats["ratio"] = ratio(stats["cold"], stats["warm"])
            stats["ratio_jit"] = ratio(stats["cold"], stats["warm+jit"])
            out[key] = stats
    cold_full = summarize((r.get("select_s") for r in ok if r.get("kind") == "cold-full"), "s")
    warm_full = summarize((r.get("select_s") for r in ok if r.get("kind") == "warm-full"), "s")
    if cold_full or warm_full:
        out["select_s_depth_full"] = {"cold": cold_full, "warm": warm_full, "warm+jit": None,
                                      "ratio": ratio(cold_full, warm_full), "ratio_jit": None}
    return out


def write_outputs(doc: Mapping, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    problems = validate_result(doc)
    if problems:
        doc = dict(doc)
        doc["schema_problems"] = problems
    json_path, md_path = out / "bench.json", out / "bench.md"
    json_path.write_text(json.dumps(clean_json(doc), indent=1, sort_keys=False) + "\n")
    md_path.write_text(render_markdown(doc))
    return json_path, md_path


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(1, str(ROOT))
    if args.worker:
        return run_worker_main(args)
    runner = Runner(args)
    doc = runner.run()
    json_path, md_path = write_outputs(doc, runner.out)
    print("", flush=True)
    print(md_path.read_text(), flush=True)
    print(f"wrote {json_path} and {md_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
