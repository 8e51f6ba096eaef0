"""The `fusedattn-select` command: why, info, snapshot record, warmup, cache.

Exit codes: 0 every answered problem has a backend, 1 some problem has none (NONE), 2 bad input
(a config, snapshot or option the command cannot use; one `error:` line on stderr).

Each subcommand is added by one `register_*` function in COMMANDS; a new subcommand is a new
function there, nothing else changes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from fusedattn_select._version import __version__
from fusedattn_select.config import AttnConfig
from fusedattn_select.config_files import NamedConfig, load_config_file
from fusedattn_select.errors import (
    ConfigError,
    FusedAttnSelectError,
    PlatformError,
    SnapshotError,
)
from fusedattn_select.probing import (
    SNAPSHOT_ENV,
    TARGETS,
    bundled_snapshot,
    discover_engine,
)
from fusedattn_select.probing.engine import ProbeEngine
from fusedattn_select.probing.snapshot import SnapshotEngine, SnapshotFile, read_header
from fusedattn_select.selection.selector import Selector, set_default_selector
from fusedattn_select.types import (
    Backend,
    ProbeDepth,
    Provenance,
    Selection,
    Verdict,
    format_cudnn_version,
)

log = logging.getLogger("fusedattn_select")

EXIT_SELECTED = 0
EXIT_NONE = 1
EXIT_BAD_INPUT = 2

# Suites recorded per target and shipped with the package (see probing.bundled_snapshot).
BUNDLED_SUITES = ("configs", "hopper-suite")
DEFAULT_TARGET = "h100"
CACHE_DIR_ENV = "FUSEDATTN_SELECT_CACHE_DIR"
CACHE_ENV = "FUSEDATTN_SELECT_CACHE"


# ----- engines ---------------------------------------------------------------------------------
def _bundled_files(target: str) -> list[Path]:
    return [path for path in (bundled_snapshot(target, s) for s in BUNDLED_SUITES) if path.is_file()]


def _missing_bundled(target: str) -> str:
    paths = [bundled_snapshot(target, s) for s in BUNDLED_SUITES]
    return (
        f"no bundled snapshot for {target} is installed ({', '.join(p.name for p in paths)} missing "
        f"in {paths[0].parent}); record one on that GPU with `fusedattn-select snapshot record`"
    )


def _bundled_engine(target: str) -> SnapshotEngine:
    files = _bundled_files(target)
    if not files:
        raise SnapshotError(_missing_bundled(target))
    return SnapshotEngine.load_many(files)


def _live_engine() -> tuple[ProbeEngine | None, str]:
    """The live cuDNN engine, ignoring $FUSEDATTN_SELECT_SNAPSHOT: (engine, "") or (None, why)."""
    try:
        from fusedattn_select.probing.cudnn.engine import CudnnEngine
    except ImportError as err:
        return None, f"cannot import the cuDNN engine: {err}"
    try:
        return CudnnEngine(), ""
    except PlatformError as err:
        return None, str(err)
    except Exception as err:  # noqa: BLE001 - the CLI reports a broken platform, never a traceback
        return None, f"the cuDNN engine failed to start: {type(err).__name__}: {err}"


def _discovered_engine() -> tuple[ProbeEngine | None, str]:
    try:
        return discover_engine()
    except FusedAttnSelectError:
        raise
    except Exception as err:  # noqa: BLE001 - see _live_engine
        return None, f"the cuDNN engine failed to start: {type(err).__name__}: {err}"


def _open_store() -> object | None:
    """The persistent decision store for live answers, if the cache module provides one."""
    try:
        from fusedattn_select.store import sqlite as cache
        opener = getattr(cache, "open_default_store", None)
        return opener() if opener is not None else None
    except Exception as err:  # noqa: BLE001 - the store only saves time; answer without it
        log.warning("fusedattn_select: persistent cache unavailable (%s); answering from memory", err)
        return None


def _describe_snapshot(engine: SnapshotEngine) -> str:
    first: SnapshotFile = engine.files[0]
    fp = first.fingerprint
    return (
        f"{fp.device_name or fp.platform}, cuDNN {format_cudnn_version(fp.cudnn_backend_version)} "
        f"on {first.recorded_on}"
    )


def _choose_selector(snapshot: str | None, target: str | None) -> tuple[Selector, str]:
    """The selector `why` answers with, and a notice line when it is not what the user named."""
    notice = ""
    engine: ProbeEngine | None
    if snapshot:
        engine = SnapshotEngine.load(snapshot)
    elif target:
        engine = _bundled_engine(target)
    elif os.environ.get(SNAPSHOT_ENV):
        engine = SnapshotEngine.load(os.environ[SNAPSHOT_ENV])
    else:
        engine, reason = _discovered_engine()
        if engine is None:
            if not _bundled_files(DEFAULT_TARGET):
                notice = (
                    f"no CUDA device/cuDNN here ({reason}); {_missing_bundled(DEFAULT_TARGET)}; "
                    "so answering with the platform rule; pass --snapshot FILE to answer from a snapshot"
                )
                return Selector(None, unavailable_reason=reason), notice
            engine = _bundled_engine(DEFAULT_TARGET)
            notice = (
                f"no CUDA device/cuDNN here ({reason}); answering from the bundled snapshot recorded "
                f"on {_describe_snapshot(engine)}; pass --target/--snapshot to choose"
            )
    store = None if engine.provenance is Provenance.SNAPSHOT else _open_store()
    return Selector(engine, store=store), notice


# ----- why -------------------------------------------------------------------------------------
def _parse_sets(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs; values are YAML (`[128,0]`, `false`, `null`), numbers also as `1e-3`."""
    import yaml

    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("--set", pair, "must be key=value, e.g. --set head_dim_qk=128")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(key, text, f"is not a YAML value ({str(err).splitlines()[0]})") from None
        if isinstance(value, str):
            # YAML 1.1 reads 1e-3 as a string; the user meant a number.
            with contextlib.suppress(ValueError):
                value = float(value)
        values[key] = value
    return values


