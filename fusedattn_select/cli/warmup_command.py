"""`warmup`: answer (and with --depth full, build) every entry of config files now, into the cache."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, TextIO

from fusedattn_select import settings
from fusedattn_select.cli import engines, warmup_job
from fusedattn_select.cli.arguments import add_depth_option, positive_int
from fusedattn_select.cli.exit_codes import (
    EPILOG,
    EXIT_BAD_INPUT,
    EXIT_NOT_DONE,
    EXIT_NOT_PERSISTED,
    answers_exit_code,
)
from fusedattn_select.cli.store_status import cannot_write, not_persisted
from fusedattn_select.cli.table import render_table
from fusedattn_select.config import AttnConfig
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import FusedAttnSelectError
from fusedattn_select.probing import SNAPSHOT_ENV
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.local_warmup import WORKERS, WarmupOutcome, WarmupReport, warmup
from fusedattn_select.selection.selector import Selector, default_selector
from fusedattn_select.store.store_settings import check_cache_switch
from fusedattn_select.torchrun_env import DEFAULT_TIMEOUT_S, Ranks, torchrun_ranks
from fusedattn_select.types import Outcome, ProbeDepth, Provenance

REPORT_HEADER = ("name", "backend", "outcome", "seconds", "answer", "reason")
PROGRESS_BAR_WIDTH = 30
NO_DATA = Outcome.NO_DATA.value


def format_report(report: WarmupReport, answered: str = "probed", no_data: frozenset[str] = frozenset()) -> str:
    """One line per problem (seconds right-aligned), then the summary line.

    `answered` is what answering a new problem was ("probed", or "replayed" from a snapshot);
    `no_data` holds the cache keys of rejected rows that are NONE for want of data.
    """
    rows = [
        (
            row.name + (f" (= {', '.join(row.also_named)})" if row.also_named else ""),
            row.backend.value,
            NO_DATA if row.cache_key in no_data else row.outcome.value,
            f"{row.seconds:.3f}",
            "cached" if row.from_cache else answered,
            row.reason,
        )
        for row in report.rows
    ]
    summary = report.summary()
    if no_data:
        summary += f"; {len(no_data)} of the rejected have no data (only a live probe can answer them)"
    return render_table(REPORT_HEADER, rows, align="lllr") + "\n" + summary


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


def _selector(args: argparse.Namespace) -> Selector:
    """The selector named by --snapshot/--target, else the process's."""
    if args.snapshot or args.target:
        return engines.choose_selector(args.snapshot, args.target)[0]
    return default_selector()


def _cannot_warm(args: argparse.Namespace, selector: Selector) -> str:
    """Why warmup cannot do what it was asked with `selector` ("" when it can).

    Asked for no snapshots, warmup is asked to probe, build and store: a process selector that
    answers from the bundled snapshots (no device here) would store nothing, so that is refused
    as a missing engine is; --memory-ok does not change this (there is nothing to keep in memory)."""
    engine = selector.engine
    replay_asked = bool(args.snapshot or args.target or os.environ.get(SNAPSHOT_ENV))
    if engine is None or (engine.provenance is not Provenance.LIVE_PROBE and not replay_asked):
        return (f"warmup needs a CUDA device with cuDNN, or snapshots (--target, --snapshot or {SNAPSHOT_ENV}): "
                f"{selector.unavailable_reason}")
    return "" if args.memory_ok else _lost_at_exit(selector)


def _workers(args: argparse.Namespace, engine: SnapshotEngine | None, speaks: bool = True) -> str:
    if engine is not None and args.workers == "processes":
        # Replaying a snapshot is a dictionary lookup: there is nothing to build in parallel.
        if speaks:
            print(f"--workers processes: answers are replayed from {engine.file_names}, nothing is built; "
                  "using threads", file=sys.stderr)
        return "threads"
    return args.workers


def _no_data_keys(selector: Selector, report: WarmupReport, configs: dict[str, AttnConfig],
                  depth: ProbeDepth) -> frozenset[str]:
    # A rejected answer is in the selector's memory: asking again is a cache hit, not a probe.
    return frozenset(
        row.cache_key for row in report.rows
        if row.outcome is WarmupOutcome.REJECTED and selector.select(configs[row.cache_key], depth).no_data
    )


