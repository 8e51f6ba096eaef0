"""Section 3, warm start: a model file's selections and first attention() step in a fresh process,
with an empty vs a warmed persistent store (and driver JIT cache)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Mapping, Sequence

from tools.bench import common
from tools.bench.problems import attention_kwargs, dispatch_format, load_file
from tools.bench.runner import Runner
from tools.bench.tensors import qkv

_NOTES = [
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


# ----- parent ------------------------------------------------------------------------------------
def run(runner: Runner) -> dict:
    section: dict[str, Any] = {"file": "configs/llama-3-8b.yaml", "step": "train-bf16", "runs": []}
    dirs: dict[str, str] = {}
    jit_dir = ""
    for kind in runner.plan["warm_runs"]:
        full = kind.endswith("-full")
        group = "full" if full else "fast"
        if kind.startswith("cold") or group not in dirs:
            dirs[group] = runner.cache_dir()
        env: dict[str, str | None] = {"FUSEDATTN_SELECT_CACHE_DIR": dirs[group]}
        if kind == "cold":
            # The cold run fills a fresh driver JIT cache, as a user's first launch does.
            jit_dir = runner.cache_dir()
            env.update(CUDA_CACHE_DISABLE=None, CUDA_CACHE_PATH=jit_dir)
        elif kind == "warm+jit":
            env.update(CUDA_CACHE_DISABLE=None, CUDA_CACHE_PATH=jit_dir or runner.cache_dir())
        if runner.remaining("warm_start") < 10:
            section["runs"].append({"kind": kind, "status": common.skipped()})
            continue
        res = runner.worker("warm_start", {"file": "llama-3-8b", "step": "train-bf16",
                                           "depth": "full" if full else "fast", "warmup": full},
                            "warm_start", env=env, label=kind.replace("+", "-"))
        res["kind"] = kind
        res["process_wall_s"] = res.pop("_wall_s", None)
        section["runs"].append(res)
        section["entries"] = section.get("entries") or res.get("entries")
    section["summary"] = warm_start_summary(section["runs"])
    section["status"] = common.combined_status(section["runs"], key="kind")
    section["notes"] = list(_NOTES)
    return section


def warm_start_summary(runs: Sequence[Mapping]) -> dict:
    """Medians per run kind (cold / warm / warm+jit, depth fast) and cold-over-warm ratios."""
    ok = [r for r in runs if common.is_ok(r.get("status", common.RESULT_STATUS_OK))]
    out = {}
    for key in ("process_wall_s", "select_s", "first_step_s", "select_plus_step_s"):
        stats = {kind: common.summarize((r.get(key) for r in ok if r.get("kind") == kind), "s")
                 for kind in ("cold", "warm", "warm+jit")}
        if any(stats.values()):
            stats["ratio"] = common.ratio(stats["cold"], stats["warm"])
            stats["ratio_jit"] = common.ratio(stats["cold"], stats["warm+jit"])
            out[key] = stats
    cold_full = common.summarize((r.get("select_s") for r in ok if r.get("kind") == "cold-full"), "s")
    warm_full = common.summarize((r.get("select_s") for r in ok if r.get("kind") == "warm-full"), "s")
    if cold_full or warm_full:
        out["select_s_depth_full"] = {"cold": cold_full, "warm": warm_full, "warm+jit": None,
                                      "ratio": common.ratio(cold_full, warm_full), "ratio_jit": None}
    return out


# ----- worker ------------------------------------------------------------------------------------
def worker(args: Mapping, res: common.Partial) -> None:
    t0 = time.perf_counter()
    import torch

    import fusedattn_select as fas
    from fusedattn_select.runtime.api import attention, dispatch_info

    res["import_s"] = time.perf_counter() - t0
    t = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    res["cuda_init_s"] = time.perf_counter() - t
    cf = load_file(args["file"])
    depth = args.get("depth", "fast")
    t = time.perf_counter()
    if args.get("warmup"):
        # The documented way to prepare a model: warmup(depth="full") answers every problem and
        # (where the library stores execution plans) builds and stores the plans attention() runs.
        from fusedattn_select.selection.local_warmup import warmup

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
    _steps(torch, attention, cf.get(args["step"]).config, res)
    res["select_plus_step_s"] = res["select_s"] + res["first_step_s"]
    info, dinfo = fas.cache_info(), dispatch_info()
    res.update(probes=info.get("probes"), persistent_hits=info.get("persistent_hits"),
               hits=info.get("hits"), misses=info.get("misses"),
               plan_builds=dinfo.get("plan_builds"), plan_build_ms=dinfo.get("plan_build_ms"),
               plan_loads=dinfo.get("plan_loads"), plan_load_ms=dinfo.get("plan_load_ms"),
               fused_calls=dinfo.get("fused_calls"), fallback_calls=dinfo.get("fallback_calls"),
               store=info.get("store"))


def _steps(torch: Any, attention: Any, cfg: Any, res: common.Partial) -> None:
    """The first forward+backward attention() step (its forward apart), then the median of 3 more."""
    layout = dispatch_format(cfg.qkv_layout)
    q, k, v = qkv(torch, cfg, layout, requires_grad=True)
    kwargs = attention_kwargs(cfg, layout)
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


# ----- report ------------------------------------------------------------------------------------
WARM_LABELS = {
    "process_wall_s": "process wall", "select_s": "select all", "first_step_s": "first step",
    "select_plus_step_s": "select + first step", "select_s_depth_full": "select all, depth full",
}


def _run_row(r: Mapping) -> tuple:
    if not common.is_ok(r.get("status", common.RESULT_STATUS_OK)):
        return (r.get("kind"), r.get("status"), "", "", "", "", "", "", "", "")
    return (
        r.get("kind"), common.fmt_num(r.get("process_wall_s")), common.fmt_num(r.get("import_s")),
        common.fmt_num(r.get("cuda_init_s")), common.fmt_num(r.get("select_s")),
        f"{common.fmt_num(r.get('first_step_s'))} ({common.fmt_num(r.get('first_fwd_s'))})",
        common.fmt_num(r.get("steady_step_s")), common.fmt_num(r.get("select_plus_step_s")),
        f"{r.get('probes', '?')} / {r.get('persistent_hits', '?')}",
        f"{r.get('plan_builds', '?')} ({common.fmt_num(r.get('plan_build_ms'))} ms)"
        + (f" / {r['plan_loads']} ({common.fmt_num(r.get('plan_load_ms'))} ms)"
           if r.get("plan_loads") is not None else ""),
    )


def render(s: Mapping) -> str:
    runs = s.get("runs") or []
    if not runs:
        return ""
    lines = [f"Model file {s.get('file', '?')}: select() of {s.get('entries') or '?'} entries "
             f"(depth {s.get('depth', 'fast')} unless the run says -full), then one forward+backward "
             f"attention() step of {s.get('step', '?')}. Seconds, each run a fresh process.", "",
             common.md_table(("run", "process wall s", "imports s", "CUDA init s", "select all s",
                       "first step s (its forward)",
                       "steady step s", "select+first step s", "probes / persistent hits",
                       "plan builds / loads (ms)"), [_run_row(r) for r in runs])]
    summary = s.get("summary") or {}
    if summary:
        lines += ["", common.md_table(("seconds", "cold", "warm (store)", "warm (store + JIT cache)", "cold / warm",
                                "cold / warm+jit"), [
            (WARM_LABELS.get(k, k), common.fmt_stat(v.get("cold")),
             common.fmt_stat(v.get("warm")), common.fmt_stat(v.get("warm+jit")), common.fmt_ratio(v.get("ratio")),
             common.fmt_ratio(v.get("ratio_jit")))
            for k, v in summary.items()
        ])]
    return "\n".join(lines)