def _hf_entries(source: str, sets: dict[str, Any]) -> list[tuple[NamedConfig, tuple[str, ...]]]:
    """One entry per distinct attention problem of a Hugging Face model config, with the reasons
    the transformers integration cannot run it fused whatever cuDNN says (e.g. soft-capping)."""
    from fusedattn_select.integrations.transformers import layer_problems

    # Shape, pass and dtype shape the layer problems themselves (a sliding window only applies
    # when the sequence is longer than it), so they go in before the problems are derived.
    sets = dict(sets)
    seqlen = sets.get("seqlen_kv", sets.get("seqlen_q"))
    derive = {
        "batch_size": sets.pop("batch_size", 1),
        "seqlen": seqlen if isinstance(seqlen, int) and not isinstance(seqlen, bool) else None,
        "is_training": sets.pop("is_training", True),
        "dtype": sets.pop("qkv_dtype", "bf16"),
    }
    entries = []
    for name, cfg, layers, notes in layer_problems(source, **derive):
        if sets:
            cfg = AttnConfig.from_dict({**cfg.to_dict(), **sets})
        entries.append((NamedConfig(f"{name} (layers {_layer_ranges(layers)})", cfg, source), notes))
    return entries


def _layer_ranges(layers: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    ranges: list[list[int]] = []
    for layer in sorted(layers):
        if ranges and layer == ranges[-1][1] + 1:
            ranges[-1][1] = layer
        else:
            ranges.append([layer, layer])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in ranges)


def _entries(args: argparse.Namespace) -> list[tuple[NamedConfig, tuple[str, ...]]]:
    """The problems to answer, each with integration notes that rule out a fused run."""
    return [(entry, ()) for entry in _config_entries(args)] if args.hf_config is None else _hf_problems(args)


