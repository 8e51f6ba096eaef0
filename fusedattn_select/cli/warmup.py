"""`warmup`: answer (and with --depth full, build) every entry of config files now, into the cache."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, TextIO

from fusedattn_select.cli.arguments import add_depth_option, positive_int
from fusedattn_select.cli.exit_codes import EXIT_NONE, EXIT_SELECTED
from fusedattn_select.cli.table import render_table
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import PlatformError
from fusedattn_select.probing import SNAPSHOT_ENV
from fusedattn_select.selection.selector import default_selector
from fusedattn_select.selection.warmup import WORKERS, WarmupReport, warmup
from fusedattn_select.types import Backend, ProbeDepth

REPORT_HEADER = ("name", "backend", "outcome", "seconds", "answer", "reason")
PROGRESS_BAR_WIDTH = 30


def format_report(report: WarmupReport) -> str:
    """One line per problem (seconds right-aligned), then the summary line."""
    rows = [
        (
            row.name + (f" (= {', '.join(row.also_named)})" if row.also_named else ""),
            row.backend.value,
            row.outcome.value,
            f"{row.seconds:.3f}",
            "cached" if row.from_cache else "probed",
            row.reason,
        )
        for row in report.rows
    ]
    return render_table(REPORT_HEADER, rows, align="lllr") + "\n" + report.summary()


def progress_bar(stream: TextIO | None = None) -> Callable[[int, int, str], None]:
    """A progress bar on stderr: redrawn in place on a terminal, a line per tenth otherwise."""
    out = stream or sys.stderr
    interactive = out.isatty()
    width = PROGRESS_BAR_WIDTH

    def show(done: int, total: int, name: str) -> None:
        filled = width * done // total
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name}"
        if interactive:
            out.write("\r\033[K" + bar + ("\n" if done == total else ""))
        elif done == total or done * 10 // total != (done - 1) * 10 // total:
            out.write(bar + "\n")
        out.flush()

    return show


def _cmd_warmup(args: argparse.Namespace) -> int:
    depth = ProbeDepth.parse(args.depth, "--depth")
    problems = []
    for path in args.configs:
        config_file = load_config_file(path)
        problems += [(f"{config_file.name}/{entry.name}", entry.config) for entry in config_file.entries]
    selector = default_selector()
    if selector.engine is None:
        raise PlatformError(
            f"warmup needs a CUDA device with cuDNN (or {SNAPSHOT_ENV}=FILE): {selector.unavailable_reason}"
        )
    report = warmup(problems, jobs=args.jobs, depth=depth, selector=selector,
                    progress=None if args.json else progress_bar(), workers=args.workers)
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    return EXIT_NONE if any(row.backend is Backend.NONE for row in report.rows) else EXIT_SELECTED


def register_warmup(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "warmup", parents=[common],
        help="answer (and with --depth full, build) every entry of config files now, into the cache",
    )
    parser.add_argument("configs", nargs="+", metavar="CONFIG.yaml")
    parser.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                        help="problems probed at once (default: min(8, CPUs))")
    add_depth_option(parser, default=ProbeDepth.FULL)
    parser.add_argument(
        "--workers", choices=WORKERS, default="threads",
        help="run the --jobs builds on threads (default) or in worker processes sharing the "
        "persistent store (cuDNN builds hold the GIL, so processes build in parallel)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(func=_cmd_warmup)
