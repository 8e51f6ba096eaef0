"""The parser, logging and error handling every command shares; `main` runs one command."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from typing import Any, Callable, Iterator, Sequence

from fusedattn_select._version import __version__
from fusedattn_select.cli.cache import register_cache
from fusedattn_select.cli.exit_codes import EPILOG, EXIT_BAD_INPUT, EXIT_INTERRUPTED
from fusedattn_select.cli.info import register_info
from fusedattn_select.cli.matrix import register_matrix
from fusedattn_select.cli.native import register_native
from fusedattn_select.cli.snapshot import register_snapshot
from fusedattn_select.cli.warmup import register_warmup
from fusedattn_select.cli.why import register_why
from fusedattn_select.errors import FusedAttnSelectError
from fusedattn_select.store.settings import check_cache_switch

log = logging.getLogger("fusedattn_select")

# Each subcommand adds itself (its parser and its `func`) through one `register_*` function here.
Register = Callable[[Any, argparse.ArgumentParser], None]
COMMANDS: tuple[Register, ...] = (register_why, register_info, register_snapshot, register_warmup, register_cache,
                                  register_matrix, register_native)


def build_parser() -> argparse.ArgumentParser:
    # -v is accepted before and after the subcommand; SUPPRESS keeps a subcommand's default from
    # overwriting a -v given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="log to stderr: -v INFO, -vv DEBUG")
    parser = argparse.ArgumentParser(
        prog="fusedattn-select",
        description="Which fused attention backend (F16, FP8 or none) runs this problem on this GPU, "
        "from real cuDNN probes or snapshots recorded on real devices.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log to stderr: -v INFO, -vv DEBUG")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in COMMANDS:
        register(subparsers, common)
    return parser


@contextlib.contextmanager
def _logging(verbosity: int) -> Iterator[None]:
    if not verbosity:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    old_level = log.level
    log.setLevel(logging.INFO if verbosity == 1 else logging.DEBUG)
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see fusedattn_select.cli.exit_codes)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse printed the usage error (or --help) already
        return exit_.code if isinstance(exit_.code, int) else EXIT_BAD_INPUT
    with _logging(args.verbose):
        try:
            if args.command != "info":  # info reports an invalid switch among the other facts
                check_cache_switch()
            return args.func(args)
        except FusedAttnSelectError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
