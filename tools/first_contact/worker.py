"""The entry point of every measuring process: `python -m tools.first_contact.worker PART SIDE ARGS_JSON`.

It imports only the standard library before the part runs (rows 1 and 6 time the imports), answers
one MARKER line (processes.py) with the part's figures, "side" and "status", and for "ours" what
fusedattn_select.dispatch_info() and the compiled module's status say at the end. An exception ends
the process with its traceback on stderr: the parent records "failed: <its last line>".
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

# part -> "module:function", each function(side, args) -> dict
PART_FUNCTIONS = {
    "env": "tools.first_contact.worker:environment",
    "first_calls": "tools.first_contact.kernels:first_calls",
    "first_step": "tools.first_contact.kernels:first_step",
    "big_shape": "tools.first_contact.kernels:big_shape",
    "generate": "tools.first_contact.models:generate",
    "finetune": "tools.first_contact.models:finetune",
    "native_serve": "tools.first_contact.models:native_serve",
}


def part_function(part: str) -> Callable[[str, Mapping[str, Any]], dict]:
    """The function that measures `part` (ValueError naming the parts for an unknown one)."""
    if part not in PART_FUNCTIONS:
        raise ValueError(f"part={part!r}: must be one of {', '.join(PART_FUNCTIONS)}")
    module, name = PART_FUNCTIONS[part].split(":")
    return getattr(importlib.import_module(module), name)


def environment(side: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The device and versions: tools/bench/environment's record, and transformers' version."""
    import torch

    from tools.bench.common import Partial
    from tools.bench.environment import standalone_record, worker

    found = Partial(None)
    worker({}, found)
    out: dict[str, Any] = dict(found)
    try:
        out.update(standalone_record(torch))
    except Exception as err:  # noqa: BLE001 - no CUDA device: the rest of the record stands
        out["record_error"] = f"{type(err).__name__}: {err}"
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError as err:
        out["transformers"] = f"not importable: {err}"
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        raise SystemExit("usage: python -m tools.first_contact.worker PART SIDE ARGS_JSON")
    part, side, args = argv[0], argv[1], json.loads(argv[2])
    result = part_function(part)(side, args)
    result.update(side=side, status=result.get("status", "ok"))
    if side == "ours":
        from tools.first_contact.sides import dispatch_record

        result.update(dispatch_record())
    from tools.first_contact.processes import emit

    emit(result)


if __name__ == "__main__":
    main()
