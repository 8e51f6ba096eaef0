"""The engine and store a command answers with: live cuDNN, a recorded snapshot, or the platform rule.

Commands call these through the module (`engines.live_engine()`), so a test can replace one.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from fusedattn_select.errors import (
    ConfigError,
    FusedAttnSelectError,
    PlatformError,
    SnapshotError,
)
from fusedattn_select.probing import SNAPSHOT_ENV, bundled_snapshot, discover_engine
from fusedattn_select.probing.engine import ProbeEngine
from fusedattn_select.probing.rocm import detect_rocm_device, select_rocm_engine
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store import Store, open_default_store
from fusedattn_select.types import Provenance, format_cudnn_version

log = logging.getLogger("fusedattn_select")

# Suites recorded per target and shipped with the package (see probing.bundled_snapshot).
BUNDLED_SUITES = ("configs", "hopper-suite")
DEFAULT_TARGET = "h100"


def bundled_paths(target: str) -> list[Path]:
    """Where the snapshots bundled for `target` belong, one per suite, installed or not."""
    return [bundled_snapshot(target, suite) for suite in BUNDLED_SUITES]


def _bundled_files(target: str) -> list[Path]:
    return [path for path in bundled_paths(target) if path.is_file()]


def _missing_bundled(target: str) -> str:
    paths = bundled_paths(target)
    return (
        f"no bundled snapshot for {target} is installed ({', '.join(p.name for p in paths)} missing "
        f"in {paths[0].parent}); record one on that GPU with `fusedattn-select snapshot record`"
    )


def _bundled_engine(target: str) -> SnapshotEngine:
    files = _bundled_files(target)
    if not files:
        raise SnapshotError(_missing_bundled(target))
    return SnapshotEngine.load_many(files)


def live_engine() -> tuple[ProbeEngine | None, str]:
    """The live cuDNN engine, ignoring $FUSEDATTN_SELECT_SNAPSHOT: (engine, "") or (None, why)."""
    # The live engine's modules (~17 ms to import) load only when a live device is asked for;
    # they import cudnn-frontend (the optional 'cuda' extra) on first use, raising PlatformError
    # when it is absent.
    from fusedattn_select.probing.cudnn.engine import CudnnEngine

    try:
        return CudnnEngine(), ""
    except PlatformError as err:
        return None, str(err)
    except Exception as err:  # noqa: BLE001 - the CLI reports a broken platform, never a traceback
        return None, f"the cuDNN engine failed to start: {type(err).__name__}: {err}"


def discovered_engine() -> tuple[ProbeEngine | None, str]:
    """discover_engine(), with a broken platform reported like live_engine() reports it."""
    try:
        return discover_engine()
    except FusedAttnSelectError:
        raise
    except Exception as err:  # noqa: BLE001 - see live_engine
        return None, f"the cuDNN engine failed to start: {type(err).__name__}: {err}"


def open_store() -> Store | None:
    """The persistent decision store for live answers; None (answer from memory) when it fails."""
    try:
        return open_default_store()
    except Exception as err:  # noqa: BLE001 - the store only saves time; answer without it
        log.warning("fusedattn_select: persistent cache unavailable (%s); answering from memory", err)
        return None


def _describe_snapshot(engine: SnapshotEngine) -> str:
    first = engine.files[0]
    fp = first.fingerprint
    return (
        f"{fp.device_name or fp.platform}, cuDNN {format_cudnn_version(fp.cudnn_backend_version)} "
        f"on {first.recorded_on}"
    )


def rocm_selector(arch: str | None) -> tuple[Selector, str]:
    """A selector answering from the ROCm declared tables for `arch` (default: this machine's first
    AMD GPU), and the notice saying the answers are declared, not probed."""
    if arch is None:
        facts = detect_rocm_device()
        if not facts.archs:
            raise ConfigError(
                "--arch", None,
                f"no AMD GPU arch to answer for ({facts.describe()}); pass --arch gfxNNN for declared answers",
            )
        arch = facts.archs[0]
    if not re.fullmatch(r"gfx[0-9a-f]+(:[\w:+-]*)?", arch):
        raise ConfigError("--arch", arch, "must be an AMD GPU target such as 'gfx942' or 'gfx90a'")
    engine, reason = select_rocm_engine(arch)
    notice = f"ROCm {engine.fingerprint().device_name}: {reason}" if reason else ""
    return Selector(engine), notice


def choose_selector(snapshot: str | None, target: str | None) -> tuple[Selector, str]:
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
        engine, reason = discovered_engine()
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
    store = None if engine.provenance is Provenance.SNAPSHOT else open_store()
    return Selector(engine, store=store), notice
