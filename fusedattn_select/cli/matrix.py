"""`matrix`: a support matrix of the problems of suite or model files, from snapshots or live probes.

Text by default (rows and columns chosen by --rows/--columns, cells "accepted/answered"), a
heatmap with --png, every problem and cell with --json; --compare torch lists where PyTorch's own
rule for its cuDNN backend disagrees with cuDNN's answer.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from fusedattn_select.cli import engines
from fusedattn_select.cli.arguments import add_depth_option
from fusedattn_select.cli.exit_codes import EXIT_NO_DATA, EXIT_NONE, EXIT_SELECTED
from fusedattn_select.cli.matrix_compare import DISAGREE, Comparison, compare, counts, describe_problem, torch_versions
from fusedattn_select.cli.matrix_data import AXES, FAILED, NO_DATA, Matrix, Problem, answer_of, build_matrix, parse_axes
from fusedattn_select.cli.matrix_plot import require_matplotlib, write_heatmap
from fusedattn_select.cli.table import render_table
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import ConfigError, PlatformError
from fusedattn_select.probing import torch_rules
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import ProbeDepth

LEGEND = ("cells: accepted/answered (F16 or FP8 / problems with a verdict); vN: N of the accepted verified "
          "(depth verify: results compared with a reference); ?N: N problems not recorded "
          "(no data: only a live probe can answer them); !N: N probes failed")


class Source:
    """Where the answers come from: the selector, a line saying so, and the snapshot files used."""

    def __init__(self, selector: Selector, notice: str, snapshot_paths: Sequence[str]) -> None:
        self.selector = selector
        self.notice = notice
        self.snapshot_paths = list(snapshot_paths)

    @property
    def live(self) -> bool:
        return not isinstance(self.selector.engine, SnapshotEngine)

    def describe(self) -> str:
        fingerprint = self.selector.fingerprint.describe()
        engine = self.selector.engine
        if engine is None:
            return "no engine (every problem is no data)"
        if not isinstance(engine, SnapshotEngine):
            return f"live probes on {fingerprint}"
        dates = sorted({f.recorded_on for f in engine.files})
        return f"snapshot {engine.file_names} recorded on {fingerprint}, {', '.join(dates)}"


def _source(args: argparse.Namespace) -> Source:
    if args.live:
        if args.snapshot or args.target:
            raise ConfigError("--live", True, "probes this machine's GPU; give --live or --snapshot/--target, not both")
        engine, reason = engines.live_engine()
        if engine is None:
            raise PlatformError(f"matrix --live needs a CUDA device with cuDNN: {reason}")
        return Source(Selector(engine, store=engines.open_store()), "", [])
    selector, notice = engines.choose_selector(args.snapshot, args.target)
    engine = selector.engine
    paths = [f.path for f in engine.files] if isinstance(engine, SnapshotEngine) else []
    return Source(selector, notice, paths)


def _problems(files: Sequence[str], selector: Selector, depth: ProbeDepth) -> list[Problem]:
    problems = []
    for path in files:
        config_file = load_config_file(path)
        for entry in config_file.entries:
            selection = selector.select(entry.config, depth)
            problems.append(Problem(Path(path).name, entry.name, entry.config, selection, answer_of(selection)))
    return problems


def _matrix_lines(matrix: Matrix) -> list[str]:
    corner = " / ".join(matrix.row_axes) + " \\ " + " / ".join(matrix.column_axes)
    headers = [corner] + [" ".join(c) for c in matrix.columns]
    rows = []
    for row in matrix.rows:
        cells = [matrix.cell(row, column) for column in matrix.columns]
        rows.append([" ".join(row)] + [cell.text() if cell is not None else "" for cell in cells])
    return render_table(headers, rows, align="l" + "r" * len(matrix.columns)).split("\n")


def _torch_answers(source: Source, problems: Sequence[Problem]) -> tuple[dict[str, Any], str]:
    """torch's answers by cache key, and a line saying where they come from."""
    if not source.live:
        recorded = torch_rules.read_recorded_torch(source.snapshot_paths)
        return recorded.answers, torch_versions(recorded.headers)
    platform, reason = torch_rules.torch_platform()
    if platform is None:
        return {}, f"torch not available here: {reason}"
    answers = {p.config.cache_key(): torch_rules.torch_answer(p.config) for p in problems}
    return answers, f"asked live: torch {platform['version']} (cuDNN {platform['cudnn_version']})"


def _comparison_lines(comparisons: Sequence[Comparison], origin: str) -> list[str]:
    tally = counts(comparisons)
    lines = ["", f"compare torch: PyTorch's can_use_cudnn_attention vs cuDNN's answer; torch's answers: {origin}"]
    disagreements = [c for c in comparisons if c.kind == DISAGREE]
    if disagreements:
        headers = ("problem", "config", "cuDNN", "torch", "torch picks", "torch's reason")
        rows = [(f"{c.problem.suite}:{c.problem.name}", describe_problem(c.problem), c.cudnn, c.torch,
                 c.sdpa_choice, c.torch_reason) for c in disagreements]
        lines += render_table(headers, rows, indent="  ").split("\n")
    lines.append("  " + ", ".join(f"{kind}: {n}" for kind, n in tally.items()))
    if tally["torch not recorded"] == len(comparisons):
        lines.append("  no torch answer is recorded for these problems: re-record the snapshot with "
                     "`fusedattn-select snapshot record` on a GPU where torch sees the device")
    return lines


