"""The store contract: what selection, warmup and dispatch may ask of a decision and plan store.

Entries belong to a fingerprint: `get` and `get_plan` only return rows written under
`fingerprint.key()`. `put` raises ValueError for FAILED verdicts (incidents are never cached) and
never replaces a FULL entry with a FAST one; otherwise a store never raises into selection: a
locked, full or damaged database is a miss (or a skipped write) with a warning. Rows that do not
parse, verdict lists that hold a FAILED verdict and plans whose sha256 or size do not match are
deleted with a warning and reported as a miss.

The whole-store operations a user asks for say when they fail, by raising CacheError: `clear()`
when it cannot clear (a read-only store, a database that cannot be written; nothing is removed
then), `export()` when the file cannot be written, `import_()` when the file is not an export
(nothing is imported then; rows it skips are listed in its ImportReport).

A store holds at most `max_bytes` of payload: over it, it evicts the least recently used rows,
plans before decisions, down to EVICT_TO_FRACTION of the bound.

`key_lock` is the cross-process half of single flight: the code that probes or builds on a miss
takes it, re-reads the store (another process may have written the entry meanwhile), and writes
inside the lock. It is re-entrant per thread. It yields False when it had to go on without
exclusivity (after `timeout`): a hung probe elsewhere costs a duplicate probe, never a deadlock.

`persistent` says whether entries outlive the process (and are shared with other processes);
`plans_enabled` whether `get_plan` and `put_plan` keep serialized plans at all.

`info()` returns the totals (kind, path, entries, plans, bytes, max_bytes) and the state, STATE_KEYS:
persistent; read_only; degraded (why the persistent store could not be used, when that is why this
one is memory, else None); switched_off ("FUSEDATTN_SELECT_CACHE=off" when memory was asked for);
plans_enabled and plans_refused (why plans are refused, else None); damage (what is wrong with the
database file and not repaired yet, else None); failed_writes (writes of decisions and plans this
store could not persist since it was opened: each was a put() or put_plan() that returned False
for want of a working database, not by choice); write_failure (why the first of the latest run of
failed writes failed, else None).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, runtime_checkable

from fusedattn_select.errors import FusedAttnSelectError
from fusedattn_select.types import Fingerprint, ProbeDepth, Verdict

# A full probe of one problem (forward and backward builds) takes ~0.5-1.5 s; waiting minutes for
# another process's probe means that probe hangs, and probing here is better than waiting on.
KEY_LOCK_TIMEOUT_S = 120.0
# Eviction frees down to this fraction of max_bytes, so a full store does not evict on every put.
EVICT_TO_FRACTION = 0.9
# The version of the database schema and of the export file format; both stores and export files
# share it.
SCHEMA_VERSION = 1

Entry = tuple[tuple[Verdict, ...], ProbeDepth]
STATE_KEYS = ("persistent", "read_only", "degraded", "switched_off", "plans_enabled", "plans_refused", "damage",
              "failed_writes", "write_failure")


class CacheError(FusedAttnSelectError):
    """A cache file (the database or an export) cannot be used."""


class CacheUnavailableError(CacheError):
    """The persistent store cannot be opened here (unwritable directory, newer schema)."""


@dataclass(frozen=True)
class ImportReport:
    """What import_() took from an export file, and every row it skipped with the reason."""

    verdicts: int
    plans: int
    skipped: tuple[tuple[str, str], ...] = ()  # (row, reason)

    @property
    def imported(self) -> int:
        return self.verdicts + self.plans

    def to_dict(self) -> dict:
        return {
            "imported": self.imported,
            "verdicts": self.verdicts,
            "plans": self.plans,
            "skipped": [{"row": row, "reason": reason} for row, reason in self.skipped],
        }


@runtime_checkable
class Store(Protocol):
    """A store of verdicts and serialized execution plans, keyed by fingerprint and key.

    `kind` is what `info()["kind"]` reports ("sqlite", "memory"); `path` the database file, or
    None for a store without one.
    """

    kind: str
    path: Path | None
    persistent: bool
    plans_enabled: bool

    def get(self, fingerprint: Fingerprint, key: str) -> Entry | None: ...

    def put(self, fingerprint: Fingerprint, key: str, verdicts: Iterable[Verdict], depth: ProbeDepth) -> bool: ...

    def get_plan(self, fingerprint: Fingerprint, plan_key: str) -> bytes | None: ...

    def put_plan(self, fingerprint: Fingerprint, plan_key: str, blob: bytes) -> bool: ...

    def key_lock(self, fingerprint: Fingerprint, key: str,
                 timeout: float = KEY_LOCK_TIMEOUT_S) -> contextlib.AbstractContextManager[bool]: ...

    def info(self) -> dict[str, object]: ...

    def clear(self) -> None: ...

    def export(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> dict: ...

    def import_(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> ImportReport: ...
