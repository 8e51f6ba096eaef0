"""Where the persistent store lives and how large a store may grow: the environment's settings."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path

from fusedattn_select import settings
from fusedattn_select.errors import ConfigError
from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.settings import (  # noqa: F401 - the store's names for them
    CACHE_OFF_VALUES,
    CACHE_ON_VALUES,
    CACHE_SWITCH_ALLOWED,
    DEFAULT_MAX_BYTES,
)

log = logging.getLogger("fusedattn_select")

CACHE_DIR_ENV = settings.CACHE_DIR
CACHE_SWITCH_ENV = settings.CACHE
MAX_BYTES_ENV = settings.CACHE_MAX_BYTES
# The persistent store's database file in its directory (sqlite.py).
DATABASE_NAME = "decisions.sqlite3"


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


def cache_switch_problem() -> str:
    """Why $FUSEDATTN_SELECT_CACHE is not a value it takes ("" when unset or valid)."""
    try:
        settings.value(CACHE_SWITCH_ENV)
    except ConfigError as err:
        return str(err)
    return ""


def check_cache_switch() -> None:
    """Raise ConfigError naming $FUSEDATTN_SELECT_CACHE when it holds a value it does not take."""
    if cache_switch_problem():
        raise ConfigError(CACHE_SWITCH_ENV, os.environ[CACHE_SWITCH_ENV], CACHE_SWITCH_ALLOWED)


class _InvalidValuesWarned:
    """The invalid (variable, value) pairs this process has warned about: each once."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        self._lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there

    def first(self, variable: str, value: str) -> bool:
        """Whether this is the first time (variable, value) is seen (a warning is due)."""
        with self._lock:
            new = (variable, value) not in self._seen
            self._seen.add((variable, value))
            return new


_warned = _InvalidValuesWarned()


def cache_switched_off(quiet: bool = False) -> str:
    """The value of $FUSEDATTN_SELECT_CACHE when it turns persistence off, else "".

    A value it does not take means on, with one warning per value per process (commands refuse
    it instead: check_cache_switch); `quiet` (a command that only looks and reports it): no warning.
    """
    switch = os.environ.get(CACHE_SWITCH_ENV, "").strip().lower()
    problem = cache_switch_problem()
    if problem and not quiet and _warned.first(CACHE_SWITCH_ENV, switch):
        log.warning("fusedattn_select: %s; using the persistent cache", problem)
    return switch if switch in CACHE_OFF_VALUES else ""


def directory_problem(directory: Path) -> str:
    """Why a persistent store could not be created or written in `directory` ("" when it could).

    The directory, or where it does not exist its nearest existing parent, must let this user create
    files. Found without creating anything, but for one case: as root, access(2) grants every write,
    so where the directory is on a file system without storage (proc, sysfs) a probe directory is made
    and removed at once in it, the only test of such a file system that does not guess. A database
    file that cannot be written is not this: its rows can still be read (`database_not_writable`).
    """
    probe = directory
    try:
        while not probe.exists():
            if probe.parent == probe:
                return f"cache directory {directory} cannot be created (no existing parent)"
            probe = probe.parent
        if not probe.is_dir():
            return f"cache directory {directory} cannot be created ({probe} is not a directory)"
    except OSError as err:  # a name too long, a directory that cannot be searched
        return f"cache directory {directory} cannot be used ({err.strerror or err})"
    creating = probe != directory
    if not os.access(probe, os.W_OK | os.X_OK):
        verb = f"cannot be created ({probe} is not writable)" if creating else "is not writable"
        return f"cache directory {directory} {verb}"
    refused = _refused_by_file_system(probe)
    if refused:
        return f"cache directory {directory} {'cannot be created' if creating else 'is not writable'} ({refused})"
    return ""


def database_not_writable(directory: Path) -> str:
    """Why the database file in `directory` (or a WAL file beside it) cannot be written by this user ("" when
    it can, or does not exist): its rows are read, and every save fails."""
    for path in database_files(directory):
        if os.path.lexists(path) and not os.access(path, os.W_OK):
            return f"decision cache {path} is not writable by this user"
    return ""


def database_files(directory: Path) -> tuple[Path, ...]:
    """The database file in `directory` and the WAL files SQLite keeps beside it: a writer writes all
    three. Where the file is a symbolic link SQLite keeps them beside the file it leads to: those too."""
    path = directory / DATABASE_NAME
    real = Path(os.path.realpath(path))
    beside = dict.fromkeys(place.with_name(place.name + suffix)
                           for place in (path, real) for suffix in ("-wal", "-shm"))
    return (path, *beside)


def _refused_by_file_system(directory: Path) -> str:
    """Why `directory`'s file system refuses new files to root, found by trying ("" when it takes them or when
    access(2) already told: the caller asks it first). Only root on a file system without storage tries."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not hasattr(os, "statvfs"):
        return ""
    try:
        if os.statvfs(directory).f_blocks:  # a file system with storage takes root's files where access(2) says so
            return ""
        os.rmdir(tempfile.mkdtemp(prefix=".fusedattn-select-probe-", dir=directory))
    except OSError as err:
        return err.strerror or str(err)
    return ""


def max_bytes_from_env(quiet: bool = False) -> int:
    """$FUSEDATTN_SELECT_CACHE_MAX_BYTES (bytes; K, M, G, T suffixes are powers of 1024).

    A value it does not take means the default, with one warning per value per process (commands
    refuse it instead: fusedattn_select.settings.check_all); `quiet`: no warning (as cache_switched_off)."""
    try:
        return int(settings.value(MAX_BYTES_ENV))
    except ConfigError as err:
        text = os.environ.get(MAX_BYTES_ENV, "")
        if not quiet and _warned.first(MAX_BYTES_ENV, text):
            log.warning("fusedattn_select: %s; using %d MiB", err, DEFAULT_MAX_BYTES // 1024**2)
        return DEFAULT_MAX_BYTES


def resolve_max_bytes(max_bytes: int | None) -> int:
    """A store's bound: `max_bytes` checked (ValueError), or the environment's when None."""
    if max_bytes is None:
        return max_bytes_from_env()
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes={max_bytes!r}: must be a positive integer number of bytes")
    return max_bytes
