"""Probing engines: where ground-truth verdicts come from on each platform."""

from __future__ import annotations

from fusedattn_select.probing.choice import (
    BUNDLED_SUITES,
    DEFAULT_TARGET,
    SNAPSHOT_ENV,
    TARGETS,
    EngineChoice,
    bundled_paths,
    bundled_snapshot,
    choose_engine,
    live_engine,
    target_name,
)
from fusedattn_select.probing.engine_protocol import ProbeEngine
from fusedattn_select.types import Fingerprint, format_cudnn_version

__all__ = [
    "BUNDLED_SUITES",
    "DEFAULT_TARGET",
    "SNAPSHOT_ENV",
    "TARGETS",
    "EngineChoice",
    "Fingerprint",
    "ProbeEngine",
    "bundled_paths",
    "bundled_snapshot",
    "choose_engine",
    "live_engine",
    "format_cudnn_version",
    "target_name",
]