def _hf_problems(args: argparse.Namespace) -> list[tuple[NamedConfig, tuple[str, ...]]]:
    if args.config is not None:
        raise ConfigError("--hf-config", args.hf_config, "give either CONFIG.yaml or --hf-config, not both")
    if args.name is not None:
        raise ConfigError("--name", args.name, "selects an entry of a CONFIG file, not of --hf-config")
    return _hf_entries(args.hf_config, _parse_sets(args.set or ()))


def _config_entries(args: argparse.Namespace) -> list[NamedConfig]:
    sets = _parse_sets(args.set or ())
    if args.config is None:
        if args.name is not None:
            raise ConfigError("--name", args.name, "selects an entry of a CONFIG file; none was given")
        if not sets:
            raise ConfigError("why", None, "give a CONFIG.yaml file or --set key=value pairs")
        return [NamedConfig("--set", AttnConfig.from_dict(sets))]
    config_file = load_config_file(args.config)
    chosen = [config_file.get(args.name)] if args.name is not None else list(config_file.entries)
    if not sets:
        return chosen
    entries = []
    for entry in chosen:
        try:
            cfg = AttnConfig.from_dict({**entry.config.to_dict(), **sets})
        except ConfigError as err:
            raise ConfigError(f"{args.config}: {entry.name}: {err.field}", err.value, err.allowed) from None
        entries.append(NamedConfig(entry.name, cfg, entry.source))
    return entries


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _verdict_row(verdict: Verdict) -> list[str]:
    return [
        verdict.backend.value, verdict.phase.value, verdict.outcome.value, verdict.stage,
        verdict.provenance.value, verdict.depth.value,
        f"{verdict.total_ms:.2f}" if verdict.timings_ms else "-",
        verdict.message,
    ]


def format_selection(name: str, selection: Selection) -> list[str]:
    """The text answer for one problem: its fields, a verdict table, the chosen backend."""
    cfg = selection.config
    fields = " ".join(f"{k}={v}" for k, v in cfg.to_dict().items()) if cfg is not None else ""
    header = ["backend", "phase", "verdict", "stage", "provenance", "depth", "ms", "reason"]
    rows = [_verdict_row(v) for v in selection.verdicts]
    for previous, row in zip(rows, rows[1:]):
        if row[-1] and row[-1] == previous[-1] or row[-1] == "(same as above)":
            row[-1] = "(same as above)"
    lines = [f"{name}: {fields}"]
    lines += _table([header] + rows)
    if selection.selected:
        lines.append(f"  -> {selection.backend.value}")
    else:
        lines.append(f"  -> NONE: {selection.message}")
    return lines


def _cmd_why(args: argparse.Namespace) -> int:
    entries = _entries(args)
    selector, notice = _choose_selector(args.snapshot, args.target)
    set_default_selector(selector)
    depth = ProbeDepth.FULL if args.full else ProbeDepth.FAST
    results = [(entry.name, selector.select(entry.config, depth), notes) for entry, notes in entries]
    if args.json:
        if notice:
            print(notice, file=sys.stderr)
        document = {
            "engine": selector.engine_name,
            "fingerprint": selector.fingerprint.to_dict(),
            "probe_depth": depth.value,
            "notice": notice or None,
            "results": [
                {"name": name, "selection": sel.to_dict(), **({"integration_reasons": list(notes)} if notes else {})}
                for name, sel, notes in results
            ],
        }
        print(json.dumps(document, indent=2))
    else:
        lines = [notice] if notice else []
        platform = selector.fingerprint.describe() if selector.engine is not None else "platform rule only"
        lines.append(f"engine: {selector.engine_name} ({platform}); probe depth {depth.value}")
        for name, sel, notes in results:
            lines.append("")
            lines += format_selection(name, sel)
            lines += [f"  -> not fused by the transformers integration: {note}" for note in notes]
        print("\n".join(lines))
    fused = all(sel.selected and not notes for _, sel, notes in results)
    return EXIT_SELECTED if fused else EXIT_NONE


