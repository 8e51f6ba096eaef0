"""The engine a command answers with: the same choice as the library's (probing.choose_engine), or
ROCm's declared tables.

Commands call these through the module (`engines.live_engine()`), so a test can replace one.
"""

from __future__ import annotations

import argparse
import logging
import re

from fusedattn_select.errors import ConfigError
from fusedattn_select.probing import TARGETS, bundled_paths, choice, target_name
from fusedattn_select.probing.engine_protocol import ProbeEngine
from fusedattn_select.probing.rocm import DeclaredRocmEngine, detect_rocm_device, select_rocm_engine
from fusedattn_select.selection.selector import Selector, selector_for
from fusedattn_select.store import Store, open_default_store

__all__ = ["add_source_options", "bundled_paths", "choose_selector", "live_engine", "open_store", "rocm_selector"]

log = logging.getLogger("fusedattn_select")

# An AMD GPU target as LLVM names it: "gfx", the major version (6-19), a minor digit and a stepping digit 0-9 or a-f
# (gfx90a, gfx942, gfx950, gfx1100, gfx1201), then any feature flags as gcnArchName gives them (":sramecc+:xnack-").
GFX_TARGET = re.compile(r"gfx(?:[6-9]|1[0-9])[0-9][0-9a-f](?::[a-z0-9_]+[+-])*")
GFX_TARGET_FORM = ("must be an AMD GPU target as LLVM names it: 'gfx', the major version (6-19), a minor digit and a "
                   "stepping digit 0-9 or a-f, such as 'gfx90a', 'gfx942', 'gfx1100' or 'gfx1201', optionally with "
                   "feature flags ('gfx942:sramecc+:xnack-')")


def live_engine() -> tuple[ProbeEngine | None, str]:
    """The live cuDNN engine, ignoring snapshots: (engine, "") or (None, why); see probing.choice."""
    return choice.live_engine()


def open_store() -> Store | None:
    """The persistent decision store for live answers; None (answer from memory) when it fails."""
    try:
        return open_default_store()
    except Exception as err:  # noqa: BLE001 - the store only saves time; answer without it
        log.warning("fusedattn_select: persistent cache unavailable (%s); answering from memory", err)
        return None


def _target(text: str) -> str:
    """argparse type for --target: a bundled target, in any case ("H100" is "h100")."""
    try:
        return target_name(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """`--snapshot FILE` (repeatable) or `--target NAME`: where a command's answers come from."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--snapshot", metavar="FILE", action="append",
                        help="answer from this recorded snapshot (repeat to merge snapshots of one device)")
    source.add_argument("--target", type=_target, metavar="{" + ",".join(TARGETS) + "}",
                        help="answer from the snapshots bundled for this GPU (any case)")


def rocm_selector(arch: str | None) -> tuple[Selector, str]:
    """A selector answering from the ROCm declared tables for `arch` (default: this machine's first
    AMD GPU), and the notice saying the answers are declared, not probed."""
    if arch is None:
        facts = detect_rocm_device()
        if not facts.archs:
            # Without hip-python the reason (NO_HIP_PYTHON) says to pip install 'fusedattn-select[rocm]': said once.
            raise ConfigError(
                "--arch", None,
                f"no AMD GPU arch to answer for ({facts.describe()}); pass --arch gfxNNN for declared answers",
            )
        arch = facts.archs[0]
    if not GFX_TARGET.fullmatch(arch):
        raise ConfigError("--arch", arch, GFX_TARGET_FORM)
    engine, reason = select_rocm_engine(arch)
    notice = f"ROCm {engine.fingerprint().device_name}: {reason}" if reason else ""
    listed = engine.listed() if isinstance(engine, DeclaredRocmEngine) else {}
    if listed and not any(engine.arch in archs for archs in listed.values()):
        notice += ("; " if notice else "") + (
            f"{engine.arch} is an architecture no declared table lists (" + "; ".join(
                f"{name}: {', '.join(archs)}" for name, archs in listed.items())
            + "): only pytorch_sdpa can declare it, by dtypes and head dims, and AOTriton decides at run time "
              "whether it runs at all")
    return Selector(engine, notice=notice), notice


def choose_selector(snapshots: list[str] | None, target: str | None) -> tuple[Selector, str]:
    """The selector a command answers with (the library's choice: selection.selector_for), and the
    notice line when it is not what the user named; ConfigError naming --snapshot for an empty one."""
    for path in snapshots or ():
        # Checked here, not by the library: it names its own argument (snapshots[0]) and Python's types.
        if not path:
            raise ConfigError("--snapshot", path, "is an empty path, which names no file: give a snapshot file's path")
    selector = selector_for(snapshots, target)
    return selector, selector.notice
