"""`cache info|clear|export|import|repair`: inspect or manage the persistent store of decisions, plans
and runner choices.

Commands that only look (info, export) open the store read-only: they create, write and move
nothing. Each action's exit code says whether it did what it was asked (see EPILOG).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Callable

from fusedattn_select.cli import engines
from fusedattn_select.cli.exit_codes import EXIT_BAD_INPUT, EXIT_NOT_DONE, EXIT_SELECTED
from fusedattn_select.cli.store_status import cannot_write, is_degraded, not_persisted, store_info, store_problems
from fusedattn_select.cli.table import render_table
from fusedattn_select.store import CacheError, PersistentStore, Store, open_default_store
from fusedattn_select.store.store_settings import check_cache_switch
from fusedattn_select.store.transfer import export_fingerprints, export_to_stream

READ_ONLY_ACTIONS = ("info", "export")
EPILOG = (
    "exit codes: 0 done (repair: the file is sound, or was repaired); 1 not done or not all done: the "
    "persistent cache cannot be used or is turned off (import: unless --memory-ok) or its file cannot be "
    "written (import too with --memory-ok: the rows would go to that file), clear or repair "
    "failed (one error line says why), import skipped rows (listed on stderr: damaged or edited rows, "
    "rows of another fingerprint, rows evicted by its own later rows to stay within "
    "FUSEDATTN_SELECT_CACHE_MAX_BYTES), export left out the plans the cache holds (plans refused there), "
    "info found the cache degraded or damaged; 2 bad input: a file that "
    "is not an export, an export that cannot be written there, an import with no live device and no "
    "--fingerprint, an invalid FUSEDATTN_SELECT_CACHE; 130 interrupted; 141 stdout closed by its reader"
)
ALL_FINGERPRINTS = "all"
STDOUT = "-"  # `cache export -` writes the export to stdout (a file named - is ./-)


def _info(store: Store, args: argparse.Namespace) -> int:
    info = store_info(store)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print("\n".join([render_table(None, info.items()), *store_problems(info)]))
    return EXIT_NOT_DONE if is_degraded(info) else EXIT_SELECTED


def _refusal(store: Store, what: str, memory_ok: bool = False) -> int:
    """EXIT_NOT_DONE, with the reason on stderr, when `what` would write into `store` and the writes would
    fail, or (unless `memory_ok`) would not outlive this command."""
    info = store.info()
    reason = cannot_write(info) or ("" if memory_ok else not_persisted(info))
    if not reason:
        return EXIT_SELECTED
    # --memory-ok keeps an import in memory where no persistent file is in use; with one, the rows go
    # to that file, whose every save fails.
    hint = "; --memory-ok does not help: the rows would go to that file" if memory_ok else ""
    print(f"error: cache {what}: {reason}{hint}; nothing was done", file=sys.stderr)
    return EXIT_NOT_DONE


def _clear(store: Store, args: argparse.Namespace) -> int:
    before = store.info()
    try:
        store.clear()
    except CacheError as err:
        print(f"error: cache clear: {err}", file=sys.stderr)
        return EXIT_NOT_DONE
    print(f"cleared {before['entries']} decisions, {before['plans']} plans and {before.get('runner_choices', 0)} "
          f"runner choices from {before['path']}")
    return EXIT_SELECTED


def _repair(store: Store, args: argparse.Namespace) -> int:
    if not isinstance(store, PersistentStore):  # _cmd_cache refused a store that is not persistent
        print(f"error: cache repair: no database file to repair ({store.kind} store)", file=sys.stderr)
        return EXIT_NOT_DONE
    try:
        print(store.repair())
    except CacheError as err:
        print(f"error: cache repair: {err}", file=sys.stderr)
        return EXIT_NOT_DONE
    return EXIT_SELECTED


def _export(store: Store, args: argparse.Namespace) -> int:
    info = store.info()
    reason = not_persisted(info)  # (export only reads: a file it cannot write is exported)
    if reason:
        print(f"error: cache export: {reason}; nothing was done", file=sys.stderr)
        return EXIT_NOT_DONE
    if args.file != STDOUT:
        print(json.dumps(store.export(args.file), indent=2, default=str))
        return _plans_withheld(info)
    if sys.stdout is None:  # started with stdout closed (`>&-`): nowhere to write it
        print("error: cache export: FILE='-': stdout is closed; name a file", file=sys.stderr)
        return EXIT_BAD_INPUT
    # stdout carries the export itself (`cache export - | ssh host ...`): the counts go to stderr.
    counts = export_to_stream(store, sys.stdout)  # type: ignore[arg-type]  # both stores are transfer.Transferable
    print(f"cache export: wrote {counts['verdicts']} decisions, {counts['plans']} plans and "
          f"{counts['runner_choices']} runner choices to stdout", file=sys.stderr)
    return _plans_withheld(info)


def _plans_withheld(info: dict[str, Any]) -> int:
    """EXIT_NOT_DONE, saying why, when the store holds plans that an export leaves out because plans
    are refused there (anyone who can write the directory may have planted them); else EXIT_SELECTED."""
    if not (info.get("plans_refused") and info.get("plans")):
        return EXIT_SELECTED
    print(f"error: cache export: {info['plans']} plans were not exported: {info['plans_refused']} (plans load "
          "native code); the decisions and runner choices were", file=sys.stderr)
    return EXIT_NOT_DONE


def _fingerprint_key(text: str) -> str:
    """argparse type for --fingerprint: a fingerprint key (either case: keys are stored in lower case) or 'all'."""
    key = text.strip().lower()
    if key == ALL_FINGERPRINTS or re.fullmatch(r"[0-9a-f]{32}", key):
        return key
    raise argparse.ArgumentTypeError(
        f"{text!r}: must be a fingerprint key (32 hex digits, either case: the keys of the export file's "
        f"\"fingerprints\") or {ALL_FINGERPRINTS!r}")


def _fingerprint_to_import(args: argparse.Namespace) -> tuple[str | None, str]:
    """(the fingerprint key whose rows are imported, or None for every one, "") or (None, why this
    machine's fingerprint is unknown) when --fingerprint was not given and no live device answers."""
    if args.fingerprint == ALL_FINGERPRINTS:
        return None, ""
    if args.fingerprint:
        return args.fingerprint, ""
    # This machine's fingerprint is its live device's; snapshots describe other machines.
    engine, reason = engines.live_engine()
    if engine is None:
        return None, reason
    return engine.fingerprint().key(), ""


def _import(store: Store, args: argparse.Namespace) -> int:
    held = export_fingerprints(args.file)  # CacheError (exit 2) when the file is not an export
    only, unknown = _fingerprint_to_import(args)
    if unknown and held:
        listing = "; ".join(f"{key} ({description})" for key, description in held.items())
        print(f"error: cache import: no live CUDA device tells this machine's fingerprint ({unknown}); pass "
              f"--fingerprint KEY to import the rows of one fingerprint of {args.file} ({listing}), or "
              f"--fingerprint {ALL_FINGERPRINTS}", file=sys.stderr)
        return EXIT_BAD_INPUT
    reason = not_persisted(store.info())
    report = store.import_(args.file, only)
    if reason:
        print(f"cache import: --memory-ok: imported into this process's memory only: {reason}", file=sys.stderr)
    print(json.dumps({"fingerprint": only or ALL_FINGERPRINTS, **report.to_dict()}, indent=2, default=str))
    if not report.skipped:
        return EXIT_SELECTED
    total = report.imported + len(report.skipped)
    print(f"cache import: skipped {len(report.skipped)} of {total} rows of {args.file}:", file=sys.stderr)
    for row, why in report.skipped:
        print(f"  {row}: {why}", file=sys.stderr)
    others = sorted(set(held) - {only}) if only is not None else []
    if others:
        chosen = "this machine's" if args.fingerprint is None else "the one named"
        print(f"cache import: rows of other fingerprints than {only} ({chosen}) were not imported; "
              f"--fingerprint KEY ({', '.join(others)}) or --fingerprint {ALL_FINGERPRINTS} imports them",
              file=sys.stderr)
    return EXIT_NOT_DONE


ACTIONS: dict[str, Callable[[Store, argparse.Namespace], int]] = {
    "info": _info, "clear": _clear, "export": _export, "import": _import, "repair": _repair,
}


def _cmd_cache(args: argparse.Namespace) -> int:
    check_cache_switch()
    looking = open_default_store(read_only=True)  # quiet: the refusal below says why, once
    if args.action in READ_ONLY_ACTIONS:
        return ACTIONS[args.action](looking, args)
    memory_ok = args.action == "import" and args.memory_ok
    if _refusal(looking, args.action, memory_ok):
        return EXIT_NOT_DONE
    store = open_default_store()
    if _refusal(store, args.action, memory_ok):  # it failed since it was looked at
        return EXIT_NOT_DONE
    return ACTIONS[args.action](store, args)


def register_cache(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("cache", parents=[common], epilog=EPILOG,
                                   help="inspect or manage the persistent cache")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = actions.add_parser("info", parents=[common], epilog=EPILOG,
                              help="where the cache is, what it holds, and what is wrong with it")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    actions.add_parser("clear", parents=[common], epilog=EPILOG, help="remove every decision, plan and runner choice")
    export = actions.add_parser("export", parents=[common], epilog=EPILOG,
                                help="write the cached decisions, plans and runner choices to FILE")
    export.add_argument("file", metavar="FILE", help="the export file to write; - writes it to stdout (the "
                        "counts then go to stderr; ./- names a file called -)")
    load = actions.add_parser("import", parents=[common], epilog=EPILOG,
                              help="add decisions, plans and runner choices from an exported FILE")
    load.add_argument("file", metavar="FILE")
    load.add_argument("--fingerprint", type=_fingerprint_key, metavar="KEY|all",
                      help="import the rows of this fingerprint key only, or of every fingerprint (all); "
                      "default: this machine's (its live CUDA device's); needed where no live device answers")
    load.add_argument("--memory-ok", action="store_true",
                      help="import even when the persistent cache cannot be used (into this process's memory)")
    actions.add_parser("repair", parents=[common], epilog=EPILOG,
                       help="check the database file and, when it is damaged, salvage every readable row")
    parser.set_defaults(func=_cmd_cache)
