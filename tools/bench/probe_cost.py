"""Section 2, probe cost: process init, cold fast and full probes per graph, the same graph again."""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from tools.bench import common
from tools.bench.problems import load_file
from tools.bench.runner import Runner


# ----- parent ------------------------------------------------------------------------------------
def run(runner: Runner) -> dict:
    files = runner.plan["probe_files"] or tuple(sorted(p.stem for p in (common.ROOT / "configs").glob("*.yaml")))
    section: dict[str, Any] = {"files": []}
    for stem in files:
        if runner.remaining("probe_cost") < 8:
            section["files"].append({"file": stem, "status": common.skipped()})
            continue
        res = runner.worker("probe_file", {"file": stem, "hit_calls": runner.plan["memory_hit_calls"]},
                            "probe_cost", label=stem)
        res["file"] = stem
        res["summary"] = probe_summary(res.get("entries") or [])
        section["files"].append(res)
    section.update(aggregate_probe_cost(section["files"]))
    section["status"] = common.combined_status(section["files"], key="file")
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


def probe_summary(entries: Sequence[Mapping]) -> dict:
    """Medians of one file's probe measurements (cold = class not seen before in the process)."""
    buckets: dict[str, list[float]] = {k: [] for k in (
        "fast_fwd_ms", "fast_bwd_ms", "full_cold_fwd_ms", "full_cold_bwd_ms", "full_class_seen_ms",
        "rebuild_fwd_ms", "rebuild_bwd_ms", "rejected_fast_ms", "build_plans_cold_ms")}
    hits: list[float] = []
    graphs = supported = rejected = failures = 0
    for e in entries:
        if e.get("memory_hit_us"):
            hits.append(common.median_of(e["memory_hit_us"]))
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
    out: dict[str, Any] = {k: common.summarize(v, "ms") for k, v in buckets.items()}
    out["memory_hit_us"] = common.summarize(hits, "us")
    out.update(graphs=graphs, supported=supported, rejected=rejected, failed=failures)
    out["_samples"] = {k: [x for x in v if x is not None] for k, v in buckets.items()}
    out["_samples"]["memory_hit_us"] = [x for x in hits if x is not None]
    return out


