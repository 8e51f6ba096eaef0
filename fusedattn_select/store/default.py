"""The process's default store: SQLite in default_cache_dir(), or memory."""

from __future__ import annotations

import logging
import threading

from fusedattn_select.store.memory import MemoryStore
from fusedattn_select.store.protocol import CacheUnavailableError
from fusedattn_select.store.settings import (
    CACHE_DIR_ENV,
    CACHE_SWITCH_ENV,
    cache_switched_off,
    default_cache_dir,
)
from fusedattn_select.store.sqlite import PersistentStore

log = logging.getLogger("fusedattn_select")

_fallback_warned = False
_fallback_lock = threading.Lock()


def open_default_store(max_bytes: int | None = None) -> PersistentStore | MemoryStore:
    """The store for this process: SQLite in default_cache_dir(), or memory.

    Memory when $FUSEDATTN_SELECT_CACHE=off, or (with one warning per process) when the cache
    directory cannot be used.
    """
    global _fallback_warned
    switch = cache_switched_off()
    if switch:
        log.info("fusedattn_select: %s=%s: decisions are kept in memory only", CACHE_SWITCH_ENV, switch)
        return MemoryStore(max_bytes)
    try:
        return PersistentStore(default_cache_dir(), max_bytes)
    except CacheUnavailableError as err:
        with _fallback_lock:
            first, _fallback_warned = not _fallback_warned, True
        (log.warning if first else log.debug)(
            "fusedattn_select: %s; decisions are kept in memory for this process only (set %s to a "
            "writable directory, or %s=off to silence this)", err, CACHE_DIR_ENV, CACHE_SWITCH_ENV,
        )
        return MemoryStore(max_bytes)
