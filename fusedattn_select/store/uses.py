"""Last-use stamps of the rows a store reads, for least-recently-used eviction, written in batches.

A read never waits for the write lock: a stamp is kept in memory and written by the store's next
write (inside its transaction), or by a try that gives up at once when another connection writes,
at most once every FLUSH_INTERVAL_S.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Callable

from fusedattn_select.forking import renew_locks_after_fork

# Stamps of rows read wait at most this long for a write to carry them.
FLUSH_INTERVAL_S = 1.0

# (table, key column, fingerprint key, key)
Use = tuple[str, str, str, str]


class PendingUses:
    """The stamps not written yet. `try_write(action)` runs action(conn) in a write transaction
    only when that needs no wait (the database's), and says whether it did."""

    def __init__(self, try_write: Callable[[Callable[[sqlite3.Connection], object]], bool]) -> None:
        self._try_write = try_write
        self._uses: dict[Use, float] = {}
        self._tried = 0.0  # monotonic time of the last try to write them
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        self._lock = threading.Lock()

    def note(self, table: str, key_column: str, fp_key: str, key: str) -> None:
        """A row was read now; written with the next write, or now when the last try is old enough."""
        now = time.monotonic()
        with self._lock:
            self._uses[(table, key_column, fp_key, key)] = time.time()
            due = now - self._tried >= FLUSH_INTERVAL_S
            if due:
                self._tried = now
        if due:
            self._try_write(self.write)

    def flush(self) -> None:
        """Write what is pending if that needs no wait (a store closing)."""
        if self._uses:
            self._try_write(self.write)

    def write(self, conn: sqlite3.Connection) -> None:
        """Write the pending stamps, inside the caller's write transaction."""
        with self._lock:
            uses, self._uses = self._uses, {}
        try:
            for (table, key_column, fp_key, key), when in uses.items():
                conn.execute(f"UPDATE {table} SET last_used = MAX(last_used, ?) "
                             f"WHERE fingerprint_key = ? AND {key_column} = ?", (when, fp_key, key))
        except BaseException:
            with self._lock:  # kept for the next write (a failed commit after this loses them:
                for use, when in uses.items():  # they only order eviction)
                    self._uses.setdefault(use, when)
            raise
