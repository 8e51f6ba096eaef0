"""The store contract: what selection, warmup and dispatch may ask of a decision and plan store.

A store keeps three kinds of rows: decisions (verdicts), serialized plans, and runner choices (which
of two exact runners was measured faster for a bucket: JSON timings, no native code, so they are
kept wherever decisions are, even where plans are refused). Entries belong to a fingerprint: `get`,
`get_plan` and `get_runner_choice` only return rows written under `fingerprint.key()`. `put`
raises ValueError for FAILED verdicts (incidents are never cached) and never replaces a deeper
decision with a shallower "yes" (a rejection replaces any: entry_rows.keeps_stored); otherwise a
store never raises into selection: a locked, full or damaged database is a miss (or a skipped
write) with a warning. Rows that do not parse, verdict lists that hold a FAILED verdict, runner
choices that are not one (entries.RUNNER_CHOICE_FIELDS) and plans whose sha256 or size do not match
are deleted with a warning and reported as a miss.

The whole-store operations a user asks for say when they fail, by raising CacheError: `clear()`
when it cannot clear (a read-only store, a database that cannot be written; nothing is removed
then), `export()` when the file cannot be written, `import_()` when the file is not an export
(nothing is imported then; rows it skips are listed in its ImportReport).

A store holds at most `max_bytes` of payload: over it, it evicts the least recently used rows,
plans first, then runner choices (a few timed calls measure one again), then decisions, down to
EVICT_TO_FRACTION of the bound.

`key_lock` is the cross-process half of single flight: the code that probes or builds on a miss
takes it, re-reads the store (another process may have written the entry meanwhile), and writes
inside the lock. It is re-entrant per thread. It yields False when it had to go on without
exclusivity (after `timeout`): a hung probe elsewhere costs a duplicate probe, never a deadlock.

`persistent` says whether entries outlive the process (and are shared with other processes);
`plans_enabled` whether `get_plan` and `put_plan` keep serialized plans at all.

`info()` returns the totals (kind, path, entries, plans, runner_choices, bytes, max_bytes) and the
state, STATE_KEYS: persistent; read_only; degraded (why the persistent store could not be used, when that is why this
one is memory, else None); switched_off ("FUSEDATTN_SELECT_CACHE=off" when memory was asked for);
plans_enabled and plans_refused (why plans are refused, else None); damage (what is wrong with the
database file and not repaired yet, else None); failed_writes (writes of decisions, plans and runner
choices this store could not persist since it was opened: each was a put(), put_plan() or
put_runner_choice() that returned False for want of a working database, not by choice); write_failure (why the first of the latest run of
failed writes failed, else None).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, runtime_checkable

from fusedattn_select.errors import FusedAttnSelectError
from fusedattn_select.types import Fingerprint, ProbeDepth, Verdict

# A full probe of one problem (forward and backward builds) takes ~0.5-1.5 s; waiting minutes for
# another process's probe means that probe hangs, and probing here is better than waiting on.
KEY_LOCK_TIMEOUT_S = 120.0
# Eviction frees down to this fraction of max_bytes, so a full store does not evict on every put.
EVICT_TO_FRACTION = 0.9
# The version of the database schema and of the export file format; both stores and export files
# share it. Schema 2 added the runner_choices table (schema 1 kept runner choices as plan rows);
# a schema 1 database is upgraded in place when a writer opens it (schema.py).
SCHEMA_VERSION = 2

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
    runner_choices: int = 0

    @property
    def imported(self) -> int:
        return self.verdicts + self.plans + self.runner_choices

    def to_dict(self) -> dict:
        return {
            "imported": self.imported,
            "verdicts": self.verdicts,
            "plans": self.plans,
            "runner_choices": self.runner_choices,
            "skipped": [{"row": row, "reason": reason} for row, reason in self.skipped],
        }


@runtime_checkable
class Store(Protocol):
    """A store of verdicts, serialized execution plans and runner choices, keyed by fingerprint and key.

    `kind` is what `info()["kind"]` reports ("sqlite", "memory"); `path` the database file, or
    None for a store without one.
    """

    # Read-only for callers (properties or plain attributes of an implementation both satisfy them).
    @property
    def kind(self) -> str: ...

    @property
    def path(self) -> Path | None: ...

    @property
    def persistent(self) -> bool: ...

    @property
    def plans_enabled(self) -> bool: ...

    def get(self, fingerprint: Fingerprint, key: str) -> Entry | None: ...

    def put(self, fingerprint: Fingerprint, key: str, verdicts: Iterable[Verdict], depth: ProbeDepth) -> bool: ...

    def get_plan(self, fingerprint: Fingerprint, plan_key: str) -> bytes | None: ...

    def put_plan(self, fingerprint: Fingerprint, plan_key: str, blob: bytes) -> bool: ...

    def get_runner_choice(self, fingerprint: Fingerprint, key: str) -> dict[str, Any] | None: ...

    def put_runner_choice(self, fingerprint: Fingerprint, key: str, choice: Mapping[str, Any]) -> bool: ...

    def key_lock(self, fingerprint: Fingerprint, key: str,
                 timeout: float = KEY_LOCK_TIMEOUT_S) -> contextlib.AbstractContextManager[bool]: ...

    def info(self) -> dict[str, object]: ...

    def clear(self) -> None: ...

    def export(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> dict: ...

    def import_(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> ImportReport: ...
