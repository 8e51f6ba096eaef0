"""`cache info|clear|export|import`: inspect or manage the persistent decision and plan store."""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable

from fusedattn_select.cli.exit_codes import EXIT_SELECTED
from fusedattn_select.cli.table import render_table
from fusedattn_select.store import Store, open_default_store


def _info(store: Store, args: argparse.Namespace) -> None:
    info = store.info()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print(render_table(None, info.items()))


def _clear(store: Store, args: argparse.Namespace) -> None:
    before = store.info()
    store.clear()
    print(f"cleared {before['entries']} decisions and {before['plans']} plans "
          f"from {before['path'] or 'the memory store'}")


def _export(store: Store, args: argparse.Namespace) -> None:
    print(json.dumps(store.export(args.file), indent=2, default=str))


def _import(store: Store, args: argparse.Namespace) -> None:
    print(json.dumps(store.import_(args.file).to_dict(), indent=2, default=str))


ACTIONS: dict[str, Callable[[Store, argparse.Namespace], None]] = {
    "info": _info, "clear": _clear, "export": _export, "import": _import,
}


def _cmd_cache(args: argparse.Namespace) -> int:
    ACTIONS[args.action](open_default_store(), args)
    return EXIT_SELECTED


def register_cache(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("cache", parents=[common], help="inspect or manage the persistent cache")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = actions.add_parser("info", parents=[common], help="where the cache is and what it holds")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    actions.add_parser("clear", parents=[common], help="remove every decision and plan")
    export = actions.add_parser("export", parents=[common], help="write the cached decisions and plans to FILE")
    export.add_argument("file", metavar="FILE")
    load = actions.add_parser("import", parents=[common], help="add decisions and plans from an exported FILE")
    load.add_argument("file", metavar="FILE")
    parser.set_defaults(func=_cmd_cache)
