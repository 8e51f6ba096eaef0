"""The process's default store: SQLite in default_cache_dir(), or memory."""

from __future__ import annotations

import logging
import threading

from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.store.memory import MemoryStore
from fusedattn_select.store.protocol import CacheUnavailableError
from fusedattn_select.store.sqlite import PersistentStore
from fusedattn_select.store.store_settings import (
    CACHE_DIR_ENV,
    CACHE_SWITCH_ENV,
    cache_switched_off,
    default_cache_dir,
    directory_problem,
    max_bytes_from_env,
)

log = logging.getLogger("fusedattn_select")


class _FallbackWarning:
    """Whether this process has warned that its store fell back to memory (once per process)."""

    def __init__(self) -> None:
        self.given = False
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        self.lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there


_fallback_warning = _FallbackWarning()


def open_default_store(max_bytes: int | None = None, *, read_only: bool = False) -> PersistentStore | MemoryStore:
    """The store for this process: SQLite in default_cache_dir(), or memory.

    Memory when $FUSEDATTN_SELECT_CACHE=off (`switched_off` says so), or when the cache directory
    cannot be used (`degraded` says why; one warning per process). With `read_only`, the store a
    command that only looks gets: it creates, writes and moves nothing, and is memory (degraded)
    exactly when a writing process would get memory.
    """
    # A command that only looks (info) reports an invalid setting in its own output: a warning would say it twice.
    switch = cache_switched_off(quiet=read_only)
    if read_only and max_bytes is None:
        max_bytes = max_bytes_from_env(quiet=True)
    if switch:
        log.info("fusedattn_select: %s=%s: decisions are kept in memory only", CACHE_SWITCH_ENV, switch)
        return MemoryStore(max_bytes, switched_off=f"{CACHE_SWITCH_ENV}={switch}")
    directory = default_cache_dir()
    try:
        if not read_only:
            return PersistentStore(directory, max_bytes)
        problem = directory_problem(directory)
        if problem:
            raise CacheUnavailableError(problem)
        return PersistentStore(directory, max_bytes, read_only=True)
    except CacheUnavailableError as err:
        _warn_fallback(err, quiet=read_only)
        return MemoryStore(max_bytes, degraded=str(err))


def _warn_fallback(err: CacheUnavailableError, quiet: bool) -> None:
    with _fallback_warning.lock:
        # A command that only looks reports the reason itself: its lookup is not the warning.
        first = not _fallback_warning.given and not quiet
        _fallback_warning.given = _fallback_warning.given or first
    (log.warning if first else log.debug)(
        "fusedattn_select: %s; decisions are kept in memory for this process only (set %s to a "
        "writable directory, or %s=off to silence this)", err, CACHE_DIR_ENV, CACHE_SWITCH_ENV,
    )
