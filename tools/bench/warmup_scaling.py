"""Section 4, warmup scaling: warmup(depth="full") of a probe-suite subset with threads and worker
processes, each level in a fresh process with an empty cache directory."""

from __future__ import annotations

import time
from typing import Any, Mapping

from tools.bench import common
from tools.bench.runner import Runner

SUITE = "probes/hopper-suite.yaml"


# ----- parent ------------------------------------------------------------------------------------
def run(runner: Runner) -> dict:
    n = runner.plan["warmup_configs"]
    section: dict[str, Any] = {"suite": SUITE, "configs": n, "runs": []}
    # Most informative first (1 job, then 8 of each kind): a tight budget trims the middle levels.
    for kind, jobs in runner.plan["warmup_runs"]:
        if runner.remaining("warmup_scaling") < 12:
            section["runs"].append({"workers": kind, "jobs": jobs, "status": common.skipped()})
            continue
        res = runner.worker("warmup", {"suite": SUITE, "configs": n, "jobs": jobs, "workers": kind},
                            "warmup_scaling", env={"FUSEDATTN_SELECT_CACHE_DIR": runner.cache_dir()},
                            label=f"{kind}{jobs}")
        res["workers"], res["jobs"] = kind, jobs
        if isinstance(res.get("wall_s"), (int, float)):
            res["wall_s"] = common.summarize([res["wall_s"]], "s")
        section["runs"].append(res)
    base = next((r.get("wall_s") for r in section["runs"]
                 if r.get("jobs") == 1 and r.get("workers") == "threads"), None)
    for r in section["runs"]:
        r["speedup"] = common.ratio(base, r.get("wall_s"))
    section["status"] = common.combined_status(section["runs"], key="jobs")
    section["notes"] = [
        "warmup(entries, jobs=N, depth=\"full\", workers=\"threads\" | \"processes\"): threads share one "
        "process; processes are spawned workers sharing the persistent store. One run per level (n=1 "
        "each): the spread is not measured here. The sum of per-problem seconds above the wall time "
        "shows how long problems overlapped (or waited for each other).",
    ]
    return section


# ----- worker ------------------------------------------------------------------------------------
def worker(args: Mapping, res: common.Partial) -> None:
    from fusedattn_select.config_files import load_config_file
    from fusedattn_select.selection.local_warmup import warmup
    suite = load_config_file(common.ROOT / args["suite"])
    entries = common.stride_subset(list(suite.entries), int(args["configs"]))
    t = time.perf_counter()
    selector = common.warmed_selector()
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
        failed_rows=[f"{r.name}: {common.first_line(r.reason, 160)}" for r in report.rows
                     if r.outcome.value == "failed"][:5],
    )


# ----- report ------------------------------------------------------------------------------------
def render(s: Mapping) -> str:
    runs = s.get("runs") or []
    if not runs:
        return ""
    rows = []
    for r in sorted(runs, key=lambda r: (r.get("workers", "threads") != "threads", r.get("jobs", 0))):
        label = (r.get("workers", "threads"), r.get("jobs"))
        if not common.is_ok(r.get("status", common.RESULT_STATUS_OK)):
            rows.append((*label, r.get("status"), "", "", "", "", ""))
            continue
        totals = r.get("totals") or {}
        rows.append((
            *label, common.fmt_stat(r.get("wall_s")), common.fmt_ratio(r.get("speedup")),
            f"{totals.get('accepted', '?')}/{totals.get('rejected', '?')}/{totals.get('failed', '?')}",
            totals.get("plans_built", "n/a"),
            common.fmt_num(r.get("row_seconds_sum")), common.fmt_num(r.get("init_s")),
        ))
    return "\n".join([
        f"{s.get('configs', '?')} problems of {s.get('suite', '?')} (evenly spread), warmup(depth=\"full\"), "
        "each level in a fresh process with an empty cache directory.", "",
        common.md_table(("workers", "jobs", "warmup wall s", "speedup vs 1 thread", "accepted/rejected/failed",
                  "execution plans built", "sum of per-problem s", "process init s (not in wall)"), rows),
    ])
