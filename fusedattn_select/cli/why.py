"""`why`: which fused backend runs each problem, and if none, every reason why."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from fusedattn_select.cli import engines
from fusedattn_select.cli.exit_codes import EPILOG, answers_exit_code
from fusedattn_select.cli.matrix_data import FAILED, NO_DATA, answer_of
from fusedattn_select.cli.problem_input import problems
from fusedattn_select.cli.table import render_table
from fusedattn_select.errors import ConfigError
from fusedattn_select.planning.forms import PlanKind
from fusedattn_select.probing.nearest import NearProblem
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.result import Selection
from fusedattn_select.selection import alternatives, runners
from fusedattn_select.selection.selector import Selector, set_default_selector
from fusedattn_select.types import Outcome, ProbeDepth, Provenance, Verdict

VERDICT_HEADER = ("backend", "phase", "verdict", "stage", "provenance", "depth", "ms", "reason")
RECORDED_MS = "recorded ms"  # the ms column's header when the times were measured on the recording device
SAME_AS_ABOVE = "(same as above)"
NEAREST_HEADER = "nearest recorded problems: OTHER problems, not an answer for this one; closest first"
ALTERNATIVES_HEADER = "what would work instead: OTHER problems, not an answer for this one; cheapest change first"

# (problem name, its selection, the reasons the transformers integration cannot run it fused)
Answer = tuple[str, Selection, tuple[str, ...]]


def _verdict_row(verdict: Verdict) -> list[str]:
    # A problem nothing recorded has no depth of its own: "-" rather than the depth asked.
    unrecorded = verdict.outcome is Outcome.NO_DATA and not verdict.timings_ms
    outcome = "verified" if verdict.verified else verdict.outcome.value  # supported, results compared (verify)
    return [
        verdict.backend.value, verdict.phase.value, outcome, verdict.stage,
        verdict.provenance.value, "-" if unrecorded else verdict.depth.value,
        f"{verdict.total_ms:.2f}" if verdict.timings_ms else "-",
        verdict.message,
    ]


def format_selection(name: str, selection: Selection, recorded: bool = False,
                     runner: runners.Choice | None = None) -> list[str]:
    """The text answer for one problem: its fields, a verdict table, the chosen backend (or "no
    data"), and the runner measured faster for its graphs on this device where one was.
    `recorded`: the times were measured where a snapshot was recorded, not here."""
    cfg = selection.config
    fields = " ".join(f"{k}={v}" for k, v in cfg.to_dict().items()) if cfg is not None else ""
    rows = [_verdict_row(v) for v in selection.verdicts]
    for previous, row in zip(rows, rows[1:]):
        if row[-1] and row[-1] == previous[-1] or row[-1] == SAME_AS_ABOVE:
            row[-1] = SAME_AS_ABOVE
    header = VERDICT_HEADER[:-2] + (RECORDED_MS, VERDICT_HEADER[-1]) if recorded else VERDICT_HEADER
    lines = [f"{name}: {fields}"]
    lines += render_table(header, rows, indent="  ").split("\n")
    if selection.selected:
        lines.append(f"  -> {selection.backend.value}")
        if runner is not None:
            lines.append(f"  runner: {runner.describe()}")
    elif selection.no_data:
        lines.append(f"  -> no data (only a live probe can answer): {selection.message}")
    elif answer_of(selection) == FAILED:  # as matrix counts it: unknown, not a refusal
        recorded = any(v.outcome is Outcome.FAILED and v.provenance is Provenance.SNAPSHOT for v in selection.verdicts)
        again = "record it again on a GPU" if recorded else "probe again"
        lines.append(f"  -> no answer: the {'recorded ' if recorded else ''}probe failed (not a refusal; {again}): "
                     f"{selection.message}")
    else:
        lines.append(f"  -> NONE: {selection.message}")
    return lines


def nearest_recorded(selector: Selector, selection: Selection) -> tuple[NearProblem, ...]:
    """The recorded problems nearest to a problem a snapshot holds no data for; () for any other answer."""
    engine = selector.engine
    if not selection.no_data or selection.config is None or not isinstance(engine, SnapshotEngine):
        return ()
    return engine.nearest(selection.config)


def answered_from(selector: Selector, selection: Selection) -> str | None:
    """Which recorded row of a snapshot answers: "snapshot, bucket B=8 S_q=1024 S_kv=1024 (...)" when the
    shape was not recorded and its bucket's row answers, "snapshot, this shape's own row" otherwise,
    each with the GPU it was recorded on; None for any answer not replayed from a snapshot."""
    engine = selector.engine
    if (not isinstance(engine, SnapshotEngine) or selection.no_data or not selection.verdicts
            or any(v.provenance is Provenance.RULE for v in selection.verdicts)):
        return None
    row = selection.plan_form if selection.plan.kind is PlanKind.BUCKET else "this shape's own row"
    return f"snapshot, {row}, recorded on {engine.describe()}"


def format_nearest(nearest: tuple[NearProblem, ...]) -> list[str]:
    """The text lines that list `nearest` under a no-data answer, each with the fields that differ."""
    if not nearest:
        return []
    lines = [f"  {NEAREST_HEADER}:"]
    for number, near in enumerate(nearest, 1):
        lines.append(f"    {number}. {near.describe()}")
        lines.append("       differs: " + ", ".join(d.describe() for d in near.differences))
    return lines


def format_alternatives(search: alternatives.Search | None, replayed: bool = False) -> list[str]:
    """The text lines under a NONE: the alternatives found, the candidate problems asked and the
    engine calls spent (`replayed`: a snapshot's recorded rows, not graph probes)."""
    if search is None:
        return []
    if search.max_probes == 0:
        return ["  what would work instead: not searched (--alternatives-max-probes 0)"]
    unit = "recorded rows read" if replayed else "graph probes"
    spent = f"{search.candidates} candidate problems asked, {search.probes} {unit} of at most {search.max_probes}"
    spent += ", cap reached" if search.capped else ""
    if not search.alternatives:
        return [f"  what would work instead: none found; {spent}"]
    lines = [f"  {ALTERNATIVES_HEADER} ({spent}):"]
    lines += [f"    {number}. {alt.describe()}" for number, alt in enumerate(search.alternatives, 1)]
    return lines


def _search_dict(search: alternatives.Search | None) -> dict[str, Any] | None:
    if search is None:
        return None
    return {"found": [alt.to_dict() for alt in search.alternatives], "candidates": search.candidates,
            "probes": search.probes, "max_probes": search.max_probes, "capped": search.capped}


def _selection_dict(selection: Selection) -> dict[str, Any]:
    """The answer as JSON; its alternatives are listed once, in the result's own "alternatives"."""
    document = selection.to_dict()
    for key in ("alternatives", "alternative_probes"):
        document.pop(key, None)
    return document


def _searches(selector: Selector, answers: list[Answer], depth: ProbeDepth, limit: int,
              max_probes: int) -> list[alternatives.Search | None]:
    """For each refused answer the search for its alternatives through `selector`; None for the rest."""
    searches: list[alternatives.Search | None] = []
    for _, sel, _ in answers:
        refused = not sel.selected and any(v.outcome is Outcome.UNSUPPORTED for v in sel.verdicts)
        searches.append(alternatives.find(selector, sel, limit=limit, max_probes=max_probes, probe_depth=depth)
                        if limit and refused else None)
    return searches


def _print_json(selector: Selector, depth: ProbeDepth, notice: str, answers: list[Answer],
                model_notes: tuple[str, ...], searches: list[alternatives.Search | None]) -> None:
    if notice:
        print(notice, file=sys.stderr)
    engine = selector.engine
    document = {
        "engine": selector.engine_name,
        "fingerprint": selector.fingerprint.to_dict(),
        "probe_depth": depth.value,
        "notice": notice or None,
        "timings_recorded_on": engine.describe() if isinstance(engine, SnapshotEngine) else None,
        "notes": list(model_notes),
        "results": [
            {"name": name, "answer": answer_of(sel), "selection": _selection_dict(sel),
             "runner": _runner_dict(selector, sel),
             "verified": sel.selected and all(v.verified for v in sel.verdicts),
             "answered_from": answered_from(selector, sel),
             "nearest": [near.to_dict() for near in nearest_recorded(selector, sel)],
             "alternatives": _search_dict(search),
             **({"integration_reasons": list(notes)} if notes else {})}
            for (name, sel, notes), search in zip(answers, searches)
        ],
    }
    print(json.dumps(document, indent=2))


def _runner_dict(selector: Selector, selection: Selection) -> dict[str, Any] | None:
    choice = runners.for_selection(selector, selection)
    return None if choice is None else dataclasses.asdict(choice)


def _header(selector: Selector, depth: ProbeDepth) -> list[str]:
    engine = selector.engine
    if engine is None:
        return [f"engine: none (no CUDA device and no snapshot): every answer is no data; depth asked: {depth.value}"]
    lines = [f"engine: {selector.engine_name} ({selector.fingerprint.describe()}); depth asked: {depth.value}"]
    if isinstance(engine, SnapshotEngine):
        lines.append(
            f"answers replayed from {engine.file_names}, recorded on {engine.describe()}: the depth column "
            f"is the depth each answer was recorded at, '{RECORDED_MS}' the times measured there"
        )
    return lines


def _print_text(selector: Selector, depth: ProbeDepth, notice: str, answers: list[Answer],
                model_notes: tuple[str, ...], searches: list[alternatives.Search | None]) -> None:
    lines = [notice] if notice else []
    lines += _header(selector, depth)
    lines += [f"note: {note}" for note in model_notes]
    recorded = isinstance(selector.engine, SnapshotEngine)
    for (name, sel, notes), search in zip(answers, searches):
        lines.append("")
        lines += format_selection(name, sel, recorded, runners.for_selection(selector, sel))
        source = answered_from(selector, sel)
        if source is not None and sel.plan.kind is PlanKind.BUCKET:
            # Said only where it matters: the verdicts are of the bucket's graphs, not this exact shape's.
            lines.append(f"  answered from: {source} (this shape was not recorded; a GPU runs it in that "
                         "bucket)")
        lines += [f"  -> not fused by the transformers integration: {note}" for note in notes]
        lines += format_nearest(nearest_recorded(selector, sel))
        lines += format_alternatives(search, recorded)
    print("\n".join(lines))


def _cmd_why(args: argparse.Namespace) -> int:
    asked = problems(args.configs, args.name, args.hf_config, args.set or ())
    if args.platform == "rocm":
        if args.snapshot or args.target:
            raise ConfigError("--platform", "rocm", "answers from declared tables; --snapshot/--target are CUDA snapshots")
        selector, notice = engines.rocm_selector(args.arch)
    elif args.arch:
        raise ConfigError("--arch", args.arch, "is for --platform rocm")
    else:
        selector, notice = engines.choose_selector(args.snapshot, args.target)
    set_default_selector(selector)
    depth = ProbeDepth.VERIFY if args.verify else ProbeDepth.FULL if args.full else ProbeDepth.FAST
    answers = [(entry.name, selector.select(entry.config, depth), notes) for entry, notes in asked.problems]
    searches = _searches(selector, answers, depth, args.alternatives, args.alternatives_max_probes)
    (_print_json if args.json else _print_text)(selector, depth, notice, answers, asked.notes, searches)
    # A failed probe (out of memory) is no answer, as matrix counts it: unknown (3), never a refusal (1).
    return answers_exit_code([sel.selected and not notes for _, sel, notes in answers],
                             [answer_of(sel) in (NO_DATA, FAILED) for _, sel, _ in answers])


def _count(text: str) -> int:
    """A non-negative whole number for --alternatives and --alternatives-max-probes."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()):  # "²".isdigit() is True, and int("²") fails
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number 0 or more, in digits 0-9")
    return int(digits)


def register_why(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "why", parents=[common], epilog=EPILOG,
        help="which fused backend runs a problem, and if none, every reason why",
        description="Answer each entry of the CONFIG.yaml files (or one problem built from --set pairs): "
        "per backend and pass the verdict, the stage that decided it and why; then the backend.",
    )
    parser.add_argument("configs", nargs="*", metavar="CONFIG.yaml",
                        help="config files (see README 'Config format'); with several, entries are named "
                        "FILE-NAME/ENTRY as warmup names them")
    parser.add_argument("--name", help="answer only the entries with this name (in any of the files)")
    parser.add_argument(
        "--hf-config", metavar="PATH_OR_JSON",
        help="answer each distinct layer problem of a Hugging Face model config (config.json path, "
        "its directory, or a JSON string), by default at batch_size 1, seqlen_q = seqlen_kv = "
        "min(max_position_embeddings, 4096) (an encoder's own length: patches + class token for ViT), "
        "training, the config's torch_dtype (bf16 when it names no fused dtype); --set changes them, each "
        "field on its own (e.g. --set seqlen_q=8192 --set seqlen_kv=8192 --set is_training=false)",
    )
    parser.add_argument(
        "--set", action="append", metavar="KEY=VALUE",
        help="set an AttnConfig field (YAML value), on top of every entry; alone, builds one problem",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    depth = parser.add_mutually_exclusive_group()  # one depth per question: never drop one silently
    depth.add_argument("--full", action="store_true", help="probe depth 'full': also build the kernels (from a snapshot, only answers "
                       "recorded at depth full say yes; a fast-recorded yes is no data)")
    depth.add_argument("--verify", action="store_true", help="probe depth 'verify': also run the graphs twice on "
                       "seeded data against a float32 reference (needs torch; see docs/verify.md)")
    parser.add_argument("--alternatives", type=_count, default=alternatives.DEFAULT_LIMIT, metavar="N",
                        help="for each refused NONE, list up to N supported problems one or two fields away, asked "
                        f"through the same engine (default {alternatives.DEFAULT_LIMIT}; 0: none). On a GPU each such "
                        "NONE costs extra graph probes, up to --alternatives-max-probes; see docs/alternatives.md")
    parser.add_argument("--alternatives-max-probes", type=_count, default=alternatives.DEFAULT_MAX_PROBES,
                        metavar="N", help="spend at most N graph probes (each pass of each graph form a candidate "
                        "needs; from a snapshot, recorded rows read) on each NONE's alternatives "
                        f"(default {alternatives.DEFAULT_MAX_PROBES}; 0: none)")
    engines.add_source_options(parser)
    parser.add_argument("--platform", choices=("cuda", "rocm"), default="cuda",
                        help="cuda (default): live cuDNN or snapshots; rocm: AMD declared capability tables "
                        "(declared, not probed)")
    parser.add_argument("--arch", metavar="GFX", help="with --platform rocm: the AMD GPU target, e.g. gfx942 "
                        "(default: this machine's first AMD GPU)")
    parser.set_defaults(func=_cmd_why)