def _document(source: Source, matrix: Matrix, problems: Sequence[Problem], depth: ProbeDepth,
              comparison: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "engine": source.selector.engine_name,
        "source": source.describe(),
        "fingerprint": source.selector.fingerprint.to_dict(),
        "snapshots": source.snapshot_paths,
        "probe_depth": depth.value,
        "notice": source.notice or None,
        "rows": list(matrix.row_axes),
        "columns": list(matrix.column_axes),
        "cells": [{"row": list(row), "column": list(column), **cell.to_dict()}
                  for (row, column), cell in sorted(matrix.cells.items(), key=lambda item: (
                      matrix.rows.index(item[0][0]), matrix.columns.index(item[0][1])))],
        "problems": [{"suite": p.suite, "name": p.name, "answer": p.answer, "verified": p.verified,
                      "selection": p.selection.to_dict()} for p in problems],
        "compare_torch": comparison,
    }


def _cmd_matrix(args: argparse.Namespace) -> int:
    row_axes = parse_axes(args.rows, "--rows")
    column_axes = parse_axes(args.columns, "--columns")
    if args.png is not None:
        require_matplotlib(args.png)
    for path in args.files:  # bad input fails before any engine starts
        load_config_file(path)
    depth = ProbeDepth.parse(args.depth, "--depth")
    source = _source(args)
    problems = _problems(args.files, source.selector, depth)
    matrix = build_matrix(problems, row_axes, column_axes)
    comparisons: list[Comparison] = []
    comparison_doc = None
    lines = [source.notice] if source.notice else []
    lines += [f"support matrix: {source.describe()}; {_depths(source, problems, depth)}", ""]
    lines += _matrix_lines(matrix) + ["", LEGEND, f"total: {matrix.totals().text()}"]
    if args.compare:
        answers, origin = _torch_answers(source, problems)
        comparisons = compare(problems, answers)
        lines += _comparison_lines(comparisons, origin)
        comparison_doc = {"torch_answers": origin, "counts": counts(comparisons),
                          "problems": [c.to_dict() for c in comparisons]}
    if args.png is not None:
        title = f"fused attention support: {source.describe()}; {_depths(source, problems, depth)}"
        write_heatmap(matrix, args.png, _wrap(title))
        lines.append(f"heatmap -> {args.png}")  # the path as given: the file written
    if args.json:
        print(json.dumps(_document(source, matrix, problems, depth, comparison_doc), indent=2))
    else:
        print("\n".join(lines))
    return _exit_code(matrix, comparisons, bool(args.compare))


def _depths(source: Source, problems: Sequence[Problem], depth: ProbeDepth) -> str:
    """The depth the answers were probed at: asked (live) or as recorded, per depth a count."""
    if source.live:
        return f"probe depth {depth.value}"
    recorded: dict[str, int] = {}
    for problem in problems:
        verdicts = problem.selection.verdicts
        if verdicts and problem.answer not in (NO_DATA, FAILED):
            name = min((v.depth for v in verdicts), key=list(ProbeDepth).index).value  # the shallower pass decides
            recorded[name] = recorded.get(name, 0) + 1
    return "recorded at depth " + (", ".join(f"{name} ({n} problems)" for name, n in sorted(recorded.items()))
                                    or "-")


def _wrap(title: str, width: int = 110) -> str:
    words, lines, line = title.split(" "), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join(lines + [line])


def _exit_code(matrix: Matrix, comparisons: Sequence[Comparison], compared: bool) -> int:
    """1 where --compare torch found a disagreement (1 wins over 3, as everywhere); else 3 for a problem
    without data or with a failed probe, or a comparison with no torch answer at all; else 0."""
    tally = counts(comparisons) if compared else {}
    if tally.get(DISAGREE):
        return EXIT_NONE
    totals = matrix.totals()
    if totals.no_data or totals.failed:
        return EXIT_NO_DATA
    if compared and tally["torch not recorded"] == len(comparisons):
        return EXIT_NO_DATA
    return EXIT_SELECTED


def register_matrix(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "matrix", parents=[common],
        help="a support matrix of suite or model files (text, --png heatmap, --json); --compare torch",
        description="Answer every entry of the given files and count them by row and column: cells are "
        "accepted/answered. Without --snapshot/--target/--live the engine is chosen as for `why`. Exit 0: "
        "the matrix holds a verdict for every problem (NONE cells are answers); 3: some problem has no "
        "data (not recorded) or a failed probe, or --compare torch found no torch answer; with "
        "--compare torch, 1: torch and cuDNN disagree somewhere (1 wins over 3).",
    )
    parser.add_argument("files", nargs="+", metavar="SUITE_OR_MODEL.yaml")
    engines.add_source_options(parser)
    parser.add_argument("--live", action="store_true", help="probe cuDNN on this machine's GPU")
    add_depth_option(parser, default=ProbeDepth.FAST)
    parser.add_argument("--rows", default="dtype,pass,head_dim", metavar="AXES",
                        help="row axes, comma-separated, from: " + ", ".join(AXES) + " (default: %(default)s)")
    parser.add_argument("--columns", default="mask", metavar="AXES", help="column axes (default: %(default)s)")
    parser.add_argument("--png", metavar="FILE.png", help="also write a heatmap PNG to FILE.png (needs the 'plot' extra)")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every cell and problem")
    parser.add_argument("--compare", choices=("torch",),
                        help="torch: where PyTorch's rule for its cuDNN backend disagrees with cuDNN")
    parser.set_defaults(func=_cmd_matrix)
