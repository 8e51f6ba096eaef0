"""`native build|status`: build the optional compiled lean path, or say whether it is built and used."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fusedattn_select.cli.exit_codes import EXIT_NOT_DONE, EXIT_SELECTED
from fusedattn_select.cli.table import render_table
from fusedattn_select.runtime.native import autobuild

EPILOG = ("exit codes: 0 built (build: and tested); 1 not built, or built where others could change it or "
          "against cuDNN headers the cuDNN loaded cannot run (newer, another major, or none loaded) (never "
          "loaded): the reason is on stderr; 2 bad input (an invalid "
          "FUSEDATTN_SELECT_NATIVE); 130 interrupted; 141 stdout closed by its reader")


def _cmd_native(args: argparse.Namespace) -> int:
    from fusedattn_select.runtime import native

    if args.action == "build":
        try:
            path = native.build(verbose=args.verbose >= 2, background=args.background)
        except native.NativeBuildError as err:
            print(f"error: native build: {err}", file=sys.stderr)
            return EXIT_NOT_DONE
        except OSError as err:  # its directory (or lock file) cannot be made or written here
            print(f"error: native build: cannot build in {native.build_dir()} ({type(err).__name__}: {err}); "
                  f"set {native.DIR_ENV} to a directory of yours", file=sys.stderr)
            return EXIT_NOT_DONE
        except ImportError as err:  # the module's name holds torch's build, so naming it imports torch
            needs = " (the compiled path extends torch: pip install 'fusedattn-select[torch]')" if (
                (err.name or "").split(".")[0] == "torch") else ""
            print(f"error: native build: {type(err).__name__}: {err}{needs}", file=sys.stderr)
            return EXIT_NOT_DONE
        print(f"built and tested {path}")
        if not native.enabled():
            print(f"note: {native.ENV_VAR}=0 keeps calls on the Python path", file=sys.stderr)
        return EXIT_SELECTED
    info = native.status()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(render_table(None, info.items()))
    if not info.get("built"):
        print(f"native: not built{': ' + info['problem'] if info.get('problem') else ''} "
              "(`fusedattn-select native build` builds it)", file=sys.stderr)
        return EXIT_NOT_DONE
    if info.get("refused"):
        print(f"native: built but never loaded: {info['refused']} (chmod 700 it and the directories up to "
              f"{info['dir']})", file=sys.stderr)
        return EXIT_NOT_DONE
    if info.get("cudnn_mismatch"):  # built against cuDNN headers the library this process loads cannot run
        print(f"native: {info['problem']} (the module is named by the installed headers: load a cuDNN of their "
              "major version and as new, or install the headers of the cuDNN loaded, then `native build`)",
              file=sys.stderr)
        return EXIT_NOT_DONE
    return EXIT_SELECTED


def register_native(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("native", parents=[common], epilog=EPILOG,
                                   help="build the optional compiled hot path, or show whether it is built")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = actions.add_parser("build", parents=[common], epilog=EPILOG,
                               help="compile and test the module for this torch and cudnn-frontend (about a minute)")
    # Hidden: the build a background build starts (native.build's `background`).
    build.add_argument(autobuild.BACKGROUND_FLAG, dest="background", action="store_true", help=argparse.SUPPRESS)
    status = actions.add_parser("status", parents=[common], epilog=EPILOG,
                                help="whether the module for this torch and frontend is built and used")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=_cmd_native)
