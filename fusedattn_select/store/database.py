"""One SQLite database file shared by processes: connection, schema, retried transactions, recovery.

The file is in WAL mode (many readers and one writer at a time; every write is one
`BEGIN IMMEDIATE` transaction, retried with backoff while another process holds the lock). WAL
needs a local file system: SQLite's locks do not work across hosts on NFS.

Damage (a file that is not a SQLite database, or fails `PRAGMA integrity_check`) is repaired only
by a write: every row that can still be read is copied into a fresh database (salvage.py), which
takes the file's place; the damaged file is kept as `<name>.corrupt-<timestamp>` with its -wal and
-shm files (so a stale log is never replayed into the new database), and one warning gives the
counts. Reads never move files: a read that meets damage is a miss, reported once. A read-only
Database never writes at all, and reads a missing file as an empty database.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

from fusedattn_select._version import __version__
from fusedattn_select.store.locks import flock_directory
from fusedattn_select.store.protocol import SCHEMA_VERSION, CacheUnavailableError
from fusedattn_select.store.salvage import salvage

log = logging.getLogger("fusedattn_select")

# SQLite's own busy handler waits this long per statement; on top of it, an operation is retried
# with backoff until LOCKED_RETRY_S. A write transaction here takes well under a millisecond, so
# only a stuck process holds the lock that long.
BUSY_TIMEOUT_S = 5.0
LOCKED_RETRY_S = 30.0

_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS fingerprints ("
    " fingerprint_key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, created REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS verdicts ("
    " fingerprint_key TEXT NOT NULL, config_key TEXT NOT NULL, depth TEXT NOT NULL,"
    " verdicts TEXT NOT NULL, size INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL,"
    " PRIMARY KEY (fingerprint_key, config_key))",
    # (last_used, size) covers both the eviction scan and the SUM(size) of the byte total.
    "CREATE INDEX IF NOT EXISTS verdicts_by_last_use ON verdicts (last_used, size)",
    "CREATE TABLE IF NOT EXISTS plans ("
    " fingerprint_key TEXT NOT NULL, plan_key TEXT NOT NULL, sha256 TEXT NOT NULL,"
    " size INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL, blob BLOB NOT NULL,"
    " PRIMARY KEY (fingerprint_key, plan_key))",
    "CREATE INDEX IF NOT EXISTS plans_by_last_use ON plans (last_used, size)",
)
DATA_TABLES = ("verdicts", "plans", "fingerprints")

T = TypeVar("T")

# Connections inherited by a forked child: SQLite forbids using them there, and closing them in
# the child could disturb the parent, so they are kept alive and never touched.
_INHERITED_CONNECTIONS: list[sqlite3.Connection] = []


# Database files whose damage this process has reported: once per file, however many stores read it.
_DAMAGE_REPORTED: set[Path] = set()


class StoreFailure(Exception):
    """An operation on the database failed after retries; the store turns it into a miss."""


class Database:
    """The SQLite file at `path`: one connection per process, shared by its threads under a lock.

    `damage` is what was found wrong with the file and not repaired yet ("" when nothing was).
    """

    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self.damage = ""
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._identity: tuple[int, int] | None = None

    def run(self, what: str, action: Callable[[sqlite3.Connection], T], *, write: bool = False,
            patience_s: float | None = None, repair: bool | None = None) -> T:
        """Run action(conn) (in one write transaction when `write`).

        Retries with backoff for `patience_s` (default LOCKED_RETRY_S) while another process holds
        the database lock; reopens a file another process replaced; when `repair` (default: `write`
        on a writable database) salvages a damaged database once and retries. Raises StoreFailure.
        """
        repair = (write if repair is None else repair) and not self.read_only
        patience_s = LOCKED_RETRY_S if patience_s is None else patience_s
        deadline = time.monotonic() + patience_s
        delay = 0.005
        retried = False
        if repair and self.damage:  # damage a read found: this write repairs it first
            with self._lock:
                self._recover(None)
        while True:
            with self._lock:
                try:
                    conn = self._connection()
                    return _transaction(conn, action) if write else action(conn)
                except sqlite3.OperationalError as err:
                    if not _is_busy(err):
                        if retried or not self._reopened_after(err, repair):
                            raise StoreFailure(f"{what}: {err}") from err
                        retried = True
                        continue
                    if time.monotonic() >= deadline:
                        raise StoreFailure(f"{what}: the database stayed locked for {patience_s:.0f} s") from err
                except sqlite3.DatabaseError as err:
                    if retried or not self._reopened_after(err, repair):
                        raise StoreFailure(f"{what}: {err}") from err
                    retried = True
                    continue
                except (OSError, CacheUnavailableError) as err:
                    raise StoreFailure(f"{what}: {err}") from err
            # Back off outside the thread lock, with jitter so waiting processes do not retry in step.
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.25)

    def run_quietly(self, what: str, action: Callable[[sqlite3.Connection], object]) -> None:
        """A write that may fail without harm (bookkeeping of a read): log it and go on, without
        waiting long or repairing anything."""
        try:
            self.run(what, action, write=True, patience_s=1.0, repair=False)
        except StoreFailure as err:
            log.debug("fusedattn_select: decision cache %s: %s", self.path, err)

    def close(self) -> None:
        """Close this process's connection (the next use reopens it)."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
            self._conn = None

    def _reopened_after(self, err: sqlite3.DatabaseError, repair: bool) -> bool:
        """Whether the error was damage repaired (when `repair`) or a replaced file reopened: retry."""
        # "database disk image is malformed" is a plain DatabaseError where the code is unknown.
        damaged = _error_code(err) in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or type(err) is sqlite3.DatabaseError
        if damaged and repair:
            self._recover(err)
            return True
        if self._identity is not None and _file_identity(self.path) != self._identity:
            # Another process salvaged a damaged file, or someone deleted the cache.
            self.close()
            return True
        if damaged and not self.damage:
            self.damage = str(err)
            if self.path in _DAMAGE_REPORTED:  # by another store of this process over the same file
                return False
            _DAMAGE_REPORTED.add(self.path)
            log.warning("fusedattn_select: the decision cache %s is damaged (%s); answering from the rows "
                        "that can be read; the next write salvages it", self.path, err)
        return False

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid != os.getpid():
            _INHERITED_CONNECTIONS.append(self._conn)
            self._conn = None
        if self._conn is None:
            conn = self._open_read_only() if self.read_only else self._open()
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.path.exists():
            # Created here so the file is private whatever the umask (SQLite would use 0644);
            # SQLite gives the -wal and -shm files the database file's permissions.
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self._identity = _file_identity(self.path)
        conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
            # In WAL mode NORMAL cannot corrupt the database; a power cut may lose the last
            # few decisions, which are re-probed.
            conn.execute("PRAGMA synchronous = NORMAL")
            if _schema_version(conn) != SCHEMA_VERSION:
                _transaction(conn, self._create_schema)
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_read_only(self) -> sqlite3.Connection:
        """The file opened read-only; a missing file reads as an empty database of this schema."""
        self._identity = _file_identity(self.path)
        if self._identity is None:
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            create_schema(conn)
            return conn
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S,
                               isolation_level=None, check_same_thread=False)
        try:
            version = _schema_version(conn)
        except BaseException:
            conn.close()
            raise
        if version is not None and version > SCHEMA_VERSION:
            conn.close()
            raise CacheUnavailableError(_newer_schema(self.path, version))
        return conn

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        version = _schema_version(conn)  # again, inside the lock: another process may have won
        if version == SCHEMA_VERSION:
            return
        if version is not None and version > SCHEMA_VERSION:
            raise CacheUnavailableError(_newer_schema(self.path, version))
        if version is not None:
            log.warning("fusedattn_select: decision cache %s has schema %s; starting it over at schema %d",
                        self.path, version, SCHEMA_VERSION)
            for table in DATA_TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
        create_schema(conn)

    def _recover(self, err: sqlite3.Error | None) -> None:
        """The database reported damage: put a salvaged copy in its place, set the file aside.

        Serialised across processes by a flock on the directory (no lock file is left behind), so
        two processes that both saw the damage do not replace each other's salvaged database.
        """
        identity = self._identity
        self.close()
        self.damage = ""  # found again by the next read if this does not repair it
        _DAMAGE_REPORTED.discard(self.path)
        try:
            with flock_directory(self.path.parent, time.monotonic() + LOCKED_RETRY_S):
                if _file_identity(self.path) != identity:
                    return  # another process already replaced it
                problem = integrity_problem(self.path)
                if problem is None:
                    return  # sound after all: the caller retries once
                aside, counts = self._replace_with_salvage()
        except OSError as err:
            raise StoreFailure(f"cannot set the damaged {self.path} aside ({err})") from None
        log.warning("fusedattn_select: the decision cache %s was damaged (%s): %s; the damaged file is "
                    "kept as %s", self.path, problem, counts or "nothing could be salvaged, started a new one",
                    aside.name)

    def _replace_with_salvage(self) -> tuple[Path, str]:
        """Put a salvaged copy in the file's place, the file aside: (where it went, what was kept)."""
        stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S.%f")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        salvaged = self.path.with_name(f"{self.path.name}.salvage-{os.getpid()}")
        counts = _salvage_into(self.path, salvaged)
        os.replace(self.path, aside)
        # A stale write-ahead log must never be replayed into the new database.
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
        if counts:
            os.replace(salvaged, self.path)
        return aside, counts


