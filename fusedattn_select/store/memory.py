"""The memory store: the persistent store's behaviour over dicts, private to one process.

Used when persistence is off ($FUSEDATTN_SELECT_CACHE=off) or impossible (no writable directory).
It keeps plans and runner choices too (`plans_enabled` is True), bounded by max_bytes like decisions, but they die
with the process (`persistent` is False): callers that gain from plans only across processes
check `persistent`. Its key locks exclude threads only. `degraded` says why the persistent store
could not be used when that is why this one is memory; `switched_off` the value of
$FUSEDATTN_SELECT_CACHE when it was turned off.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Iterable, Mapping

from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.store.entry_rows import (
    NewEntry,
    NewRunnerChoice,
    Written,
    check_fingerprint,
    keeps_stored,
    new_entry,
    new_runner_choice,
    plan_export_row,
    plan_to_store,
    runner_choice_export_row,
    verdict_export_row,
)
from fusedattn_select.store.locks import KeyLocks
from fusedattn_select.store.protocol import EVICT_TO_FRACTION, KEY_LOCK_TIMEOUT_S, Entry, ImportReport
from fusedattn_select.store.store_settings import resolve_max_bytes
from fusedattn_select.store.transfer import export_store, import_store
from fusedattn_select.types import Fingerprint, ProbeDepth, Verdict


class MemoryStore:
    """Decisions, plans and runner choices in this process's memory, least recently used last in each dict."""

    kind = "memory"
    path = None
    persistent = False
    plans_enabled = True

    def __init__(self, max_bytes: int | None = None, *, degraded: str = "", switched_off: str = "") -> None:
        self.max_bytes = resolve_max_bytes(max_bytes)
        self.degraded = degraded
        self.switched_off = switched_off
        self._key_locks = KeyLocks()
        self._renew_locks()
        renew_locks_after_fork(self)
        # (fingerprint key, key) -> (entry, when it was stored)
        self._verdicts: OrderedDict[tuple[str, str], tuple[NewEntry, float]] = OrderedDict()
        self._plans: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._runner_choices: OrderedDict[tuple[str, str], tuple[NewRunnerChoice, float]] = OrderedDict()
        self._fingerprints: dict[str, Fingerprint] = {}

    def _renew_locks(self) -> None:
        """A free lock (at first, and in a forked child: a parent thread may have held it at the fork)."""
        self._lock = threading.Lock()

    # ----- decisions ---------------------------------------------------------------------------
    def get(self, fingerprint: Fingerprint, key: str) -> Entry | None:
        check_fingerprint(fingerprint)
        with self._lock:
            stored = self._verdicts.get((fingerprint.key(), key))
            if stored is None:
                return None
            self._verdicts.move_to_end((fingerprint.key(), key))
            return stored[0].verdicts, stored[0].depth

    def put(self, fingerprint: Fingerprint, key: str, verdicts: Iterable[Verdict], depth: ProbeDepth | str) -> bool:
        """False when a deeper decision was kept (entry_rows.keeps_stored)."""
        return self._put(fingerprint, new_entry(fingerprint, key, verdicts, depth)) is Written.STORED

    def _put(self, fingerprint: Fingerprint, entry: NewEntry) -> Written:
        row_key = (entry.fp_key, entry.key)
        with self._lock:
            stored = self._verdicts.get(row_key)
            if stored is not None and keeps_stored(stored[0].depth, entry):
                self._verdicts.move_to_end(row_key)
                return Written.KEPT_DEEPER
            self._fingerprints.setdefault(entry.fp_key, fingerprint)
            self._verdicts[row_key] = (entry, time.time())
            self._verdicts.move_to_end(row_key)
            self._evict(keep=("verdicts", row_key))
        return Written.STORED

    # ----- plans -------------------------------------------------------------------------------
    def put_plan(self, fingerprint: Fingerprint, plan_key: str, blob: bytes) -> bool:
        blob = plan_to_store(fingerprint, plan_key, blob, self.max_bytes)
        if blob is None:
            return False
        fp_key = fingerprint.key()
        with self._lock:
            self._fingerprints.setdefault(fp_key, fingerprint)
            self._plans[(fp_key, plan_key)] = blob
            self._plans.move_to_end((fp_key, plan_key))
            self._evict(keep=("plans", (fp_key, plan_key)))
        return True

    def get_plan(self, fingerprint: Fingerprint, plan_key: str) -> bytes | None:
        check_fingerprint(fingerprint)
        with self._lock:
            blob = self._plans.get((fingerprint.key(), plan_key))
            if blob is not None:
                self._plans.move_to_end((fingerprint.key(), plan_key))
            return blob

    def _plan_refusal(self) -> str:
        return ""  # memory of this process: nothing another user could have planted

    # ----- runner choices ----------------------------------------------------------------------
    def get_runner_choice(self, fingerprint: Fingerprint, key: str) -> dict[str, Any] | None:
        check_fingerprint(fingerprint)
        with self._lock:
            stored = self._runner_choices.get((fingerprint.key(), key))
            if stored is None:
                return None
            self._runner_choices.move_to_end((fingerprint.key(), key))
            return dict(stored[0].choice)

    def put_runner_choice(self, fingerprint: Fingerprint, key: str, choice: Mapping[str, Any]) -> bool:
        """Store `choice` (entries.RUNNER_CHOICE_FIELDS; ValueError otherwise)."""
        return self._put_runner_choice(new_runner_choice(fingerprint, key, choice), fingerprint)

    def _put_runner_choice(self, entry: NewRunnerChoice, fingerprint: Fingerprint) -> bool:
        row_key = (entry.fp_key, entry.key)
        with self._lock:
            self._fingerprints.setdefault(entry.fp_key, fingerprint)
            self._runner_choices[row_key] = (entry, time.time())
            self._runner_choices.move_to_end(row_key)
            self._evict(keep=("runner_choices", row_key))
        return True

    # ----- whole store -------------------------------------------------------------------------
    def key_lock(self, fingerprint: Fingerprint, key: str,
                 timeout: float = KEY_LOCK_TIMEOUT_S) -> contextlib.AbstractContextManager[bool]:
        """Hold the probe of (fingerprint, key) against this process's other threads."""
        return self._key_locks.hold(fingerprint, key, timeout)

    def info(self) -> dict[str, object]:
        with self._lock:
            return {
                "kind": self.kind, "path": None, "entries": len(self._verdicts), "plans": len(self._plans),
                "runner_choices": len(self._runner_choices), "bytes": self._payload_bytes(), "max_bytes": self.max_bytes, "persistent": False,
                "read_only": False, "degraded": self.degraded or None, "switched_off": self.switched_off or None,
                "plans_enabled": True, "plans_refused": None, "damage": None, "failed_writes": 0,
                "write_failure": None,
            }

    def clear(self) -> None:
        with self._lock:
            self._verdicts.clear()
            self._plans.clear()
            self._runner_choices.clear()
            self._fingerprints.clear()

    def export(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> dict:
        """Write every entry (of `fingerprint` only) to a JSON file; see transfer.export_store."""
        return export_store(self, path, fingerprint)

    def import_(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> ImportReport:
        """Load an export file, verifying every row; see transfer.import_store."""
        return import_store(self, path, fingerprint)

    def _export_rows(self, fingerprint_key: str | None) -> tuple[dict, list[dict], list[dict], list[dict]]:
        with self._lock:
            verdicts = [
                verdict_export_row(fp, key, entry.depth, entry.verdicts, created)
                for (fp, key), (entry, created) in sorted(self._verdicts.items()) if fingerprint_key in (None, fp)
            ]
            plans = [
                plan_export_row(fp, key, blob)
                for (fp, key), blob in sorted(self._plans.items()) if fingerprint_key in (None, fp)
            ]
            runner_choices = [
                runner_choice_export_row(fp, key, entry.choice, created)
                for (fp, key), (entry, created) in sorted(self._runner_choices.items()) if fingerprint_key in (None, fp)
            ]
            fingerprints = {
                fp: fingerprint.to_dict() for fp, fingerprint in self._fingerprints.items()
                if fingerprint_key in (None, fp)
            }
        return fingerprints, verdicts, plans, runner_choices

    # ----- size bound --------------------------------------------------------------------------
    def _payload_bytes(self) -> int:
        return (sum(len(blob) for blob in self._plans.values()) + sum(e.size for e, _ in self._verdicts.values())
                + sum(e.size for e, _ in self._runner_choices.values()))

    def _evict(self, keep: tuple[str, tuple[str, str]]) -> None:
        """Least recently used first: plans, then runner choices, then decisions, down to 90% of max_bytes."""
        total = self._payload_bytes()
        if total <= self.max_bytes:
            return
        target = int(self.max_bytes * EVICT_TO_FRACTION)
        tables = (("plans", self._plans), ("runner_choices", self._runner_choices), ("verdicts", self._verdicts))
        for table, rows in tables:
            for row_key in list(rows):  # oldest use first
                if total <= target:
                    return
                if (table, row_key) == keep:
                    continue
                value = rows.pop(row_key)
                total -= len(value) if isinstance(value, bytes) else value[0].size
