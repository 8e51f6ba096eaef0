"""Probing engines: where ground-truth verdicts come from on each platform."""

from __future__ import annotations

import os
from pathlib import Path

from fusedattn_select.errors import ConfigError, PlatformError
from fusedattn_select.probing.engine import ProbeEngine
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.types import Fingerprint, format_cudnn_version

__all__ = [
    "SNAPSHOT_ENV",
    "TARGETS",
    "Fingerprint",
    "ProbeEngine",
    "bundled_snapshot",
    "discover_engine",
    "format_cudnn_version",
]

SNAPSHOT_ENV = "FUSEDATTN_SELECT_SNAPSHOT"
SNAPSHOT_DIR = Path(__file__).resolve().parent.parent / "snapshots"
TARGETS = ("h100", "h200")


def bundled_snapshot(target: str, suite: str = "configs") -> Path:
    """Path of a snapshot shipped with the package, recorded on `target` for `suite`."""
    if target not in TARGETS:
        raise ConfigError("target", target, "must be one of " + ", ".join(repr(t) for t in TARGETS))
    return SNAPSHOT_DIR / f"{target}-{suite}.json"


def discover_engine() -> tuple[ProbeEngine | None, str]:
    """The engine for this process: a snapshot named by $FUSEDATTN_SELECT_SNAPSHOT, else live cuDNN.

    Returns (engine, "") or (None, why no engine is available).
    """
    snapshot = os.environ.get(SNAPSHOT_ENV)
    if snapshot:
        return SnapshotEngine.load(snapshot), ""
    # The live engine's modules (~10 ms to import) load only when no snapshot answers; they import
    # cudnn-frontend and cuda-python themselves, on first use, raising PlatformError when absent.
    from fusedattn_select.probing.cudnn.engine import CudnnEngine

    try:
        return CudnnEngine(), ""
    except PlatformError as err:
        return None, str(err)