def _json(report: WarmupReport, selector: Selector, snapshot: SnapshotEngine | None, no_data: frozenset[str],
          agreement: dict | None = None) -> str:
    """The report as JSON; under torchrun with `agreement`, what the ranks agreed (AgreementReport.to_dict)."""
    document = report.to_dict()
    for row in document["rows"]:
        if row["cache_key"] in no_data:
            row["outcome"] = NO_DATA
    document["totals"][NO_DATA] = len(no_data)
    document["engine"] = selector.engine_name
    document["notice"] = selector.notice or None
    document["replayed_from"] = [f.path for f in snapshot.files] if snapshot is not None else None
    if agreement is not None:
        document["agreement"] = agreement
    return json.dumps(document, indent=2)


def _lost_at_exit(selector: Selector) -> str:
    """Why the answers a live warmup stores would not outlive this command ("" when they would).

    Snapshot answers are never stored (the output says so); a selector built without a store keeps
    its answers in memory by its maker's choice."""
    engine, store = selector.engine, selector.store
    if engine is None or engine.provenance is not Provenance.LIVE_PROBE or store is None:
        return ""
    info = store.info()
    reason = cannot_write(info) or not_persisted(info)
    return (f"warmup would keep its decisions and plans in memory, lost when it exits: {reason} "
            "(pass --memory-ok to warm this process anyway)") if reason else ""


def _inputs(args: argparse.Namespace) -> tuple[ProbeDepth, list[tuple[str, AttnConfig]]]:
    """The depth and the named problems of the config files; ConfigError naming what is wrong (a setting
    too: every command checks them before it starts, warmup here)."""
    settings.check_all()
    check_cache_switch()
    depth = ProbeDepth.parse(args.depth, "--depth")
    problems = []
    for path in args.configs:
        config_file = load_config_file(path)
        problems += [(f"{config_file.name}/{entry.name}", entry.config) for entry in config_file.entries]
    return depth, problems


def _cmd_warmup(args: argparse.Namespace) -> int:
    replay = bool(args.snapshot or args.target)
    # torchrun's variables first: a bad one stops the command before anything is imported or probed.
    ranks = torchrun_ranks(os.environ, rendezvous=not replay)
    if ranks.size > 1 and not replay:
        return _torchrun_warmup(args, ranks)
    depth, problems = _inputs(args)
    selector = _selector(args)
    refusal = _cannot_warm(args, selector)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return EXIT_NOT_DONE
    snapshot = selector.engine if isinstance(selector.engine, SnapshotEngine) else None
    if ranks.size > 1 and snapshot is not None:
        mismatch, found_by_all = warmup_job.replay_mismatch(ranks, os.environ, {
            "digest": warmup_job.replay_digest(snapshot, problems, depth), "snapshots": snapshot.file_names,
        }, args.timeout)
        if mismatch:
            if ranks.rank == 0 or not found_by_all:
                print(f"error: warmup: {mismatch}", file=sys.stderr)
            return EXIT_BAD_INPUT if found_by_all else EXIT_NOT_DONE
    # A replay under torchrun forms no process group (nothing is probed, built or stored, so there
    # is nothing to share): every rank replays the same snapshots and rank 0 speaks for the job.
    speaks = ranks.rank == 0
    if selector.notice and speaks:
        print(selector.notice, file=sys.stderr)
    report = warmup(problems, jobs=args.jobs, depth=depth, selector=selector,
                    progress=None if args.json or not speaks else progress_bar(),
                    workers=_workers(args, snapshot, speaks))
    no_data = _no_data_keys(selector, report, {cfg.cache_key(): cfg for _, cfg in problems}, depth)
    if speaks:
        _print_report(args, report, selector, snapshot, no_data)
    return _exit_code(report, no_data, selector)


def _torchrun_warmup(args: argparse.Namespace, ranks: Ranks) -> int:
    """This rank's part of a shared warmup; ends the process once it left the job.

    A rank that cannot warm (bad input, no engine, a store that would not keep the answers) prints its
    `error:` line, then still joins the job and says its reason at the warmup's first exchange: every
    other rank's error names it and why, at once, instead of a rank that went missing or never joined.
    It exits with its own code (2 for bad input, else 1); the others exit 1."""
    refusal, code = "", EXIT_NOT_DONE
    try:
        depth, problems = _inputs(args)
    except FusedAttnSelectError as err:
        refusal, code = str(err), EXIT_BAD_INPUT
        print(f"error: {refusal}", file=sys.stderr)
    # Before the selector: a rank uses GPU LOCAL_RANK. Quiet when refusing: its own line says why.
    distributed = warmup_job.join_job(ranks, args.timeout, quiet=bool(refusal))
    if distributed is None:
        return code
    # The job's process groups are destroyed before the command ends, whatever happened.
    if not refusal:
        try:
            selector = _selector(args)
            refusal = _cannot_warm(args, selector)
        except FusedAttnSelectError as err:
            refusal, code = str(err), EXIT_BAD_INPUT
        except Exception as err:  # noqa: BLE001 - an engine that fails to start: told to every rank, exit 1
            refusal = f"{type(err).__name__}: {' '.join(str(err).split())}"
        if refusal:
            print(f"error: {refusal}", file=sys.stderr)
    if refusal:
        warmup_job.refuse(distributed, refusal, args.timeout)
    else:
        code = _shared_warmup(args, distributed, selector, problems, depth)
    left = warmup_job.leave_job(distributed.group, args.timeout)
    if left:
        # The answers were agreed and saved: their code stands; leaving is what failed.
        print(f"warning: warmup: rank {ranks.rank} could not leave the job cleanly: {left}", file=sys.stderr)
    warmup_job.exit_now(code)


