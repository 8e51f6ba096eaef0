"""Where the persistent store lives and how large a store may grow: the environment's settings."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from fusedattn_select.errors import ConfigError

log = logging.getLogger("fusedattn_select")

CACHE_DIR_ENV = "FUSEDATTN_SELECT_CACHE_DIR"
CACHE_SWITCH_ENV = "FUSEDATTN_SELECT_CACHE"
MAX_BYTES_ENV = "FUSEDATTN_SELECT_CACHE_MAX_BYTES"
CACHE_OFF_VALUES = ("off", "0", "false", "no")
CACHE_ON_VALUES = ("on", "1", "true", "yes")
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


CACHE_SWITCH_ALLOWED = (f"must be one of {', '.join(CACHE_ON_VALUES)} (persistent cache) or "
                        f"{', '.join(CACHE_OFF_VALUES)} (memory only)")


def cache_switch_problem() -> str:
    """Why $FUSEDATTN_SELECT_CACHE is not a value it takes ("" when unset or valid)."""
    text = os.environ.get(CACHE_SWITCH_ENV, "")
    switch = text.strip().lower()
    if not switch or switch in CACHE_OFF_VALUES + CACHE_ON_VALUES:
        return ""
    return f"{CACHE_SWITCH_ENV}={text!r}: {CACHE_SWITCH_ALLOWED}"


def check_cache_switch() -> None:
    """Raise ConfigError naming $FUSEDATTN_SELECT_CACHE when it holds a value it does not take."""
    if cache_switch_problem():
        raise ConfigError(CACHE_SWITCH_ENV, os.environ[CACHE_SWITCH_ENV], CACHE_SWITCH_ALLOWED)


_switch_warned: set[str] = set()


def cache_switched_off() -> str:
    """The value of $FUSEDATTN_SELECT_CACHE when it turns persistence off, else "".

    A value it does not take means on, with one warning per value per process (commands refuse
    it instead: check_cache_switch).
    """
    switch = os.environ.get(CACHE_SWITCH_ENV, "").strip().lower()
    problem = cache_switch_problem()
    if problem and switch not in _switch_warned:
        _switch_warned.add(switch)
        log.warning("fusedattn_select: %s; using the persistent cache", problem)
    return switch if switch in CACHE_OFF_VALUES else ""


def directory_problem(directory: Path) -> str:
    """Why a persistent store could not be created or written in `directory` ("" when it could),
    found without creating anything."""
    probe = directory
    while not probe.exists():
        if probe.parent == probe:
            return f"cache directory {directory} cannot be created (no existing parent)"
        probe = probe.parent
    if not probe.is_dir():
        return f"cache directory {directory} cannot be created ({probe} is not a directory)"
    if not os.access(probe, os.W_OK | os.X_OK):
        verb = "is not writable" if probe == directory else f"cannot be created ({probe} is not writable)"
        return f"cache directory {directory} {verb}"
    return ""


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
