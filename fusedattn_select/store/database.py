"""One SQLite database file shared by processes: connections, schema, retried transactions, recovery.

The file is in WAL mode (many readers and one writer at a time; every write is one
`BEGIN IMMEDIATE` transaction, retried with backoff while another process holds the lock). WAL
needs a local file system: SQLite's locks do not work across hosts on NFS.

A process holds two connections: reads never queue behind a write that waits for another
process's lock. Before each use a connection checks that the file is still the one it opened
(another process may have salvaged it) and reopens it if not.

Damage (a file that is not a SQLite database, or fails `PRAGMA integrity_check`) is repaired by a
write that meets it, or by `repair()`: every row that can still be read is copied into a fresh
database (salvage.py), which takes the file's place in one rename (swap.py), under an exclusive
flock on the directory that every write, and every opening of a connection, holds shared. A
salvage a dead process left half done is finished by the next write, from any process, with one
warning. Reads never move files: a read that meets damage is a miss, reported once. A read-only
Database never writes at all, and reads a missing file as an empty database.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from fusedattn_select._version import __version__
from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.store.locks import flock_directory, shared_flock
from fusedattn_select.store.protocol import SCHEMA_VERSION, CacheUnavailableError
from fusedattn_select.store.schema import (
    DATA_TABLES,
    UPGRADABLE,
    create_schema,
    holds_legacy_runner_rows,
    schema_is_current,
    schema_version,
    sweep_legacy_runner_rows,
    upgrade,
)
from fusedattn_select.store.swap import SalvageSwap

log = logging.getLogger("fusedattn_select")

# SQLite's own busy handler waits this long per statement; on top of it, an operation is retried
# with backoff until LOCKED_RETRY_S. A write transaction here takes well under a millisecond, so
# only a stuck process holds the lock that long.
BUSY_TIMEOUT_S = 5.0
LOCKED_RETRY_S = 30.0

_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26
_SMALLEST_PAGE = 512  # a file in WAL mode is never shorter: switching to WAL writes its first page

T = TypeVar("T")

# Connections inherited by a forked child: SQLite forbids using them there, and closing them in
# the child could disturb the parent, so they are kept alive and never touched.
_INHERITED_CONNECTIONS: list[sqlite3.Connection] = []


# Database files whose damage this process has reported: once per file, however many stores read it.
_DAMAGE_REPORTED: set[Path] = set()


class StoreFailure(Exception):
    """An operation on the database failed after retries; the store turns it into a miss."""


class _SalvagePending(Exception):
    """A salvaged copy waits to take the file's place (a salvaging process died): finish it first."""


class _Connection:
    """One SQLite connection of this process and the thread lock its users take turns under."""

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.identity: tuple[int, int] | None = None  # of the file it was opened on
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        """A free lock (in a forked child too: a thread of the parent may have held it at the fork);
        a connection inherited from the parent is set aside untouched (_INHERITED_CONNECTIONS)."""
        self.lock = threading.RLock()
        if self.conn is not None:
            _INHERITED_CONNECTIONS.append(self.conn)
            self.conn = None

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self.conn.close()
        self.conn = None


