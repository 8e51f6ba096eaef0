"""Where the persistent store lives and how large a store may grow: the environment's settings."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger("fusedattn_select")

CACHE_DIR_ENV = "FUSEDATTN_SELECT_CACHE_DIR"
CACHE_SWITCH_ENV = "FUSEDATTN_SELECT_CACHE"
MAX_BYTES_ENV = "FUSEDATTN_SELECT_CACHE_MAX_BYTES"
CACHE_OFF_VALUES = ("off", "0", "false", "no")
DEFAULT_MAX_BYTES = 512 * 1024**2

_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def default_cache_dir() -> Path:
    """$FUSEDATTN_SELECT_CACHE_DIR, else $XDG_CACHE_HOME/fusedattn-select, else ~/.cache/fusedattn-select."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore relative paths
        return Path(xdg) / "fusedattn-select"
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "fusedattn-select"
    return Path.home() / ".cache" / "fusedattn-select"


def cache_switched_off() -> str:
    """The value of $FUSEDATTN_SELECT_CACHE when it turns persistence off, else ""."""
    switch = os.environ.get(CACHE_SWITCH_ENV, "").strip().lower()
    return switch if switch in CACHE_OFF_VALUES else ""


def max_bytes_from_env() -> int:
    """$FUSEDATTN_SELECT_CACHE_MAX_BYTES (bytes; K, M, G, T suffixes are powers of 1024)."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    match = re.fullmatch(r"(\d+)\s*([kmgt]?)(?:i?b)?", text.lower())
    if match is None or int(match.group(1)) <= 0:
        log.warning(
            "fusedattn_select: %s=%r: must be a positive number of bytes (K, M, G suffixes allowed); "
            "using %d MiB", MAX_BYTES_ENV, text, DEFAULT_MAX_BYTES // 1024**2,
        )
        return DEFAULT_MAX_BYTES
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def resolve_max_bytes(max_bytes: int | None) -> int:
    """A store's bound: `max_bytes` checked (ValueError), or the environment's when None."""
    if max_bytes is None:
        return max_bytes_from_env()
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes={max_bytes!r}: must be a positive integer number of bytes")
    return max_bytes
