"""`info`: versions, GPU, cuDNN, cache location and state, and bundled snapshots; works with no GPU,
no cuDNN and no torch. It only looks: the cache is opened read-only (nothing is created or moved)."""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from typing import Any

from fusedattn_select import settings
from fusedattn_select._version import __version__
from fusedattn_select.cli import engines
from fusedattn_select.cli.exit_codes import EXIT_SELECTED
from fusedattn_select.cli.store_status import describe_plans, describe_store, store_info
from fusedattn_select.cli.table import render_table
from fusedattn_select.errors import ConfigError, SnapshotError
from fusedattn_select.probing import SNAPSHOT_ENV, TARGETS
from fusedattn_select.probing.rocm import detect_rocm_device
from fusedattn_select.probing.snapshot import read_header
from fusedattn_select.store import CACHE_SWITCH_ENV, default_cache_dir, open_default_store
from fusedattn_select.store.store_settings import cache_switch_problem
from fusedattn_select.types import format_cudnn_version

DEVICE_FACTS = ("probing_engine", "gpu", "compute_capability", "sm_count", "driver", "cudnn_backend")
LABELS = {
    "fusedattn_select": "fusedattn-select", "probing_engine": "probing engine", "gpu": "GPU",
    "compute_capability": "compute capability", "sm_count": "SM count", "driver": "driver",
    "cudnn_backend": "cuDNN backend", "cudnn_frontend": "cuDNN frontend", "cache_dir": "cache directory",
    "rocm": "ROCm devices", "hip_python": "hip-python", "cache": CACHE_SWITCH_ENV, "snapshot_env": SNAPSHOT_ENV, "bundled_snapshots": "bundled snapshots",
    "cache_store": "cache store", "cache_plans": "cache plans",
}


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _torch_build_facts() -> dict[str, Any] | None:
    """The assignments of torch's generated version.py (__version__, cuda), read as Python
    literals without importing torch: importing it takes seconds, and info only reports it."""
    spec = importlib.util.find_spec("torch")  # locates the package; a top-level find runs none of it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), "version.py")
    try:
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    facts: dict[str, Any] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and node.value is not None:
            try:
                facts[target.id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return facts


def _torch_version() -> str:
    torch = sys.modules.get("torch")
    if torch is not None:  # already imported by this process: ask it
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        return f"{torch.__version__} (CUDA {cuda or 'none'})"
    try:
        facts = _torch_build_facts()
    except (ImportError, ValueError) as err:  # a broken install is reported, info never fails
        return f"not readable ({type(err).__name__}: {err})"
    if facts is None:
        return "not installed" if importlib.util.find_spec("torch") is None else "installed, version unknown"
    version = facts.get("__version__") or _package_version("torch")
    return f"{version} (CUDA {facts.get('cuda') or 'none'})"


def _cache_dir() -> str:
    try:
        return str(default_cache_dir())
    except RuntimeError as err:  # no home directory to put it in; info reports, it never fails
        return f"unknown ({err})"


def _cache_facts() -> dict[str, str]:
    """The cache switch, and the store a writing process would get: flagged INVALID, DEGRADED,
    DAMAGED or DISABLED when it is not what was asked for."""
    switch = os.environ.get(CACHE_SWITCH_ENV, "(unset)")
    problem = cache_switch_problem()
    if problem:
        switch = f"INVALID: {problem}; the library uses the persistent cache, commands refuse it"
    try:
        info = store_info(open_default_store(read_only=True))
    except Exception as err:  # noqa: BLE001 - info reports, it never fails
        return {"cache": switch, "cache_store": f"UNREADABLE: {type(err).__name__}: {err}", "cache_plans": "unknown"}
    return {"cache": switch, "cache_store": describe_store(info), "cache_plans": describe_plans(info)}


def _setting_facts() -> dict[str, str]:
    """$FUSEDATTN_SELECT_SNAPSHOT, and each other setting that is set (the cache ones have rows of their own):
    its value, or INVALID with the problem. info reports an invalid setting; every other command refuses it."""
    facts = {}
    for setting in settings.SETTINGS:
        if setting.name in (settings.CACHE, settings.CACHE_DIR):
            continue
        text = os.environ.get(setting.name, "")
        if setting.name != SNAPSHOT_ENV and not text:
            continue
        key = "snapshot_env" if setting.name == SNAPSHOT_ENV else setting.name
        try:
            setting.value()
        except ConfigError as err:
            facts[key] = f"INVALID: {err}; other commands refuse it (exit 2)"
            continue
        facts[key] = text or "(unset)"
    return facts


def _bundled_facts() -> dict[str, str]:
    facts = {}
    for target in TARGETS:
        for path in engines.bundled_paths(target):
            if not path.is_file():
                facts[path.name] = "missing (not recorded yet)"
                continue
            try:
                header = read_header(path)
            except SnapshotError as err:
                facts[path.name] = f"unreadable: {err}"
                continue
            fp = header.fingerprint
            facts[path.name] = (
                f"{fp.device_name}, cuDNN {format_cudnn_version(fp.cudnn_backend_version)}, "
                f"recorded {header.recorded_on}, {header.entry_count} entries"
            )
    return facts


def _device_facts() -> dict[str, Any]:
    engine, reason = engines.live_engine()
    if engine is None:
        device: dict[str, Any] = dict.fromkeys(DEVICE_FACTS, f"none: {reason}")
        frontend = _package_version("nvidia-cudnn-frontend")
        device["cudnn_frontend"] = f"none: {reason} (package nvidia-cudnn-frontend: {frontend})"
        return device
    fp = engine.fingerprint()
    return {
        "probing_engine": engine.name,
        "gpu": fp.device_name,
        "compute_capability": fp.compute_capability,
        "sm_count": fp.sm_count,
        "driver": fp.driver_version,
        "cudnn_backend": format_cudnn_version(fp.cudnn_backend_version),
        "cudnn_frontend": fp.cudnn_frontend_version,
    }


def platform_facts() -> dict[str, Any]:
    """What `info` reports; works with no GPU, no cuDNN and no torch. The one nested fact,
    bundled_snapshots, comes last."""
    return {
        "fusedattn_select": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        **_device_facts(),
        "rocm": detect_rocm_device().describe(),
        "hip_python": _package_version("hip-python"),
        "torch": _torch_version(),
        "cache_dir": _cache_dir(),
        **_cache_facts(),
        **_setting_facts(),
        "bundled_snapshots": _bundled_facts(),
    }


def format_facts(facts: dict[str, Any]) -> str:
    """A label-value table; a nested fact (last) lists its items under its label."""
    rows = []
    nested: list[str] = []
    said = ""
    for key, value in facts.items():
        if isinstance(value, dict):
            rows.append([LABELS.get(key, key), ""])
            nested += [f"  {name}: {text}" for name, text in value.items()]
            continue
        if isinstance(value, str) and said and value.startswith(said):
            # One reason explains every missing device fact: say it once.
            value = "none (see above)" + value[len(said):]
        elif isinstance(value, str) and value.startswith("none: "):
            said = value
        rows.append([LABELS.get(key, key), value])
    return "\n".join([render_table(None, rows), *(line.rstrip() for line in nested)])


def _cmd_info(args: argparse.Namespace) -> int:
    facts = platform_facts()
    print(json.dumps(facts, indent=2) if args.json else format_facts(facts))
    return EXIT_SELECTED


def register_info(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "info", parents=[common], help="versions, GPU, cuDNN, cache location and bundled snapshots",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=_cmd_info)
