"""`snapshot record`: probe every entry of suite files on this GPU and write a snapshot JSON."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from fusedattn_select.buckets import LADDER_MAX_BATCH, LADDER_MAX_SEQLEN, LADDER_REACH_LIMIT
from fusedattn_select.cli import engines
from fusedattn_select.cli.arguments import add_depth_option, positive_int
from fusedattn_select.cli.exit_codes import EXIT_NO_DATA, EXIT_NOT_DONE, EXIT_SELECTED
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import ConfigError, PlatformError, SnapshotError
from fusedattn_select.selection.recorder import Ladder, check_output, record_snapshot, summarize, write_snapshot
from fusedattn_select.types import ProbeDepth

_REACH = f"2**{LADDER_REACH_LIMIT.bit_length() - 1}"  # LADDER_REACH_LIMIT is a power of two

log = logging.getLogger("fusedattn_select")


def _log_progress(done: int, total: int, entry: dict) -> None:
    outcomes = ",".join(f"{v['phase']}:{v['outcome']}" for v in entry["verdicts"])
    if "bucket" in entry:  # a ladder's row: the class of entries[i] at one bucket
        bucket = entry["bucket"]
        what = (f"entries[{entry['entry']}] bucket B={bucket['batch']} S_q={bucket['seqlen_q']} "
                f"S_kv={bucket['seqlen_kv']}")
    else:
        what = f"{entry['suite']}:{entry['name']}"
    log.info("fusedattn_select: [%d/%d] %s %s", done, total, what, outcomes)


def _ladder_reach(text: str) -> int:
    """argparse type of --ladder-max-batch and --ladder-max-seqlen: 1 to LADDER_REACH_LIMIT, the largest
    bucket a ladder holds (rungs past it would be left out while the snapshot claimed them)."""
    value = positive_int(text)
    if value > LADDER_REACH_LIMIT:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at most {LADDER_REACH_LIMIT} ({_REACH}, the largest "
                                         "bucket a ladder holds: a larger one passes the int32 bound of a problem's "
                                         "sizes)")
    return value


def _ladder(args: argparse.Namespace) -> Ladder | None:
    """The ladder the options ask for; ConfigError when --no-ladder comes with an option of the ladder."""
    options = {"--ladder-max-batch": args.ladder_max_batch, "--ladder-max-seqlen": args.ladder_max_seqlen,
               "--ladder-depth": args.ladder_depth}
    given = {option: value for option, value in options.items() if value is not None}
    if args.no_ladder:
        if given:  # an option of a ladder that is not recorded would be ignored without a word
            option, value = next(iter(given.items()))
            raise ConfigError(option, value, "not allowed with --no-ladder, which records no ladder; drop "
                              f"--no-ladder or {' and '.join(given)}")
        return None
    return Ladder(given.get("--ladder-max-batch", LADDER_MAX_BATCH),
                  given.get("--ladder-max-seqlen", LADDER_MAX_SEQLEN), args.ladder_depth)


def _cmd_record(args: argparse.Namespace) -> int:
    depth = ProbeDepth.parse(args.depth, "--depth")
    ladder = _ladder(args)
    # Bad input fails before the device is touched: a recording takes minutes to hours.
    output = check_output(args.output, "--output")
    for path in args.suites:
        load_config_file(path)
    engine, reason = engines.live_engine()
    if engine is None:
        raise PlatformError(f"snapshot record needs a live CUDA device with cuDNN: {reason}")
    started = time.perf_counter()
    snapshot = record_snapshot(args.suites, engine, depth=depth, jobs=args.jobs, progress=_log_progress,
                               ladder=ladder)
    try:
        path = write_snapshot(snapshot, output, "--output")
    except SnapshotError as err:  # (a full disk, a folder gone) the recording ran: not done, not bad input
        print(f"error: {err}", file=sys.stderr)
        return EXIT_NOT_DONE
    counts = summarize(snapshot)
    groups = snapshot.get("buckets", [])
    rungs = sum(len(group["rungs"]) for group in groups)
    buckets = f" (and their classes' ladders: {len(groups)} groups, {rungs} rungs)" if ladder is not None else ""
    print(
        f"recorded {counts['entries']} entries ({counts['selected']} selected, {counts['none']} none, "
        f"{counts['failed']} failed) on {engine.fingerprint().describe()}{buckets} at depth {depth.value} "
        f"in {time.perf_counter() - started:.1f} s -> {path}"
    )
    if counts["failed"]:  # recorded as failed: those entries answer no data from this file
        print(f"warning: {counts['failed']} of the {counts['entries']} entries' probes failed (out of memory, a CUDA "
              "error): the snapshot holds no answer for them; record them again", file=sys.stderr)
        return EXIT_NO_DATA
    return EXIT_SELECTED


def register_snapshot(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("snapshot", parents=[common], help="record snapshots on a live device")
    actions = parser.add_subparsers(dest="snapshot_command", metavar="ACTION", required=True)
    record = actions.add_parser(
        "record", parents=[common],
        help="probe every entry of suite files on this GPU and write a snapshot JSON",
    )
    record.add_argument("suites", nargs="+", metavar="SUITE.yaml")
    record.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="snapshot JSON to write (checked before any probe; missing folders are created)")
    add_depth_option(record, default=ProbeDepth.FAST)
    record.add_argument("--jobs", type=positive_int, default=1, metavar="N", help="probe N entries at once")
    # The ladder options default to None, so that one given with --no-ladder is told apart and refused.
    record.add_argument("--ladder-max-batch", type=_ladder_reach, default=None, metavar="N",
                        help="record each problem class over its bucket ladder up to batch N "
                        f"(default {LADDER_MAX_BATCH}, at most {_REACH})")
    record.add_argument("--ladder-max-seqlen", type=_ladder_reach, default=None, metavar="N",
                        help=f"... and up to sequence length N (default {LADDER_MAX_SEQLEN}, at most {_REACH})")
    record.add_argument("--ladder-depth", choices=[d.value for d in ProbeDepth], default=None,
                        help="probe depth of the ladder's rungs (default: --depth); e.g. --depth full "
                        "--ladder-depth fast builds the entries' kernels and checks support at every rung")
    record.add_argument("--no-ladder", action="store_true",
                        help="record only the entries' own shapes (a CPU then answers no other shape); not allowed "
                        "with the --ladder-* options")
    record.set_defaults(func=_cmd_record)