def register_why(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "why", parents=[common],
        help="which fused backend runs a problem, and if none, every reason why",
        description="Answer each entry of CONFIG.yaml (or one problem built from --set pairs): "
        "per backend and pass the verdict, the stage that decided it and why; then the backend.",
    )
    parser.add_argument("config", nargs="?", metavar="CONFIG.yaml", help="a config file (see README 'Config format')")
    parser.add_argument("--name", help="answer only the entry with this name")
    parser.add_argument(
        "--hf-config", metavar="PATH_OR_JSON",
        help="answer each distinct layer problem of a Hugging Face model config (config.json path, "
        "its directory, or a JSON string); --set adjusts them (e.g. --set seqlen_q=8192)",
    )
    parser.add_argument(
        "--set", action="append", metavar="KEY=VALUE",
        help="set an AttnConfig field (YAML value), on top of every entry; alone, builds one problem",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--full", action="store_true", help="probe depth 'full': also build the kernels")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--snapshot", metavar="FILE", help="answer from this recorded snapshot")
    source.add_argument("--target", choices=TARGETS, help="answer from the snapshots bundled for this GPU")
    parser.set_defaults(func=_cmd_why)


# ----- info ------------------------------------------------------------------------------------
def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _torch_version() -> str:
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - torch is optional; a broken install is reported
        return f"not importable ({type(err).__name__}: {err})" if not isinstance(err, ImportError) else "not installed"
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    return f"{torch.__version__} (CUDA {cuda or 'none'})"


def _cache_dir() -> str:
    try:
        from fusedattn_select.store import sqlite as cache
        default = getattr(cache, "default_cache_dir", None)
        if callable(default):
            return str(default())
    except Exception as err:  # noqa: BLE001 - info reports, it never fails
        log.debug("fusedattn_select: cache.default_cache_dir failed: %s", err)
    configured = os.environ.get(CACHE_DIR_ENV)
    return configured if configured else str(Path.home() / ".cache" / "fusedattn-select")


def _bundled_facts() -> dict[str, str]:
    facts = {}
    for target in TARGETS:
        for suite in BUNDLED_SUITES:
            path = bundled_snapshot(target, suite)
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


def platform_facts() -> dict[str, Any]:
    """What `info` reports; works with no GPU, no cuDNN and no torch."""
    engine, reason = _live_engine()
    if engine is not None:
        fp = engine.fingerprint()
        device = {
            "probing_engine": engine.name,
            "gpu": fp.device_name,
            "compute_capability": fp.compute_capability,
            "sm_count": fp.sm_count,
            "driver": fp.driver_version,
            "cudnn_backend": format_cudnn_version(fp.cudnn_backend_version),
            "cudnn_frontend": fp.cudnn_frontend_version,
        }
    else:
        none = f"none: {reason}"
        device = dict.fromkeys(
            ("probing_engine", "gpu", "compute_capability", "sm_count", "driver", "cudnn_backend"), none
        )
        device["cudnn_frontend"] = f"none: {reason} (package nvidia-cudnn-frontend: {_package_version('nvidia-cudnn-frontend')})"
    return {
        "fusedattn_select": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        **device,
        "torch": _torch_version(),
        "cache_dir": _cache_dir(),
        "cache": os.environ.get(CACHE_ENV, "(unset)"),
        "snapshot_env": os.environ.get(SNAPSHOT_ENV, "(unset)"),
        "bundled_snapshots": _bundled_facts(),
    }


