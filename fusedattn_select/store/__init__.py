"""Stores of decisions and serialized plans: the `Store` protocol, its SQLite and memory implementations.

    protocol.py       the contract every caller is typed against (Store), its errors and ImportReport
    sqlite.py         PersistentStore: one SQLite file shared by processes (database.py: the file itself)
    memory.py         MemoryStore: the same behaviour, private to one process
    entry_rows.py     checking, encoding and validating rows (shared by both stores and transfer.py)
    locks.py          key locks: threads, and flock files across processes
    transfer.py       export to and import from a JSON file
    store_settings.py environment variables: where the store lives, how large it may grow
    default.py        open_default_store: the store this process uses
"""

from fusedattn_select.store.default import open_default_store
from fusedattn_select.store.memory import MemoryStore
from fusedattn_select.store.protocol import (
    KEY_LOCK_TIMEOUT_S,
    CacheError,
    CacheUnavailableError,
    Entry,
    ImportReport,
    Store,
)
from fusedattn_select.store.sqlite import DATABASE_NAME, PersistentStore
from fusedattn_select.store.store_settings import (
    CACHE_DIR_ENV,
    CACHE_OFF_VALUES,
    CACHE_SWITCH_ENV,
    DEFAULT_MAX_BYTES,
    MAX_BYTES_ENV,
    default_cache_dir,
    max_bytes_from_env,
)

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_OFF_VALUES",
    "CACHE_SWITCH_ENV",
    "DATABASE_NAME",
    "DEFAULT_MAX_BYTES",
    "KEY_LOCK_TIMEOUT_S",
    "MAX_BYTES_ENV",
    "CacheError",
    "CacheUnavailableError",
    "Entry",
    "ImportReport",
    "MemoryStore",
    "PersistentStore",
    "Store",
    "default_cache_dir",
    "max_bytes_from_env",
    "open_default_store",
]