class Database:
    """The SQLite file at `path`: a reading and a writing connection per process, shared by its threads.

    `damage` is what was found wrong with the file and not repaired yet ("" when nothing was).
    """

    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self.damage = ""
        self._swap = SalvageSwap(path)
        self.salvaged_copy = self._swap.copy
        self.salvaged = ""  # what the last salvage this process made kept (repair() says it)
        self._reader = _Connection()
        self._writer = _Connection()

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
        # A repair takes the reading connection's lock too (it closes both): only the writing
        # connection's holders may do that, so a reader never waits for a writer while holding its lock.
        channel = self._writer if write or repair else self._reader
        if repair and self.damage:  # damage a read found: this write repairs it first
            with channel.lock:
                self._recover(channel, None)
        while True:
            with channel.lock:
                try:
                    with self._writing(deadline) if write else contextlib.nullcontext():
                        conn = self._connection(channel, deadline)
                        return _transaction(conn, action) if write else action(conn)
                except _SalvagePending:
                    self._finish_pending_salvage(deadline)
                    continue
                except sqlite3.OperationalError as err:
                    if not _is_busy(err):
                        if retried or not self._reopened_after(channel, err, repair):
                            raise StoreFailure(f"{what}: {err}") from err
                        retried = True
                        continue
                    if time.monotonic() >= deadline:
                        raise StoreFailure(f"{what}: the database stayed locked for {patience_s:.0f} s") from err
                except sqlite3.DatabaseError as err:
                    if retried or not self._reopened_after(channel, err, repair):
                        raise StoreFailure(f"{what}: {err}") from err
                    retried = True
                    continue
                except (OSError, CacheUnavailableError) as err:
                    raise StoreFailure(f"{what}: {err}") from err
            # Back off outside the thread lock, with jitter so waiting processes do not retry in step.
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.25)

    def try_write(self, action: Callable[[sqlite3.Connection], object]) -> bool:
        """Run action(conn) in a write transaction only if that needs no waiting at all (another
        thread or process writing, a salvage under way: False at once). Repairs nothing."""
        if self.read_only or not self._writer.lock.acquire(blocking=False):
            return False
        try:
            with self._writing(time.monotonic()):
                conn = self._connection(self._writer, time.monotonic())
                conn.execute("PRAGMA busy_timeout = 0")
                try:
                    _transaction(conn, action)
                finally:
                    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            return True
        except (sqlite3.Error, OSError, StoreFailure, _SalvagePending, CacheUnavailableError):
            return False
        finally:
            self._writer.lock.release()

    def close(self) -> None:
        """Close this process's connections (the next use reopens them)."""
        for channel in (self._reader, self._writer):
            with channel.lock:
                if channel.conn is not None and not self.read_only:
                    # The last connection to close a file still in place checkpoints it and deletes
                    # its -wal and -shm by name: not while a salvage moves them (the new file's then).
                    with contextlib.suppress(OSError, StoreFailure), self._shared(time.monotonic() + BUSY_TIMEOUT_S):
                        channel.close()
                channel.close()  # (unlocked, where the lock could not be had)

    def repair(self) -> str:
        """Finish a salvage a process left, or else salvage the file if integrity_check finds it damaged:
        what was done, in one line. Raises StoreFailure when it cannot."""
        with self._writer.lock:
            self.close()
            with self._exclusive():
                finished, swapped = self._finish_pending_salvage_locked(warn=False)
                if swapped:
                    return finished
                # An incomplete copy removed says nothing of the file it was to replace: check that too.
                problem = integrity_problem(self.path) if self.path.exists() else None
                if problem is None:
                    self.damage = ""
                    # self.salvaged: by this process, opening the file (a write that met the damage)
                    done = self.salvaged or f"{self.path}: sound (integrity_check ok), nothing to repair"
                    return "; ".join(filter(None, (finished, done)))
                aside, report = self._swap.make(problem)
        self.damage = ""
        _DAMAGE_REPORTED.discard(self.path)
        done = f"{self.path} was damaged ({problem}): {report}; the damaged file is kept as {aside}"
        return "; ".join(filter(None, (finished, done)))

    # ----- connections ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _writing(self, deadline: float) -> Iterator[None]:
        """Hold the directory's flock shared for a write: no salvage sets the file aside meanwhile."""
        if self.read_only:
            yield
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self._shared(deadline):
            if self.salvaged_copy.exists():
                raise _SalvagePending()
            yield

    @contextlib.contextmanager
    def _shared(self, deadline: float) -> Iterator[None]:
        """Hold the directory's flock shared: no salvage moves the file, its -wal or its -shm meanwhile.
        A holder may take it again (shared flocks never conflict); a read-only Database that cannot
        open the directory (none yet) goes on unlocked: it never writes."""
        with contextlib.ExitStack() as stack:
            try:
                held = stack.enter_context(shared_flock(self.path.parent, deadline))
            except OSError:
                if not self.read_only:
                    raise
                held = True
            if not held:
                raise StoreFailure(f"a salvage of {self.path} held the cache directory past the timeout")
            yield

    @contextlib.contextmanager
    def _exclusive(self, deadline: float | None = None) -> Iterator[None]:
        deadline = time.monotonic() + LOCKED_RETRY_S if deadline is None else deadline
        try:
            with flock_directory(self.path.parent, deadline) as held:
                if not held:
                    raise StoreFailure(f"other processes kept writing to {self.path} for {LOCKED_RETRY_S:.0f} s: "
                                       "it could not be checked or salvaged; try again")
                yield
        except OSError as err:  # the lock, or a rename of the salvage
            raise StoreFailure(f"cannot salvage {self.path} ({err})") from None

    def _connection(self, channel: _Connection, deadline: float) -> sqlite3.Connection:
        """The channel's connection, (re)opened on the file now in place; StoreFailure when a
        salvage holds the directory past `deadline`."""
        if channel.conn is not None and _file_identity(self.path) != channel.identity:
            channel.close()  # another process salvaged the file, or someone deleted the cache
        if channel.conn is None:
            # SQLite opens the -wal and -shm files by name after the database file: a salvage
            # that moved them in between would pair the old file with the new file's log, and
            # a write through that connection (the schema, when the old file's own pages do not
            # hold it yet) would land in the new file's log as pages of the old one.
            with self._shared(deadline):
                channel.identity = _file_identity(self.path)
                conn = self._open_read_only(channel) if self.read_only else self._open(channel)
                channel.conn = conn
        return channel.conn

    def _open(self, channel: _Connection) -> sqlite3.Connection:
        if channel.identity is None:
            # Created here so the file is private whatever the umask (SQLite would use 0644);
            # SQLite gives the -wal and -shm files the database file's permissions.
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            channel.identity = _file_identity(self.path)
        _refuse_emptied_file(self.path)
        conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
            # In WAL mode NORMAL cannot corrupt the database; a power cut may lose the last
            # few decisions, which are re-probed.
            conn.execute("PRAGMA synchronous = NORMAL")
            if not schema_is_current(conn):
                _transaction(conn, self._create_schema)
            elif channel is self._writer:  # (a read never waits for the write lock)
                self._sweep_at_open(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_read_only(self, channel: _Connection) -> sqlite3.Connection:
        """The file opened read-only; a missing file reads as an empty database of this schema."""
        if channel.identity is None:
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            create_schema(conn)
            return conn
        _refuse_emptied_file(self.path)
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S,
                               isolation_level=None, check_same_thread=False)
        try:
            version = schema_version(conn)
        except BaseException:
            conn.close()
            raise
        if version is not None and version > SCHEMA_VERSION:
            conn.close()
            raise CacheUnavailableError(_newer_schema(self.path, version))
        return conn

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        version = schema_version(conn)  # again, inside the lock: another process may have won
        if version is not None and version > SCHEMA_VERSION:
            raise CacheUnavailableError(_newer_schema(self.path, version))
        if version in UPGRADABLE:
            moved = upgrade(conn)
            log.info("fusedattn_select: decision cache %s upgraded from schema %s to %d (%d runner choices "
                     "moved out of the plans table)", self.path, version, SCHEMA_VERSION, moved)
            return
        if version is not None and version != SCHEMA_VERSION:
            log.warning("fusedattn_select: decision cache %s has schema %s; starting it over at schema %d",
                        self.path, version, SCHEMA_VERSION)
            for table in DATA_TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
        create_schema(conn)

    def _sweep_at_open(self, conn: sqlite3.Connection) -> None:
        """Move the runner choices a schema 1 writer stored as plan rows after the upgrade (see
        schema.holds_legacy_runner_rows). Best effort: damage in the plans table is left to the
        operation that meets it (opening the file repairs nothing), a busy lock to the next opening."""
        with contextlib.suppress(sqlite3.DatabaseError):
            if holds_legacy_runner_rows(conn):
                _transaction(conn, self._sweep_legacy_runner_rows)

    def _sweep_legacy_runner_rows(self, conn: sqlite3.Connection) -> None:
        moved = sweep_legacy_runner_rows(conn)  # (again inside the lock: another writer may have swept)
        if moved:
            log.info("fusedattn_select: decision cache %s: moved %d runner choices that a schema %d writer "
                     "stored as plans to their own table", self.path, moved, UPGRADABLE[-1])

    # ----- damage --------------------------------------------------------------------------------
    def _reopened_after(self, channel: _Connection, err: sqlite3.DatabaseError, repair: bool) -> bool:
        """Whether the error was damage repaired (when `repair`) or a replaced file reopened: retry."""
        # "database disk image is malformed" is a plain DatabaseError where the code is unknown.
        damaged = _error_code(err) in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or type(err) is sqlite3.DatabaseError
        if damaged and repair:
            self._recover(channel, err)
            return True
        if channel.identity is not None and _file_identity(self.path) != channel.identity:
            channel.close()
            return True
        if damaged and not self.damage:
            self.damage = str(err)
            if self.path in _DAMAGE_REPORTED:  # by another store of this process over the same file
                return False
            _DAMAGE_REPORTED.add(self.path)
            log.warning("fusedattn_select: the decision cache %s is damaged (%s); answering from the rows "
                        "that can be read; `fusedattn-select cache repair` (or a write that meets the "
                        "damage) salvages it", self.path, err)
        return False

    def _recover(self, channel: _Connection, err: sqlite3.Error | None) -> None:
        """The database reported damage: put a salvaged copy in its place, keep the file aside.

        Serialised across processes by the directory's flock, so two processes that both saw the
        damage do not replace each other's salvaged database.
        """
        identity = channel.identity
        self.close()
        self.damage = ""  # found again by the next read if this does not repair it
        _DAMAGE_REPORTED.discard(self.path)
        with self._exclusive():
            if self._finish_pending_salvage_locked()[1]:
                return  # a complete salvaged copy took the file's place (an incomplete one removed: go on)
            if _file_identity(self.path) != identity:
                return  # another process already replaced it
            problem = integrity_problem(self.path)
            if problem is None:
                return  # sound after all: the caller retries once
            aside, report = self._swap.make(problem)
        self.salvaged = f"{self.path} was damaged ({problem}): {report}; the damaged file is kept as {aside}"
        log.warning("fusedattn_select: the decision cache %s was damaged (%s): %s; the damaged file is kept as %s",
                    self.path, problem, report, aside.name)

    def _finish_pending_salvage(self, deadline: float) -> None:
        self.close()
        with self._exclusive(max(deadline, time.monotonic() + 1.0)):
            self._finish_pending_salvage_locked()

    def _finish_pending_salvage_locked(self, warn: bool = True) -> tuple[str, bool]:
        """Steps 2 and 3 of a salvage a dead process left, under the exclusive flock: (what was done, ""
        when no copy waits; whether a complete copy took the file's place: an incomplete one is only removed)."""
        if not self.salvaged_copy.exists():
            return "", False
        finished = self._swap.finish()
        if finished is None:
            said = f"removed {self.salvaged_copy.name}, an incomplete salvaged copy ({self.path.name} was not replaced)"
        else:
            aside, report = finished
            said = (f"finished the salvage of {self.path} that an interrupted process left ({report}); "
                    f"the damaged file is kept as {aside.name}")
        if warn:
            log.warning("fusedattn_select: %s", said)
        return said, finished is not None


def _refuse_emptied_file(path: Path) -> None:
    """Raise DatabaseError (damage) for a database file cut shorter than the smallest page: SQLite
    reads it as a new, empty database and, opening it (even read-only), deletes a write-ahead log
    beside it and every row in the log. An empty file with no log (or an empty log) is a new store."""
    try:
        size = os.path.getsize(path)
        log_size = os.path.getsize(f"{path}-wal") if os.path.exists(f"{path}-wal") else 0
    except OSError:
        return
    if 0 < size < _SMALLEST_PAGE or (size == 0 and log_size > 0):
        raise sqlite3.DatabaseError(f"{path.name} is cut to {size} bytes, shorter than a database page "
                                    f"(its write-ahead log holds {log_size} bytes)")


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
        _refuse_emptied_file(path)
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
