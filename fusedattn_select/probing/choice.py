"""Which engine answers: named snapshots, a target's bundled snapshots, live cuDNN, or none.

One decision for the library (the process-wide selector) and every command, so `select()` and
`fusedattn-select why` give the same answer with the same notice on the same machine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fusedattn_select import settings
from fusedattn_select.errors import ConfigError, PlatformError, SnapshotError
from fusedattn_select.probing.engine_protocol import ProbeEngine
from fusedattn_select.probing.frontend import import_cudnn
from fusedattn_select.probing.snapshot import SnapshotEngine

log = logging.getLogger("fusedattn_select")

SNAPSHOT_ENV = settings.SNAPSHOT
SNAPSHOT_DIR = Path(__file__).resolve().parent.parent / "snapshots"
TARGETS = ("h100", "h200")
# Suites recorded per target and shipped with the package (tools/record_snapshots.py records them;
# "models" is probes/hf-models.yaml, the problems of the config.json corpus).
BUNDLED_SUITES = ("configs", "hopper-suite", "models")
DEFAULT_TARGET = "h100"
CHOOSE_HINT = "choose with --target/--snapshot, or fusedattn_select.use_snapshots()"


@dataclass(frozen=True)
class EngineChoice:
    """The engine that answers (None: no ground truth here), and what the user should be told.

    `notice` is "" when the engine is the one the caller named or the live device; otherwise it
    says what answers instead and why. `unavailable_reason` says why no live engine answers.
    """

    engine: ProbeEngine | None
    notice: str = ""
    unavailable_reason: str = ""


def target_name(target: str) -> str:
    """`target` as the bundled snapshots name it (case does not matter); ConfigError otherwise."""
    name = target.lower() if isinstance(target, str) else target
    if name not in TARGETS:
        raise ConfigError("target", target, "must be one of " + ", ".join(repr(t) for t in TARGETS))
    return name


def bundled_snapshot(target: str, suite: str = "configs") -> Path:
    """Path of a snapshot shipped with the package, recorded on `target` for `suite`."""
    return SNAPSHOT_DIR / f"{target_name(target)}-{suite}.json"


def bundled_paths(target: str) -> list[Path]:
    """Where the snapshots bundled for `target` belong, one per suite, installed or not."""
    return [bundled_snapshot(target, suite) for suite in BUNDLED_SUITES]


def _missing_bundled(target: str) -> str:
    paths = bundled_paths(target)
    return (
        f"no bundled snapshot for {target_name(target)} is installed ({', '.join(p.name for p in paths)} "
        f"missing in {paths[0].parent}); record one on that GPU with `fusedattn-select snapshot record`"
    )


def bundled_engine(target: str) -> SnapshotEngine:
    """The snapshots bundled for `target`, merged; SnapshotError when none is installed."""
    files = [path for path in bundled_paths(target) if path.is_file()]
    if not files:
        raise SnapshotError(_missing_bundled(target))
    return SnapshotEngine.load_many(files)


def snapshot_paths(value: str) -> list[str]:
    """The files named by $FUSEDATTN_SELECT_SNAPSHOT: one path, or several separated by os.pathsep."""
    return settings.parse_snapshot_paths(value)


SNAPSHOTS_ALLOWED = "must be a snapshot file's path (str or Path), a list of them, or None"


def snapshot_files(snapshots: object) -> list[str | Path]:
    """The snapshot files named by `snapshots` (one path, an iterable of paths, or None: none);
    ConfigError naming `snapshots` for anything else, an empty path included (it names no file)."""
    if snapshots is None:
        return []
    one = isinstance(snapshots, (str, os.PathLike))
    if one:
        paths: list = [snapshots]
    elif isinstance(snapshots, Iterable) and not isinstance(snapshots, (bytes, Mapping)):
        paths = list(snapshots)
    else:
        raise ConfigError("snapshots", snapshots, SNAPSHOTS_ALLOWED)
    for index, path in enumerate(paths):
        where = "snapshots" if one else f"snapshots[{index}]"
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(where, path, SNAPSHOTS_ALLOWED)
        if not str(path):
            raise ConfigError(where, path, "is an empty path, which names no file; " + SNAPSHOTS_ALLOWED)
    return paths


def live_engine_on(device: int) -> ProbeEngine:
    """The live cuDNN engine on CUDA device `device`; raises PlatformError where it cannot start."""
    # Imported here for the reason live_engine gives.
    from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine

    return CudnnEngine(device)


def live_engine() -> tuple[ProbeEngine | None, str]:
    """The live cuDNN engine, ignoring $FUSEDATTN_SELECT_SNAPSHOT: (engine, "") or (None, why).
    It builds its warm-up graph before its first probe, if it probes at all (a process that only
    loads stored plans, or reads the fingerprint, never builds it); selectors warm it up before
    timing that probe."""
    # The live engine's modules load only where cudnn-frontend (the optional 'cuda' extra) does:
    # on a machine without it (a laptop asking `why`) importing them cost a twentieth of the answer.
    try:
        import_cudnn()
        from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine

        return CudnnEngine(warm_up=False), ""
    except PlatformError as err:
        return None, str(err)
    except Exception as err:  # noqa: BLE001 - a broken platform is answered like a missing one, with its error
        return None, f"the cuDNN engine failed to start: {type(err).__name__}: {err}"


def _chosen(engine: ProbeEngine, why: str) -> EngineChoice:
    log.debug("fusedattn_select: engine %s (%s)", engine.name, why)
    return EngineChoice(engine)


def choose_engine(snapshots: Iterable[str | Path] | None = None, target: str | None = None) -> EngineChoice:
    """The engine that answers, in this order: the `snapshots` files (merged), the snapshots bundled
    for `target`, the files in $FUSEDATTN_SELECT_SNAPSHOT, the live cuDNN device, and on a machine
    without one the snapshots bundled for DEFAULT_TARGET (with a notice); else no engine (with a
    notice and the reason). SnapshotError or ConfigError when what was named cannot be used.
    """
    paths = snapshot_files(snapshots)
    if paths and target:
        raise ConfigError("target", target, "answers from bundled snapshots; give snapshot files or a target, not both")
    if paths:
        return _chosen(SnapshotEngine.load_many(paths), "snapshot files named by the caller")
    if target:
        return _chosen(bundled_engine(target), f"bundled snapshots of target {target_name(target)}")
    if os.environ.get(SNAPSHOT_ENV):
        return _chosen(SnapshotEngine.load_many(snapshot_paths(os.environ[SNAPSHOT_ENV])), f"${SNAPSHOT_ENV}")
    engine, reason = live_engine()
    if engine is not None:
        return _chosen(engine, "live device")
    log.debug("fusedattn_select: no live engine (%s)", reason)
    try:
        fallback = bundled_engine(DEFAULT_TARGET)
    except SnapshotError as err:
        notice = (
            f"no CUDA device/cuDNN here ({reason}); {err}; so no problem can be answered (no data); "
            f"{CHOOSE_HINT}"
        )
        return EngineChoice(None, notice, reason)
    notice = (
        f"no CUDA device/cuDNN here ({reason}); answering from the bundled snapshot recorded on "
        f"{fallback.describe()}; {CHOOSE_HINT}"
    )
    log.debug("fusedattn_select: engine %s (bundled snapshots of the default target %s)", fallback.name, DEFAULT_TARGET)
    return EngineChoice(fallback, notice, reason)
