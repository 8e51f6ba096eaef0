"""The persistent store: decisions, serialized plans and runner choices in one SQLite file shared by
every process.

`<dir>/decisions.sqlite3` (see database.py for WAL, retries and recovery from damage); point
FUSEDATTN_SELECT_CACHE_DIR at local disk on clusters whose home directories are network mounts.
Key locks add a flock per key in `<dir>/locks/` (see locks.py).

Serialized plans load native code: they are only read from, or written to, a database file (and
its -wal and -shm) and a directory that pass trust.untrusted_reason (owned by the current user,
writable by no one else, the whole path); otherwise plans are refused with one warning and
decisions and runner choices (JSON, no native code) are still cached.

A read never waits for the write lock: the last-use stamps of rows read are written in batches
(uses.py).

Opened with `read_only=True` (commands that only look: `cache info`, `info`, `cache export`) a
store never writes, creates or moves a file: a missing database reads as empty, a damaged one
answers from the rows that can be read, and `check_damage()` says what is wrong.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from fusedattn_select.store.database import DATA_TABLES, Database, StoreFailure, integrity_problem
from fusedattn_select.store.entry_rows import (
    BadEntry,
    NewEntry,
    NewRunnerChoice,
    Written,
    check_fingerprint,
    keeps_stored,
    new_entry,
    new_runner_choice,
    parse_row,
    parse_runner_choice,
    plan_to_store,
    sha256,
)
from fusedattn_select.store.locks import KeyLocks, LockFiles
from fusedattn_select.store.protocol import (
    EVICT_TO_FRACTION,
    KEY_LOCK_TIMEOUT_S,
    CacheError,
    CacheUnavailableError,
    Entry,
    ImportReport,
)
from fusedattn_select.store import sqlite_rows
from fusedattn_select.store.sqlite_rows import snapshot
from fusedattn_select.store.schema import LEGACY_RUNNER_PREFIX
from fusedattn_select.store.store_settings import (
    DATABASE_NAME, database_files, database_not_writable, directory_problem, resolve_max_bytes,
)
from fusedattn_select.store.transfer import export_store, import_store
from fusedattn_select.store.uses import PendingUses
from fusedattn_select.trust import untrusted_reason
from fusedattn_select.types import Fingerprint, ProbeDepth, Verdict

log = logging.getLogger("fusedattn_select")

# A decision, a plan or a runner choice is one row of its table, keyed by (fingerprint_key, its key column).
_ROWS = {"decision": ("verdicts", "config_key"), "plan": ("plans", "plan_key"),
         "runner choice": ("runner_choices", "runner_key")}
# Eviction order: a plan is rebuilt in a fraction of a second, a runner choice measured again in a
# few calls, a decision is a probe.
_EVICTION_ORDER = ("plans", "runner_choices", "verdicts")
# How long a write waits for the lock after the write before it failed.
FAILING_PATIENCE_S = 1.0


class PersistentStore:
    """Decisions, serialized plans and runner choices in `<directory>/decisions.sqlite3`, shared by processes.

    Raises CacheUnavailableError when the directory cannot be created or written
    (store_settings.directory_problem), or the file holds a database of a newer schema. `plans_enabled`
    is False while the directory or the database file is not this user's or is writable by group or
    others (checked on each use, warned about once).
    """

    kind = "sqlite"
    persistent = True

    def __init__(self, directory: str | os.PathLike, max_bytes: int | None = None, *,
                 read_only: bool = False) -> None:
        self.max_bytes = resolve_max_bytes(max_bytes)
        self.directory = Path(directory).expanduser()
        self.path = self.directory / DATABASE_NAME
        self.read_only = read_only
        self._db = Database(self.path, read_only)
        self._key_locks = KeyLocks(LockFiles(self.directory).hold)
        self._plan_warning_given = False
        self._failed_writes = 0
        self._write_failure = ""  # why the first write of the latest run of failures failed
        self._failing = False  # the last write failed: later failures are logged at debug level
        self._uses = PendingUses(self._db.try_write)
        if read_only:
            self._open_read_only()
            return
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise CacheUnavailableError(
                f"cache directory {self.directory} cannot be created ({err.strerror or err})"
            ) from None
        problem = directory_problem(self.directory)  # the reason `cache info` gives, in the same words
        if problem:
            raise CacheUnavailableError(problem)
        try:
            # Opening to write is a write: a damaged file is salvaged here.
            self._db.run("open", lambda conn: None, repair=True)
        except StoreFailure as err:
            raise CacheUnavailableError(f"cannot use the decision cache {self.path}: {err}") from None

    def _open_read_only(self) -> None:
        try:
            self._db.run("open", lambda conn: conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone())
        except StoreFailure as err:
            if not self._db.damage:  # a damaged file is still read, as far as it can be
                raise CacheUnavailableError(f"cannot read the decision cache {self.path}: {err}") from None

    @property
    def damage(self) -> str:
        """What this process found wrong with the database file and has not repaired ("" if nothing)."""
        return self._db.damage

    def check_damage(self) -> str:
        """SQLite's quick_check of the file, without repairing or moving anything ("" when sound)."""
        if not self._db.damage and self.path.exists():
            self._db.damage = integrity_problem(self.path, quick=True) or ""
        return self._db.damage

    # ----- decisions ---------------------------------------------------------------------------
    def get(self, fingerprint: Fingerprint, key: str) -> Entry | None:
        check_fingerprint(fingerprint)
        fp_key = fingerprint.key()
        row = self._read_row("decision", ("depth", "verdicts"), fp_key, key)
        if row is None:
            return None
        try:
            entry = parse_row(*row)
        except BadEntry as bad:
            self._drop_bad_row("decision", fp_key, key, bad, {"depth": row[0], "verdicts": row[1]})
            return None
        self._record_use("decision", fp_key, key)
        return entry

    def put(self, fingerprint: Fingerprint, key: str, verdicts: Iterable[Verdict], depth: ProbeDepth | str) -> bool:
        """False when a deeper decision was kept (entry_rows.keeps_stored), the write failed (logged), or
        the store is read-only."""
        return self._put(fingerprint, new_entry(fingerprint, key, verdicts, depth)) is Written.STORED

    def _put(self, fingerprint: Fingerprint, entry: NewEntry) -> Written:
        fp_key, key, depth = entry.fp_key, entry.key, entry.depth
        if self.read_only:
            return Written.FAILED

        def write(conn: sqlite3.Connection) -> Written:
            self._uses.write(conn)
            now = time.time()
            stored = conn.execute(
                "SELECT depth FROM verdicts WHERE fingerprint_key = ? AND config_key = ?", (fp_key, key),
            ).fetchone()
            if stored is not None and keeps_stored(stored[0], entry):
                conn.execute("UPDATE verdicts SET last_used = ? WHERE fingerprint_key = ? AND config_key = ?",
                             (now, fp_key, key))
                return Written.KEPT_DEEPER
            _remember_fingerprint(conn, fingerprint, now)
            conn.execute(
                "INSERT INTO verdicts (fingerprint_key, config_key, depth, verdicts, size, created, last_used)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (fingerprint_key, config_key) DO UPDATE SET depth = excluded.depth,"
                " verdicts = excluded.verdicts, size = excluded.size, created = excluded.created,"
                " last_used = excluded.last_used",
                (fp_key, key, depth.value, entry.text, entry.size, now, now),
            )
            rowid = conn.execute("SELECT rowid FROM verdicts WHERE fingerprint_key = ? AND config_key = ?",
                                 (fp_key, key)).fetchone()[0]
            self._evict(conn, keep=("verdicts", rowid))
            return Written.STORED

        try:
            written = self._db.run("store a decision", write, write=True, patience_s=self._patience())
        except StoreFailure as err:
            self._write_failed("decision", err)
            return Written.FAILED
        self._failing = False
        return written

    # ----- plans -------------------------------------------------------------------------------
    @property
    def plans_enabled(self) -> bool:
        return not self._plan_refusal()

    def put_plan(self, fingerprint: Fingerprint, plan_key: str, blob: bytes) -> bool:
        blob = plan_to_store(fingerprint, plan_key, blob, self.max_bytes)
        if blob is None or self.read_only or self._plan_refusal():
            return False
        fp_key = fingerprint.key()
        digest = sha256(blob)

        def write(conn: sqlite3.Connection) -> None:
            self._uses.write(conn)
            now = time.time()
            _remember_fingerprint(conn, fingerprint, now)
            conn.execute(
                "INSERT INTO plans (fingerprint_key, plan_key, sha256, size, created, last_used, blob)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (fingerprint_key, plan_key) DO UPDATE SET sha256 = excluded.sha256,"
                " size = excluded.size, created = excluded.created, last_used = excluded.last_used,"
                " blob = excluded.blob",
                (fp_key, plan_key, digest, len(blob), now, now, blob),
            )
            rowid = conn.execute("SELECT rowid FROM plans WHERE fingerprint_key = ? AND plan_key = ?",
                                 (fp_key, plan_key)).fetchone()[0]
            self._evict(conn, keep=("plans", rowid))

        try:
            self._db.run("store a plan", write, write=True, patience_s=self._patience())
        except StoreFailure as err:
            self._write_failed("plan", err)
            return False
        self._failing = False
        return True

    def _patience(self) -> float | None:
        """How long a write waits for the lock: the store's patience, but only FAILING_PATIENCE_S while
        the writes before it failed (a lock held for good would cost every write of a warmup 30 s)."""
        return FAILING_PATIENCE_S if self._failing else None

    def _write_failed(self, kind: str, err: StoreFailure) -> None:
        """Count a write that failed; warn at the first of a run of failures (a full disk fails every
        write: one line says so, and info()["failed_writes"] counts them all)."""
        self._failed_writes += 1
        if not self._failing:
            self._write_failure = str(err)
        (log.debug if self._failing else log.warning)(
            "fusedattn_select: decision cache %s: %s; the %s is not persisted%s", self.path, err, kind,
            "" if self._failing else " (this process counts later failures in info()['failed_writes'] "
            "instead of logging each)")
        self._failing = True

    def get_plan(self, fingerprint: Fingerprint, plan_key: str) -> bytes | None:
        check_fingerprint(fingerprint)
        if self._plan_refusal():
            return None
        fp_key = fingerprint.key()
        row = self._read_row("plan", ("sha256", "size", "blob"), fp_key, plan_key)
        if row is None:
            return None
        digest, size, blob = row
        problem = sqlite_rows.plan_problem(digest, size, blob)
        if problem:
            self._drop_bad_row("plan", fp_key, plan_key, problem, {"sha256": digest, "size": size, "blob": blob})
            return None
        self._record_use("plan", fp_key, plan_key)
        return blob

    def _plan_refusal(self) -> str:
        """Why plans may not be loaded from or written to this store ("" when they may)."""
        # SQLite reads committed rows from the -wal file, found through the -shm index: whoever can
        # write either can plant a plan as surely as with the database file itself.
        problem = untrusted_reason(self.path, self.directory, database_files(self.directory)[1:])
        if problem and not self._plan_warning_given:
            self._plan_warning_given = True
            log.warning(
                "fusedattn_select: not using serialized plans in %s: %s. Plans load native code, so "
                "the cache directory and its files must be owned by you and writable by no one else "
                "(chmod 700 the directory, 600 its files); decisions are still cached", self.directory, problem,
            )
        return problem

    # ----- runner choices ----------------------------------------------------------------------
    def get_runner_choice(self, fingerprint: Fingerprint, key: str) -> dict[str, Any] | None:
        """The runner choice stored for `key`, or None; kept where plans are refused too. A choice
        a schema 1 writer stored as a plan row (schema.upgrade) is read too, in the same snapshot."""
        check_fingerprint(fingerprint)
        fp_key = fingerprint.key()
        found = self._read("read a runner choice",
                           snapshot(lambda conn: sqlite_rows.runner_choice_text(conn, fp_key, key)))
        if found is None:
            return None
        text, legacy = found
        try:
            choice = parse_runner_choice(text)
        except BadEntry as bad:
            if legacy:  # the next writer to open the file drops it (schema.sweep_legacy_runner_rows)
                log.warning("fusedattn_select: the cached runner choice %s in %s is damaged: %s", key, self.path, bad)
            else:
                self._drop_bad_row("runner choice", fp_key, key, bad, {"choice": text})
            return None
        if not legacy:
            self._record_use("runner choice", fp_key, key)
        return choice

    def put_runner_choice(self, fingerprint: Fingerprint, key: str, choice: Mapping[str, Any]) -> bool:
        """Store `choice` (entries.RUNNER_CHOICE_FIELDS; ValueError otherwise); False when the write
        failed (logged) or the store is read-only."""
        return self._put_runner_choice(new_runner_choice(fingerprint, key, choice), fingerprint)

    def _put_runner_choice(self, entry: NewRunnerChoice, fingerprint: Fingerprint) -> bool:
        if self.read_only:
            return False

        def write(conn: sqlite3.Connection) -> None:
            self._uses.write(conn)
            now = time.time()
            _remember_fingerprint(conn, fingerprint, now)
            conn.execute(
                "INSERT INTO runner_choices (fingerprint_key, runner_key, choice, size, created, last_used)"
                " VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (fingerprint_key, runner_key) DO UPDATE SET choice = excluded.choice,"
                " size = excluded.size, created = excluded.created, last_used = excluded.last_used",
                (entry.fp_key, entry.key, entry.text, entry.size, now, now),
            )
            # This choice is newer than one a schema 1 writer stored as a plan row (see sqlite_rows).
            conn.execute("DELETE FROM plans WHERE fingerprint_key = ? AND plan_key = ?",
                         (entry.fp_key, LEGACY_RUNNER_PREFIX + entry.key))
            rowid = conn.execute("SELECT rowid FROM runner_choices WHERE fingerprint_key = ? AND runner_key = ?",
                                 (entry.fp_key, entry.key)).fetchone()[0]
            self._evict(conn, keep=("runner_choices", rowid))

        try:
            self._db.run("store a runner choice", write, write=True, patience_s=self._patience())
        except StoreFailure as err:
            self._write_failed("runner choice", err)
            return False
        self._failing = False
        return True

    # ----- whole store -------------------------------------------------------------------------
    def key_lock(self, fingerprint: Fingerprint, key: str,
                 timeout: float = KEY_LOCK_TIMEOUT_S) -> contextlib.AbstractContextManager[bool]:
        """Hold the probe of (fingerprint, key) against this process's threads and other processes."""
        return self._key_locks.hold(fingerprint, key, timeout)

    def info(self) -> dict[str, object]:
        """Totals and state: see protocol.STATE_KEYS. A damaged file's totals count the rows that can
        be read."""
        try:
            entries, plans, runners, payload = (sqlite_rows.recovered_totals(self.path) if self._db.damage
                                                else self._db.run("read the totals", snapshot(sqlite_rows.totals)))
        except StoreFailure as err:
            if not self._db.damage:
                log.warning("fusedattn_select: decision cache %s: %s", self.path, err)
            entries, plans, runners, payload = sqlite_rows.recovered_totals(self.path)
        pending = self._db.salvaged_copy.exists()
        refusal = self._plan_refusal()
        return {
            "kind": self.kind, "path": str(self.path), "entries": entries, "plans": plans,
            "runner_choices": runners, "bytes": payload, "max_bytes": self.max_bytes, "persistent": True,
            "read_only": self.read_only, "unwritable": database_not_writable(self.directory) or None,
            "degraded": None, "switched_off": None, "plans_enabled": not refusal,
            "plans_refused": refusal or None,
            "damage": (f"a salvage was interrupted: {self._db.salvaged_copy.name} waits to take the file's "
                       "place" if pending else self._db.damage or None),
            "failed_writes": self._failed_writes, "write_failure": self._write_failure or None,
        }

    def clear(self) -> None:
        """Remove every decision, plan and runner choice, in one transaction; CacheError (nothing removed) when the
        store is read-only or the database cannot be written."""
        if self.read_only:
            raise CacheError(f"decision cache {self.path}: opened read-only, not cleared")

        def wipe(conn: sqlite3.Connection) -> None:
            for table in DATA_TABLES:
                conn.execute(f"DELETE FROM {table}")

        try:
            self._db.run("clear", wipe, write=True)
        except StoreFailure as err:
            raise CacheError(f"decision cache {self.path}: {err}; not cleared") from None

    def close(self) -> None:
        """Close this process's connections (the next use reopens them); last-use stamps not yet
        written are written if that needs no wait."""
        self._uses.flush()
        self._db.close()

    def repair(self) -> str:
        """Salvage the database file when integrity_check finds it damaged, or finish a salvage an
        interrupted process left: what was done, in one line. CacheError when it cannot."""
        if self.read_only:
            raise CacheError(f"decision cache {self.path}: opened read-only, not repaired")
        try:
            return self._db.repair()
        except StoreFailure as err:
            raise CacheError(f"decision cache {self.path}: {err}") from None

    def integrity_check(self) -> list[str]:
        """SQLite's integrity_check of the database file: ["ok"] when it is sound."""
        return self._db.run("check integrity", lambda conn: [
            row[0] for row in conn.execute("PRAGMA integrity_check")
        ])

    def export(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> dict:
        """Write every valid entry (of `fingerprint` only) to a JSON file; see transfer.export_store."""
        return export_store(self, path, fingerprint)

    def import_(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> ImportReport:
        """Load an export file, verifying every row; see transfer.import_store."""
        if self.read_only:
            raise CacheError(f"decision cache {self.path}: opened read-only, nothing imported")
        return import_store(self, path, fingerprint)

    def _export_rows(self, fingerprint_key: str | None) -> sqlite_rows.ExportRows:
        refused = bool(self._plan_refusal())
        if self.check_damage():
            raw = sqlite_rows.recovered_export_rows(self.path, fingerprint_key, refused)
        else:
            try:
                raw = self._db.run("export", snapshot(
                    lambda conn: sqlite_rows.raw_export_rows(conn, fingerprint_key, refused)))
            except StoreFailure:  # damage the quick check did not see, or a file that is not a database
                raw = sqlite_rows.recovered_export_rows(self.path, fingerprint_key, refused)
        return sqlite_rows.export_rows(raw)

    # ----- rows --------------------------------------------------------------------------------
    def _read_row(self, kind: str, columns: tuple[str, ...], fp_key: str, key: str) -> tuple | None:
        """`columns` of the `kind` (a key of _ROWS) row, or None: no row, or unreadable (logged)."""
        table, key_column = _ROWS[kind]
        return self._read(f"read a {kind}", lambda conn: conn.execute(
            f"SELECT {', '.join(columns)} FROM {table} WHERE fingerprint_key = ? AND {key_column} = ?", (fp_key, key),
        ).fetchone())

    def _read(self, what: str, action: Callable[[sqlite3.Connection], Any]) -> Any:
        """action(conn) on the reading connection, or None where the file cannot be read (logged)."""
        try:
            return self._db.run(what, action)
        except StoreFailure as err:
            # Damage is reported once, when it is found; each miss it causes is not news.
            (log.debug if self._db.damage else log.warning)(
                "fusedattn_select: decision cache %s: %s; treated as a miss", self.path, err)
            return None

    def _drop_bad_row(self, kind: str, fp_key: str, key: str, problem: object, read: Mapping[str, object]) -> None:
        """Log and delete the damaged `kind` row that was read: `read` holds every column its check read."""
        table, key_column = _ROWS[kind]
        if self.read_only:
            log.warning("fusedattn_select: the cached %s %s in %s is damaged: %s", kind, key, self.path, problem)
            return
        # Only while the row still holds every value that failed the check: another process may have
        # written a sound row meanwhile, with the same sha256 (a plan rebuilt) or the same verdicts. A
        # read never waits for the write lock: when it is busy the row is dropped the next time it is read.
        same = " AND ".join(f"{column} IS ?" for column in read)
        deleted: list[int] = []
        self._db.try_write(lambda conn: deleted.append(conn.execute(
            f"DELETE FROM {table} WHERE fingerprint_key = ? AND {key_column} = ? AND {same}",
            (fp_key, key, *read.values()),
        ).rowcount))
        log.warning("fusedattn_select: %s the cached %s %s from %s: %s", "dropped" if any(deleted) else "not using",
                    kind, key, self.path, problem)

    def _record_use(self, kind: str, fp_key: str, key: str) -> None:
        """Note the `kind` row's use for least-recently-used eviction (uses.py: never waits)."""
        if not self.read_only:
            self._uses.note(*_ROWS[kind], fp_key, key)

    def _evict(self, conn: sqlite3.Connection, keep: tuple[str, int]) -> None:
        """Least recently used first, in _EVICTION_ORDER, down to 90% of max_bytes."""
        total = sqlite_rows.payload_bytes(conn)
        if total <= self.max_bytes:
            return
        target = int(self.max_bytes * EVICT_TO_FRACTION)
        evicted = {}
        for table in _EVICTION_ORDER:
            doomed = []
            rows = conn.execute(f"SELECT rowid, size FROM {table} ORDER BY last_used, rowid")
            for rowid, size in rows:
                if total <= target:
                    break
                if (table, rowid) != keep:
                    doomed.append((rowid,))
                    total -= size
            conn.executemany(f"DELETE FROM {table} WHERE rowid = ?", doomed)
            evicted[table] = len(doomed)
            if total <= target:
                break
        log.info("fusedattn_select: decision cache over %d bytes: evicted %d plans, %d runner choices and %d "
                 "decisions", self.max_bytes, evicted.get("plans", 0), evicted.get("runner_choices", 0),
                 evicted.get("verdicts", 0))


def _remember_fingerprint(conn: sqlite3.Connection, fingerprint: Fingerprint, now: float) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO fingerprints (fingerprint_key, fingerprint, created) VALUES (?, ?, ?)",
        (fingerprint.key(), json.dumps(fingerprint.to_dict(), sort_keys=True), now),
    )