def aggregate_probe_cost(files: Sequence[Mapping]) -> dict:
    """Process-init stats over the files' fresh processes and all-file medians and ratios."""
    init = {
        "import_cudnn_ms": common.summarize((f.get("import_cudnn_ms") for f in files), "ms"),
        "engine_init_ms": common.summarize((f.get("engine_init_ms") for f in files), "ms"),
        "engine_warm_up_ms": common.summarize((f.get("engine_warm_up_ms") for f in files), "ms"),
        "first_probe_ms": common.summarize((_first_fast(f) for f in files), "ms"),
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
    total: dict[str, Any] = {k: common.summarize(v, "us" if k.endswith("_us") else "ms") for k, v in merged.items()}
    total.update(graphs=graphs, supported=supported, rejected=rejected, failed=failures)
    for f in files:
        (f.get("summary") or {}).pop("_samples", None)
    hit_ms = common.median_of(total.get("memory_hit_us"))
    ratios = {
        "full_over_fast_fwd": common.ratio(total.get("full_cold_fwd_ms"), total.get("fast_fwd_ms")),
        "full_over_fast_bwd": common.ratio(total.get("full_cold_bwd_ms"), total.get("fast_bwd_ms")),
        "cold_over_rebuild": common.ratio(total.get("full_cold_fwd_ms"), total.get("rebuild_fwd_ms")),
        "cold_over_memory_hit": common.ratio(common.median_of(total.get("full_cold_fwd_ms")),
                                             hit_ms / 1e3 if hit_ms else None),
    }
    return {"init": init, "all": total, "ratios": ratios}


def _first_fast(f: Mapping) -> float | None:
    for e in f.get("entries") or []:
        for g in e.get("graphs") or []:
            if "fast_ms" in g:
                return g["fast_ms"]
    return None


# ----- worker ------------------------------------------------------------------------------------
def worker(args: Mapping, res: common.Partial) -> None:
    started = time.perf_counter()
    import cudnn  # noqa: F401 -- timed: part of the process init

    res["import_cudnn_ms"] = (time.perf_counter() - started) * 1e3
    from fusedattn_select.probing.cudnn import CudnnEngine

    engine, init_ms = common.timed(CudnnEngine)
    res["engine_init_ms"] = init_ms
    res["engine_init_internal_ms"] = getattr(engine, "init_ms", None)
    res["engine_warm_up_ms"] = getattr(engine, "warm_up_ms", None)
    res["fingerprint"] = engine.fingerprint().describe()
    cf = load_file(args["file"])
    res["entries"] = []
    deadline = args.get("deadline")
    seen: set = set()
    for entry in cf.entries:
        row: dict[str, Any] = {"name": entry.name, "graphs": []}
        res["entries"].append(row)
        if res.skipped_past(row, deadline, 3):
            continue
        try:
            _probe_entry(engine, entry.config, row, seen, int(args["hit_calls"]))
            row["status"] = common.RESULT_STATUS_OK
        except Exception as err:  # noqa: BLE001
            row["status"] = common.error_status(err)
        res.save()


def _probe_entry(engine: Any, cfg: Any, row: dict, seen: set, hit_calls: int) -> None:
    """Fast, full and again-full probes of each graph of `cfg`, then the memory-cache hit time."""
    from fusedattn_select.probing.cudnn import operation_for
    from fusedattn_select.selection.selector import Selector
    from fusedattn_select.types import ProbeDepth

    backend = cfg.candidate
    for phase in cfg.phases:
        g: dict[str, Any] = {"phase": phase.value}
        row["graphs"].append(g)
        klass = (cfg.shape_class_key(), operation_for(cfg, backend, phase))
        g["class_seen_in_process"] = klass in seen
        seen.add(klass)
        fast, g["fast_ms"] = common.timed(lambda: engine.probe(cfg, backend, phase, ProbeDepth.FAST))
        g["fast"] = _verdict_brief(fast)
        full, g["full_ms"] = common.timed(lambda: engine.probe(cfg, backend, phase, ProbeDepth.FULL))
        g["full"] = _verdict_brief(full)
        g["build_plans_ms"] = dict(full.timings_ms).get("build_plans")
        if full.supported:
            again, g["rebuild_ms"] = common.timed(lambda: engine.probe(cfg, backend, phase, ProbeDepth.FULL))
            g["rebuild"] = _verdict_brief(again)
    selector = Selector(engine, store=None)
    selector.select(cfg)
    row["memory_hit_us"] = common.summarize(common.time_calls(lambda: selector.select(cfg), hit_calls, 10), "us")


def _verdict_brief(v: Any) -> dict:
    return {"outcome": v.outcome.value, "stage": v.stage, "message": common.first_line(v.message, 200),
            "detail": common.first_line(v.detail, 200) if v.detail and v.detail != v.message else ""}


# ----- report ------------------------------------------------------------------------------------
_FILE_COLUMNS = ("fast_fwd_ms", "fast_bwd_ms", "full_cold_fwd_ms", "full_cold_bwd_ms", "full_class_seen_ms",
                 "rebuild_fwd_ms", "rebuild_bwd_ms", "rejected_fast_ms", "memory_hit_us")


def _init_table(init: Mapping) -> str:
    rows = []
    for label, key in (("import cudnn", "import_cudnn_ms"),
                       ("CudnnEngine() (first cuDNN call, incl. its warm-up graph)", "engine_init_ms"),
                       ("  of which the engine's warm-up graph", "engine_warm_up_ms"),
                       ("first fast probe of the process", "first_probe_ms")):
        rows.append((label, common.fmt_stat(init.get(key)), (init.get(key) or {}).get("n", "")))
    return common.md_table(("process init (fresh process)", "ms", "fresh processes"), rows)


def render(s: Mapping) -> str:
    parts = []
    init = s.get("init") or {}
    if init:
        parts.append(_init_table(init))
    rows = []
    for f in s.get("files") or []:
        if not common.is_ok(f.get("status", common.RESULT_STATUS_OK)) and not (f.get("summary") or {}).get("graphs"):
            rows.append((f.get("file"), f.get("status"), "", "", "", "", "", "", "", "", ""))
            continue
        sm = f.get("summary") or {}
        rows.append((
            f.get("file") + ("" if common.is_ok(f.get("status", common.RESULT_STATUS_OK)) else f" ({f.get('status')})"),
            f"{sm.get('supported', 0)}/{sm.get('graphs', 0)}", *(common.fmt_stat(sm.get(k)) for k in _FILE_COLUMNS)))
    total = s.get("all") or {}
    if total:
        rows.append(("**all files**", f"{total.get('supported', 0)}/{total.get('graphs', 0)}",
                     *(common.fmt_stat(total.get(k)) for k in _FILE_COLUMNS)))
    if rows:
        parts.append(common.md_table((
            "config file", "graphs built/probed", "fast fwd ms", "fast bwd ms", "full cold fwd ms",
            "full cold bwd ms", "full, class built earlier in process ms",
            "again fwd: rebuild, warm kernel cache ms", "again bwd: rebuild ms", "rejection (fast) ms",
            "again: memory cache hit µs",
        ), rows))
    r = s.get("ratios") or {}
    if r:
        parts.append("Ratios (all files): full cold fwd / fast fwd = {}, full cold bwd / fast bwd = {}, "
                     "full cold fwd / fwd rebuild with warm kernel cache = {}, full cold fwd / memory hit = {}.".format(
                         common.fmt_ratio(r.get("full_over_fast_fwd")), common.fmt_ratio(r.get("full_over_fast_bwd")),
                         common.fmt_ratio(r.get("cold_over_rebuild")), common.fmt_ratio(r.get("cold_over_memory_hit"))))
    return "\n\n".join(parts)