def _shared_warmup(args: argparse.Namespace, distributed: Any, selector: Selector, problems: list,
                   depth: ProbeDepth) -> int:
    """Warm `problems` with the other ranks; the lowest rank prints the report the ranks agreed.
    The exit code is the agreed answers', the same on every rank."""
    try:
        shared = distributed.warmup(problems, depth=depth, selector=selector, jobs=args.jobs, timeout=args.timeout)
    except distributed.DistributedError as err:
        print(f"error: warmup: {err}", file=sys.stderr)
        return EXIT_NOT_DONE
    report, no_data, agreement = warmup_job.agreed_report(shared)
    if shared.rank == min(shared.ranks):  # one report per job: the lowest rank's
        if selector.notice:
            print(selector.notice, file=sys.stderr)
        snapshot = selector.engine if isinstance(selector.engine, SnapshotEngine) else None
        _print_report(args, report, selector, snapshot, no_data, agreement)
    return _exit_code(report, no_data, selector)


def _print_report(args: argparse.Namespace, report: WarmupReport, selector: Selector, snapshot: SnapshotEngine | None,
                  no_data: frozenset[str], agreement: dict | None = None) -> None:
    if args.json:
        print(_json(report, selector, snapshot, no_data, agreement))
        return
    text = format_report(report, "replayed" if snapshot is not None else "probed", no_data)
    if snapshot is not None:
        text += (f"\nreplayed from {snapshot.file_names} (recorded on {snapshot.describe()}): "
                 "nothing was probed, built or stored; seconds are this machine's lookups")
    print(text)


def _exit_code(report: WarmupReport, no_data: set, selector: Selector) -> int:
    """The answers' exit code, unless saves failed: then EXIT_NOT_PERSISTED, with one error line (the
    warmup's purpose, answers that outlive it, was not met; the report still gives every answer)."""
    if report.failed_saves:
        reason = selector.store.info().get("write_failure") if selector.store is not None else None
        print(f"error: warmup: {report.failed_saves} saves of answers and plans to {report.store_path or 'the store'} "
              f"failed ({reason or 'the warning above says why'}): they last only as long as this command",
              file=sys.stderr)
        return EXIT_NOT_PERSISTED
    # A failed probe (out of memory, or one that raised) is no answer, as why and matrix count it: 3, not 1.
    return answers_exit_code([row.outcome is WarmupOutcome.ACCEPTED for row in report.rows],
                             [row.cache_key in no_data or row.outcome is WarmupOutcome.FAILED for row in report.rows])


def positive_seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive number of seconds")
    return value


def register_warmup(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "warmup", parents=[common], epilog=EPILOG,
        help="answer (and with --depth full, build) every entry of config files now, into the cache",
    )
    parser.add_argument("configs", nargs="+", metavar="CONFIG.yaml")
    parser.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                        help="problems probed at once (default: min(8, CPUs))")
    add_depth_option(parser, default=ProbeDepth.FULL)
    parser.add_argument(
        "--workers", choices=WORKERS, default="threads",
        help="run the --jobs builds on threads (default) or in worker processes sharing the "
        "persistent store (cuDNN builds hold the GIL, so processes build in parallel); answers "
        "replayed from snapshots always use threads",
    )
    engines.add_source_options(parser)
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="under torchrun: how long a rank waits for the others, to join the job (rank 0's "
                        f"address included), at each exchange and to leave (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--memory-ok", action="store_true",
                        help="warm even when the persistent cache cannot be used or is off (the answers "
                        "then last only as long as this command; without it, that exits 1)")
    parser.set_defaults(func=_cmd_warmup)
