"""Probing engines: where ground-truth verdicts come from on each platform."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fusedattn_select.errors import PlatformError
from fusedattn_select.probing.engine import ProbeEngine
from fusedattn_select.types import Fingerprint, format_cudnn_version

__all__ = ["Fingerprint", "ProbeEngine", "discover_engine", "format_cudnn_version", "bundled_snapshot"]

log = logging.getLogger("fusedattn_select")

SNAPSHOT_ENV = "FUSEDATTN_SELECT_SNAPSHOT"
SNAPSHOT_DIR = Path(__file__).resolve().parent.parent / "snapshots"
TARGETS = ("h100", "h200")


def bundled_snapshot(target: str, suite: str = "configs") -> Path:
    """Path of a snapshot shipped with the package, recorded on `target` for `suite`."""
    if target not in TARGETS:
        from fusedattn_select.errors import ConfigError

        raise ConfigError("target", target, "must be one of " + ", ".join(repr(t) for t in TARGETS))
    return SNAPSHOT_DIR / f"{target}-{suite}.json"


def discover_engine() -> tuple[ProbeEngine | None, str]:
    """The engine for this process: a snapshot named by $FUSEDATTN_SELECT_SNAPSHOT, else live cuDNN.

    Returns (engine, "") or (None, why no engine is available).
    """
    snapshot = os.environ.get(SNAPSHOT_ENV)
    if snapshot:
        from fusedattn_select.probing.snapshot import SnapshotEngine

        return SnapshotEngine.load(snapshot), ""
    try:
        from fusedattn_select.probing.cudnn.engine import CudnnEngine
    except ImportError as err:  # the 'cuda' extra is not installed
        return None, f"cannot import the cuDNN engine: {err}"
    try:
        return CudnnEngine(), ""
    except PlatformError as err:
        return None, str(err)
