"""The parser, logging and error handling every command shares; `main` runs one command."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import select
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from fusedattn_select import settings
from fusedattn_select._version import __version__
from fusedattn_select.cli.exit_codes import EPILOG, EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_INTERRUPTED
from fusedattn_select.errors import FusedAttnSelectError

if TYPE_CHECKING:  # the modules COMMANDS names, for readers and the import-graph test
    from fusedattn_select.cli import cache, info, matrix, native, snapshot_command, warmup_command, why  # noqa: F401

log = logging.getLogger("fusedattn_select")

# Each subcommand adds itself (its parser and its `func`) through one `register_*` function of its
# module, named here: only the module of the command asked for is imported (every module's imports
# together cost a `why` on a CPU machine about a fifth of its time); --help and a mistyped command
# import them all.
Register = Callable[[Any, argparse.ArgumentParser], None]
COMMANDS: dict[str, tuple[str, str]] = {
    "why": ("fusedattn_select.cli.why", "register_why"),
    "info": ("fusedattn_select.cli.info", "register_info"),
    "snapshot": ("fusedattn_select.cli.snapshot_command", "register_snapshot"),
    "warmup": ("fusedattn_select.cli.warmup_command", "register_warmup"),
    "cache": ("fusedattn_select.cli.cache", "register_cache"),
    "matrix": ("fusedattn_select.cli.matrix", "register_matrix"),
    "native": ("fusedattn_select.cli.native", "register_native"),
}


def _command_asked(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names: its first argument that is not an option (no option before the
    subcommand takes a value), where that is one of COMMANDS."""
    for arg in argv:
        if arg in ("--", "-h", "--help"):  # (help before the command lists every command)
            return None
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of `only` that one."""
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
    for name, (module, function) in COMMANDS.items():
        if only is None or name == only:
            register: Register = getattr(importlib.import_module(module), function)
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


def _stdout_closed() -> bool:
    """Whether stdout's reader has gone (`| head` exited): the pipe polls as an error. True where
    that cannot be asked (no poll, no file descriptor): stdout is then the likeliest broken pipe."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit finds no closed pipe
    (it would print "Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass  # no file descriptor (an in-process caller's capture): nothing is flushed at exit


class OutputError(OSError):
    """stdout could not be written (a full disk, /dev/full, an I/O error): not a broken pipe."""


class _GuardedStdout:
    """sys.stdout while a command runs: a write or flush that fails raises OutputError, so that it is
    told apart from any other OSError (a file the command writes); everything else is the stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _guard(self, action: Callable[..., Any], *args: Any) -> Any:
        try:
            return action(*args)
        except BrokenPipeError:
            raise  # its reader went away: main ends quietly
        except OutputError:
            raise
        except OSError as err:
            raise OutputError(err.errno, err.strerror or str(err)) from err

    def write(self, text: str) -> int:
        return self._guard(self._stream.write, text)

    def writelines(self, lines: Any) -> None:
        self._guard(self._stream.writelines, lines)

    def flush(self) -> None:
        self._guard(self._stream.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _guarded_stdout() -> Iterator[None]:
    original = sys.stdout
    if original is None:  # started with stdout closed (`>&-`): print() writes nothing
        yield
        return
    sys.stdout = _GuardedStdout(original)
    try:
        yield
    finally:
        sys.stdout = original


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser(_command_asked(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse printed the usage error (or --help) already
        return exit_.code if isinstance(exit_.code, int) else EXIT_BAD_INPUT
    with _logging(args.verbose):
        try:
            # Every setting is checked before any work; info reports an invalid one among its facts instead,
            # and warmup checks them with its inputs (under torchrun a refusing rank tells the others first).
            if args.command not in ("info", "warmup"):
                settings.check_all()
            for note in settings.unknown_variables():
                print(f"warning: {note}", file=sys.stderr)
            return args.func(args)
        except FusedAttnSelectError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see fusedattn_select.cli.exit_codes).

    A reader that closes stdout early (`| head`) ends the command quietly with EXIT_BROKEN_PIPE, as
    `git log | head` does: no traceback. stdout that cannot be written (a full disk) is one
    `error: cannot write output: <reason>` line and EXIT_BAD_INPUT."""
    try:
        with _guarded_stdout():
            code = _run(argv)
            if sys.stdout is not None:  # (None: started with stdout closed, `>&-`; print() then writes nothing)
                sys.stdout.flush()  # inside the try: output still buffered fails here, not at exit
        return code
    except OutputError as err:  # a full disk, /dev/full: the answers were not given
        print(f"error: cannot write output: {err.strerror or err}", file=sys.stderr)
        _discard_stdout()
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe (a worker's) broke: a failure, not a reader that had enough
        _discard_stdout()
        return EXIT_BROKEN_PIPE