def _cmd_info(args: argparse.Namespace) -> int:
    facts = platform_facts()
    if args.json:
        print(json.dumps(facts, indent=2))
        return EXIT_SELECTED
    labels = {
        "fusedattn_select": "fusedattn-select", "probing_engine": "probing engine", "gpu": "GPU",
        "compute_capability": "compute capability", "sm_count": "SM count", "driver": "driver",
        "cudnn_backend": "cuDNN backend", "cudnn_frontend": "cuDNN frontend", "cache_dir": "cache directory",
        "cache": CACHE_ENV, "snapshot_env": SNAPSHOT_ENV, "bundled_snapshots": "bundled snapshots",
    }
    width = max(len(labels.get(k, k)) for k in facts)
    lines = []
    said = ""
    for key, value in facts.items():
        label = labels.get(key, key).ljust(width)
        if isinstance(value, str) and said and value.startswith(said):
            # One reason explains every missing device fact: say it once.
            value = "none (see above)" + value[len(said):]
        elif isinstance(value, str) and value.startswith("none: "):
            said = value
        if isinstance(value, dict):
            lines.append(f"{label}  ")
            lines += [f"  {name}: {text}" for name, text in value.items()]
        else:
            lines.append(f"{label}  {value}")
    print("\n".join(line.rstrip() for line in lines))
    return EXIT_SELECTED


def register_info(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "info", parents=[common], help="versions, GPU, cuDNN, cache location and bundled snapshots",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=_cmd_info)


# ----- snapshot record -------------------------------------------------------------------------
def _cmd_snapshot_record(args: argparse.Namespace) -> int:
    from fusedattn_select.probing.recorder import (
        record_snapshot,
        summarize,
        write_snapshot,
    )

    for path in args.suites:  # bad input fails before the device is touched
        load_config_file(path)
    engine, reason = _live_engine()
    if engine is None:
        raise PlatformError(f"snapshot record needs a live CUDA device with cuDNN: {reason}")

    def progress(done: int, total: int, entry: dict) -> None:
        outcomes = ",".join(f"{v['phase']}:{v['outcome']}" for v in entry["verdicts"])
        log.info("fusedattn_select: [%d/%d] %s:%s %s", done, total, entry["suite"], entry["name"], outcomes)

    started = time.perf_counter()
    snapshot = record_snapshot(args.suites, engine, depth=args.depth, jobs=args.jobs, progress=progress)
    path = write_snapshot(snapshot, args.output)
    counts = summarize(snapshot)
    print(
        f"recorded {counts['entries']} entries ({counts['selected']} selected, {counts['none']} none, "
        f"{counts['failed']} failed) on {engine.fingerprint().describe()} at depth {args.depth} "
        f"in {time.perf_counter() - started:.1f} s -> {path}"
    )
    return EXIT_SELECTED


def register_snapshot(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("snapshot", parents=[common], help="record snapshots on a live device")
    actions = parser.add_subparsers(dest="snapshot_command", metavar="ACTION", required=True)
    record = actions.add_parser(
        "record", parents=[common],
        help="probe every entry of suite files on this GPU and write a snapshot JSON",
    )
    record.add_argument("suites", nargs="+", metavar="SUITE.yaml")
    record.add_argument("-o", "--output", required=True, metavar="FILE", help="snapshot JSON to write")
    record.add_argument("--depth", choices=[d.value for d in ProbeDepth], default=ProbeDepth.FAST.value)
    record.add_argument("--jobs", type=_positive_int, default=1, metavar="N", help="probe N entries at once")
    record.set_defaults(func=_cmd_snapshot_record)


# ----- warmup, cache ---------------------------------------------------------------------------
# Both commands call into modules that own the work (warmup.py, cache.py); they are looked up when
# the command runs, so the CLI keeps working in an installation that lacks them.
def _cmd_warmup(args: argparse.Namespace) -> int:
    try:
        from fusedattn_select.selection.warmup import warmup
    except ImportError as err:
        raise PlatformError(f"warmup is not available in this installation ({err})") from None
    from fusedattn_select.selection.selector import default_selector

    problems = []
    for path in args.configs:
        config_file = load_config_file(path)
        problems += [(f"{config_file.name}/{entry.name}", entry.config) for entry in config_file.entries]
    selector = default_selector()
    if selector.engine is None:
        raise PlatformError(
            f"warmup needs a CUDA device with cuDNN (or {SNAPSHOT_ENV}=FILE): {selector.unavailable_reason}"
        )
    report = warmup(problems, jobs=args.jobs, depth=args.depth, selector=selector,
                    progress=None if args.json else _progress_bar(), workers=args.workers)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format_table())
    return EXIT_NONE if any(row.backend is Backend.NONE for row in report.rows) else EXIT_SELECTED