def create_schema(conn: sqlite3.Connection) -> None:
    """The tables and indexes of SCHEMA_VERSION, and the meta rows saying so."""
    for statement in SCHEMA:
        conn.execute(statement)
    conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('created_by', ?)",
                 (f"fusedattn-select {__version__}",))


def _salvage_into(damaged: Path, fresh: Path) -> str:
    """Copy the readable rows of `damaged` into a new database file `fresh`; what was kept and lost
    (e.g. "salvaged 17 decisions, ...; lost 0 rows"), or "" when no new file could be written."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(fresh)
    try:
        os.close(os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        conn = sqlite3.connect(str(fresh), isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            create_schema(conn)
            report = salvage(damaged, conn)
            conn.execute("COMMIT")
        finally:
            conn.close()
    except (OSError, sqlite3.Error) as err:
        log.warning("fusedattn_select: cannot write a salvaged copy of %s (%s)", damaged, err)
        with contextlib.suppress(OSError):
            os.remove(fresh)
        return ""
    return report.describe()


def _newer_schema(path: Path, version: int) -> str:
    return (f"{path} has schema version {version}, written by a newer fusedattn-select; this "
            f"version ({__version__}) reads schema {SCHEMA_VERSION}")


def _transaction(conn: sqlite3.Connection, action: Callable[[sqlite3.Connection], T]) -> T:
    # IMMEDIATE takes the write lock up front: a deferred transaction that reads and then
    # writes can fail with SQLITE_BUSY_SNAPSHOT in WAL mode, which no busy handler retries.
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = action(conn)
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    return result


def _schema_version(conn: sqlite3.Connection) -> int | None:
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone() is None:
        return None
    row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    try:
        return int(row[0]) if row is not None else None
    except (TypeError, ValueError):
        return 0


def _error_code(err: sqlite3.Error) -> int | None:
    code = getattr(err, "sqlite_errorcode", None)  # Python >= 3.11
    return None if code is None else code & 0xFF


def _is_busy(err: sqlite3.Error) -> bool:
    code = _error_code(err)
    if code is not None:
        return code in (_SQLITE_BUSY, _SQLITE_LOCKED)
    text = str(err).lower()
    return "locked" in text or "busy" in text


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of `path`, or None when it does not exist: tells a replaced file apart."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def integrity_problem(path: Path, quick: bool = False) -> str | None:
    """What is wrong with the database file, or None when integrity_check (quick_check) passes.

    Opens the file read-only: checking never changes it.
    """
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            check = "quick_check" if quick else "integrity_check"
            rows = [row[0] for row in conn.execute(f"PRAGMA {check}(5)")]
        finally:
            conn.close()
    except sqlite3.OperationalError as err:
        if _is_busy(err):
            return None  # cannot tell while another process writes; do not set a live file aside
        return str(err)
    except sqlite3.DatabaseError as err:
        return str(err)
    if rows == ["ok"]:
        return None
    # SQLite's report starts "*** in database main ***" and puts several lines in one row.
    lines = [line.strip() for row in rows for line in str(row).splitlines()]
    return "; ".join(line for line in lines if line and not line.startswith("***"))