def register_warmup(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "warmup", parents=[common],
        help="answer (and with --depth full, build) every entry of config files now, into the cache",
    )
    parser.add_argument("configs", nargs="+", metavar="CONFIG.yaml")
    parser.add_argument("--jobs", type=_positive_int, default=None, metavar="N",
                        help="problems probed at once (default: min(8, CPUs))")
    parser.add_argument("--depth", choices=[d.value for d in ProbeDepth], default=ProbeDepth.FULL.value)
    parser.add_argument(
        "--workers", choices=("threads", "processes"), default="threads",
        help="run the --jobs builds on threads (default) or in worker processes sharing the "
        "persistent store (cuDNN builds hold the GIL, so processes build in parallel)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(func=_cmd_warmup)


def _progress_bar(stream: Any = None) -> Callable[[int, int, str], None]:
    """A progress bar on stderr: redrawn in place on a terminal, a line per tenth otherwise."""
    stream = stream or sys.stderr
    interactive = stream.isatty()
    width = 30

    def show(done: int, total: int, name: str) -> None:
        filled = width * done // total
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name}"
        if interactive:
            stream.write("\r\033[K" + bar + ("\n" if done == total else ""))
        elif done == total or done * 10 // total != (done - 1) * 10 // total:
            stream.write(bar + "\n")
        stream.flush()

    return show


def _cache_store() -> Any:
    from fusedattn_select.store import sqlite as cache
    opener = getattr(cache, "open_default_store", None)
    store = opener() if opener is not None else None
    if store is None:
        raise PlatformError("no persistent cache is available in this installation")
    return store


def _store_call(store: Any, method: str, *args: Any) -> Any:
    function = getattr(store, method, None)
    if function is None:
        raise PlatformError(f"the cache store {type(store).__name__} has no '{method}'")
    return function(*args)


def _cmd_cache(args: argparse.Namespace) -> int:
    store = _cache_store()
    if args.action == "info":
        info = _store_call(store, "info")
        if args.json:
            print(json.dumps(info, indent=2, default=str))
        else:
            width = max(len(str(k)) for k in info)
            print("\n".join(f"{str(k).ljust(width)}  {v}" for k, v in info.items()))
    elif args.action == "clear":
        before = _store_call(store, "info")
        _store_call(store, "clear")
        print(f"cleared {before.get('entries', '?')} decisions and {before.get('plans', '?')} plans "
              f"from {before.get('path') or 'the memory store'}")
    elif args.action == "export":
        print(json.dumps(_store_call(store, "export", args.file), indent=2, default=str))
    else:
        report = _store_call(store, "import_", args.file)
        print(json.dumps(report.to_dict() if hasattr(report, "to_dict") else report, indent=2, default=str))
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


# ----- main ------------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive integer")
    return value


Register = Callable[[Any, argparse.ArgumentParser], None]
COMMANDS: tuple[Register, ...] = (register_why, register_info, register_snapshot, register_warmup, register_cache)


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
        epilog="exit codes: 0 a backend is selected for every problem, 1 some problem has NONE, 2 bad input",
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
    """Run the command line; returns the exit code (see module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse printed the usage error (or --help) already
        return exit_.code if isinstance(exit_.code, int) else EXIT_BAD_INPUT
    with _logging(args.verbose):
        try:
            return args.func(args)
        except FusedAttnSelectError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except KeyboardInterrupt:
            return 130


if __name__ == "__main__":
    sys.exit(main())
