"""Decision and plan stores: in memory, and persistent in one SQLite file shared by every process.

The store contract (what the Selector and warmup call)
-------------------------------------------------------
`PersistentStore` and `MemoryStore` have the same interface:

    get(fingerprint, key) -> (verdicts, depth) | None
    put(fingerprint, key, verdicts, depth) -> bool        # False: kept a FULL entry, or the write failed
    get_plan(fingerprint, plan_key) -> bytes | None
    put_plan(fingerprint, plan_key, blob) -> bool
    key_lock(fingerprint, key, timeout=KEY_LOCK_TIMEOUT_S)  # context manager, yields True when exclusive
    info() -> dict; clear(); export(path, fingerprint=None) -> dict; import_(path, fingerprint=None)

- Entries belong to a fingerprint: `get` only returns rows written under `fingerprint.key()`.
- `put` raises ValueError for FAILED verdicts (incidents, never cached) and never replaces a FULL
  entry with a FAST one. Otherwise a store never raises into selection: a locked, full or
  damaged database turns into a miss (or a skipped write) with a warning.
- Rows that do not parse, verdict lists that hold a FAILED verdict and plans whose sha256 or size
  do not match are deleted with a warning and reported as a miss.

Cross-process single flight: `key_lock`
---------------------------------------
The selector's single flight covers the threads of one process. Eight ranks warming the same
problems are eight processes; to build each problem once in total, the code that probes on a
miss does, for each cache key:

    with store.key_lock(fingerprint, key):
        entry = store.get(fingerprint, key)    # re-check: another process may have stored it
        if entry answers the question:          # while this one waited for the lock
            use it
        else:
            probe, then store.put(...)          # inside the lock, so the next waiter finds it

`PersistentStore.key_lock` takes an exclusive `fcntl.flock` on
`<cache dir>/locks/<fingerprint key>-<cache key>.lock` (the fingerprint is in the name so GPUs of
different kinds sharing one directory do not wait for each other), plus a thread lock for threads
of one process. Where fcntl is missing (Windows) it only excludes threads. It is re-entrant per
thread: an inner `key_lock` of a key the thread already holds yields at once, so warmup and the
selector can both take it. A process that dies holding it releases it (the kernel drops flocks
with the file descriptor). After `timeout` seconds of waiting it logs a warning and yields False:
a hung probe elsewhere costs a duplicate probe, never a deadlock.

`MemoryStore.key_lock` excludes threads only; a memory store is private to its process.

Files (PersistentStore)
-----------------------
`<dir>/decisions.sqlite3` in WAL mode (many readers and one writer at a time; every write is one
`BEGIN IMMEDIATE` transaction, retried with backoff while another process holds the lock). A file
that is not a SQLite database, or fails `PRAGMA integrity_check`, is renamed to
`decisions.sqlite3.corrupt-<timestamp>` (with its -wal and -shm files, so a stale log is never
replayed into the new database) and a new database is started. WAL needs a local file system:
SQLite's locks do not work across hosts on NFS, so point FUSEDATTN_SELECT_CACHE_DIR at local disk
on clusters whose home directories are network mounts.

Serialized plans load native code: they are only read from, or written to, a directory owned by
the current user and not writable by group or others (and a database file with the same
properties); otherwise plans are refused with one warning and decisions are still cached.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import json
import logging
import os
import random
import re
import sqlite3
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; key locks exclude threads only
    fcntl = None  # type: ignore[assignment]

from fusedattn_select._version import __version__
from fusedattn_select.errors import FusedAttnSelectError
from fusedattn_select.types import Fingerprint, Outcome, ProbeDepth, Verdict

log = logging.getLogger("fusedattn_select")

CACHE_DIR_ENV = "FUSEDATTN_SELECT_CACHE_DIR"
CACHE_SWITCH_ENV = "FUSEDATTN_SELECT_CACHE"
MAX_BYTES_ENV = "FUSEDATTN_SELECT_CACHE_MAX_BYTES"
CACHE_OFF_VALUES = ("off", "0", "false", "no")
DATABASE_NAME = "decisions.sqlite3"
DEFAULT_MAX_BYTES = 512 * 1024**2
SCHEMA_VERSION = 1
EXPORT_FORMAT = "fusedattn-select-cache"

# Eviction frees down to this fraction of max_bytes, so a full store does not evict on every put.
EVICT_TO_FRACTION = 0.9
# SQLite's own busy handler waits this long per statement; on top of it, an operation is retried
# with backoff until LOCKED_RETRY_S. A write transaction here takes well under a millisecond, so
# only a stuck process holds the lock that long.
BUSY_TIMEOUT_S = 5.0
LOCKED_RETRY_S = 30.0
# A full probe of one problem (forward and backward builds) takes ~0.5-1.5 s; waiting minutes for
# another process's probe means that probe hangs, and probing here is better than waiting on.
KEY_LOCK_TIMEOUT_S = 120.0

_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26

_SCHEMA = (
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
_DATA_TABLES = ("verdicts", "plans", "fingerprints")

T = TypeVar("T")


class CacheError(FusedAttnSelectError):
    """A cache file (the database or an export) cannot be used."""


class CacheUnavailableError(CacheError):
    """The persistent store cannot be opened here (unwritable directory, newer schema)."""


class _StoreFailure(Exception):
    """An operation on the database failed after retries; public methods turn it into a miss."""


class _BadEntry(ValueError):
    """A stored row that must not be trusted; the message says why."""


# ----- locations and settings -------------------------------------------------------------------
def default_cache_dir() -> Path:
    """$FUSEDATTN_SELECT_CACHE_DIR, else $XDG_CACHE_HOME/fusedattn-select, else ~/.cache/fusedattn-select."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore relative paths
        return Path(xdg) / "fusedattn-select"
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "fusedattn-select"
    return Path.home() / ".cache" / "fusedattn-select"


_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def max_bytes_from_env() -> int:
    """$FUSEDATTN_SELECT_CACHE_MAX_BYTES (bytes; K, M, G, T suffixes are powers of 1024)."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    match = re.fullmatch(r"(\d+)\s*([kmgt]?)(?:i?b)?", text.lower())
    if match is None or int(match.group(1)) <= 0:
        log.warning(
            "fusedattn_select: %s=%r: must be a positive number of bytes (K, M, G suffixes allowed); "
            "using %d MiB", MAX_BYTES_ENV, text, DEFAULT_MAX_BYTES // 1024**2,
        )
        return DEFAULT_MAX_BYTES
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def _check_max_bytes(max_bytes: int | None) -> int:
    if max_bytes is None:
        return max_bytes_from_env()
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes={max_bytes!r}: must be a positive integer number of bytes")
    return max_bytes


# ----- entry encoding and validation ------------------------------------------------------------
def _encode_verdicts(verdicts: tuple[Verdict, ...]) -> str:
    # Not sort_keys: timings_ms is an ordered mapping (the cuDNN steps in the order they ran).
    return json.dumps([v.to_dict() for v in verdicts], separators=(",", ":"))


def _parse_verdicts(data: Any) -> tuple[Verdict, ...]:
    if not isinstance(data, list) or not data:
        raise _BadEntry("verdicts are not a non-empty list")
    try:
        verdicts = tuple(Verdict.from_dict(item) for item in data)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise _BadEntry(f"a verdict does not parse ({type(err).__name__}: {err})") from None
    if any(v.outcome is Outcome.FAILED for v in verdicts):
        raise _BadEntry("holds a FAILED verdict, which is never cached")
    return verdicts


def _parse_depth(value: Any) -> ProbeDepth:
    try:
        return ProbeDepth(value)
    except ValueError:
        raise _BadEntry(f"depth {value!r} is not 'fast' or 'full'") from None


def _parse_row(depth: Any, text: Any) -> tuple[tuple[Verdict, ...], ProbeDepth]:
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as err:
        raise _BadEntry(f"verdicts are not valid JSON ({err})") from None
    return _parse_verdicts(data), _parse_depth(depth)


def _checked_entry(fingerprint: Fingerprint, key: str, verdicts: Iterable[Verdict],
                   depth: ProbeDepth | str) -> tuple[tuple[Verdict, ...], ProbeDepth]:
    _check_fingerprint(fingerprint)
    _check_key("key", key)
    verdicts = tuple(verdicts)
    if not verdicts or not all(isinstance(v, Verdict) for v in verdicts):
        raise ValueError(f"verdicts={verdicts!r}: must be a non-empty sequence of Verdict")
    failed = [v for v in verdicts if v.outcome is Outcome.FAILED]
    if failed:
        raise ValueError(
            f"verdicts: {failed[0].reason()}: FAILED verdicts are incidents (out of memory, CUDA "
            "error, timeout), not answers, and are never stored"
        )
    try:
        depth = ProbeDepth(depth)
    except ValueError:
        raise ValueError(f"depth={depth!r}: must be 'fast' or 'full'") from None
    return verdicts, depth


def _check_fingerprint(fingerprint: Fingerprint) -> None:
    if not isinstance(fingerprint, Fingerprint):
        raise TypeError(f"fingerprint={fingerprint!r}: must be a Fingerprint")


def _check_key(name: str, key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"{name}={key!r}: must be a non-empty string")


def _check_blob(blob: bytes) -> bytes:
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise TypeError(f"blob: must be bytes, not {type(blob).__name__}")
    return bytes(blob)


def _sha256(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def _verdict_row_size(fingerprint_key: str, key: str, text: str) -> int:
    return len(text.encode()) + len(fingerprint_key) + len(key)


def _lock_file_name(fingerprint: Fingerprint, key: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", key):
        key = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"{fingerprint.key()}-{key}"


# ----- import report ----------------------------------------------------------------------------
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


# ----- behaviour shared by both stores ----------------------------------------------------------
class _Store:
    """Key locks, export and import; subclasses hold the rows."""

    kind = ""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = _check_max_bytes(max_bytes)
        self._key_locks: dict[str, threading.Lock] = {}
        self._key_locks_guard = threading.Lock()
        self._held = threading.local()

    # The interface subclasses implement (see the module docstring).
    def get(self, fingerprint: Fingerprint, key: str) -> tuple[tuple[Verdict, ...], ProbeDepth] | None:
        raise NotImplementedError

    def put(self, fingerprint: Fingerprint, key: str, verdicts: Iterable[Verdict],
            depth: ProbeDepth | str) -> bool:
        return self._put(fingerprint, key, verdicts, depth) == "stored"

    def _put(self, fingerprint: Fingerprint, key: str, verdicts: Iterable[Verdict],
             depth: ProbeDepth | str) -> str:
        """put(), answering "stored", "kept full entry" or "failed"."""
        raise NotImplementedError

    def put_plan(self, fingerprint: Fingerprint, plan_key: str, blob: bytes) -> bool:
        raise NotImplementedError

    def _plan_to_store(self, fingerprint: Fingerprint, plan_key: str, blob: bytes) -> bytes | None:
        """Check put_plan's arguments (TypeError or ValueError); the blob as bytes, or None (logged)
        when it is larger than the whole cache."""
        _check_fingerprint(fingerprint)
        _check_key("plan_key", plan_key)
        blob = _check_blob(blob)
        if len(blob) > self.max_bytes:
            log.warning("fusedattn_select: plan %s (%d bytes) is larger than the cache (max_bytes=%d); not stored",
                        plan_key, len(blob), self.max_bytes)
            return None
        return blob

    def _plan_refusal(self) -> str:
        """Why plans may not be loaded from or written to this store ("" when they may)."""
        return ""

    def _export_rows(self, fingerprint_key: str | None) -> tuple[dict, list[dict], list[dict]]:
        """(fingerprints by key, verdict rows, plan rows) of valid entries, for export()."""
        raise NotImplementedError

    # ----- cross-process single flight --------------------------------------------------------
    @contextlib.contextmanager
    def key_lock(self, fingerprint: Fingerprint, key: str,
                 timeout: float = KEY_LOCK_TIMEOUT_S) -> Iterator[bool]:
        """Hold the probe of (fingerprint, key) exclusively; yields False if it had to go on without."""
        _check_fingerprint(fingerprint)
        _check_key("key", key)
        name = _lock_file_name(fingerprint, key)
        held: set[str] = self._held.__dict__.setdefault("names", set())
        if name in held:
            yield True
            return
        with self._key_locks_guard:
            thread_lock = self._key_locks.setdefault(name, threading.Lock())
        deadline = time.monotonic() + timeout
        if not thread_lock.acquire(timeout=max(timeout, 0.0)):
            log.warning("fusedattn_select: waited %.0f s for the probe of %s in another thread; "
                        "probing without the lock", timeout, key)
            yield False
            return
        held.add(name)
        try:
            with self._process_lock(name, key, deadline) as exclusive:
                yield exclusive
        finally:
            held.discard(name)
            thread_lock.release()

    def _process_lock(self, name: str, key: str, deadline: float) -> contextlib.AbstractContextManager[bool]:
        return contextlib.nullcontext(True)

    # ----- export and import -------------------------------------------------------------------
    def export(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> dict:
        """Write every valid entry (of `fingerprint` only, when given) to a JSON file.

        Plans are base64 with their sha256. Returns {"path", "verdicts", "plans"} counts.
        """
        only = _fingerprint_key(fingerprint)
        fingerprints, verdict_rows, plan_rows = self._export_rows(only)
        document = {
            "format": EXPORT_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "library_version": __version__,
            "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "fingerprints": fingerprints,
            "verdicts": verdict_rows,
            "plans": plan_rows,
        }
        path = Path(path)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
        os.replace(temporary, path)  # readers never see a half-written export
        log.info("fusedattn_select: exported %d decisions and %d plans to %s",
                 len(verdict_rows), len(plan_rows), path)
        return {"path": str(path), "verdicts": len(verdict_rows), "plans": len(plan_rows)}

    def import_(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> ImportReport:
        """Load an export file, verifying every row; with `fingerprint`, only rows of that fingerprint.

        Rows of another fingerprint, rows that do not parse, plans whose sha256 or size do not
        match and FAST rows where a FULL entry is stored are skipped, each with its reason.
        Raises CacheError when the file is not an export at all.
        """
        document = _read_export(Path(path))
        only = _fingerprint_key(fingerprint)
        fingerprints, problems = _export_fingerprints(document.get("fingerprints"))
        skipped: list[tuple[str, str]] = []
        imported_verdicts = imported_plans = 0

        def owner(kind: str, row: Any) -> tuple[str, Fingerprint | None]:
            if not isinstance(row, dict):
                skipped.append((f"{kind} {row!r:.40}", "not an object"))
                return "", None
            fp_key = str(row.get("fingerprint", ""))
            label = f"{kind} {fp_key[:12]}/{str(row.get('key', ''))[:32]}"
            if only is not None and fp_key != only:
                skipped.append((label, f"foreign fingerprint {fp_key[:12]} (importing only {only[:12]})"))
                return label, None
            if fp_key in problems:
                skipped.append((label, problems[fp_key]))
                return label, None
            if fp_key not in fingerprints:
                skipped.append((label, f"fingerprint {fp_key[:12]} is not described in the file"))
                return label, None
            return label, fingerprints[fp_key]

        for row in _list_field(document, "verdicts"):
            label, fp = owner("decision", row)
            if fp is None:
                continue
            key = row.get("key")
            if not isinstance(key, str) or not key:
                skipped.append((label, f"key={key!r}: must be a non-empty string"))
                continue
            try:
                verdicts = _parse_verdicts(row.get("verdicts"))
                depth = _parse_depth(row.get("depth"))
            except _BadEntry as err:
                skipped.append((label, str(err)))
                continue
            outcome = self._put(fp, key, verdicts, depth)
            if outcome == "stored":
                imported_verdicts += 1
            else:
                skipped.append((label, "a full-depth decision is already stored" if outcome == "kept full entry"
                                else "the store could not write it (see the warning)"))

        plan_rows = _list_field(document, "plans")
        refusal = self._plan_refusal() if plan_rows else ""
        for row in plan_rows:
            label, fp = owner("plan", row)
            if fp is None:
                continue
            if refusal:
                skipped.append((label, f"plans refused: {refusal}"))
                continue
            key = row.get("key")
            if not isinstance(key, str) or not key:
                skipped.append((label, f"key={key!r}: must be a non-empty string"))
                continue
            try:
                blob = base64.b64decode(row.get("blob", ""), validate=True)
            except (TypeError, ValueError) as err:
                skipped.append((label, f"blob is not base64 ({err})"))
                continue
            if row.get("size") != len(blob):
                skipped.append((label, f"blob has {len(blob)} bytes, the row says {row.get('size')!r} (truncated)"))
                continue
            if row.get("sha256") != _sha256(blob):
                skipped.append((label, "sha256 of the blob does not match the row"))
                continue
            if self.put_plan(fp, key, blob):
                imported_plans += 1
            else:
                skipped.append((label, "the store refused the plan (see the warning)"))

        report = ImportReport(imported_verdicts, imported_plans, tuple(skipped))
        log.info("fusedattn_select: imported %d decisions and %d plans from %s (%d rows skipped)",
                 imported_verdicts, imported_plans, path, len(skipped))
        return report


def _fingerprint_key(fingerprint: Fingerprint | str | None) -> str | None:
    if fingerprint is None or isinstance(fingerprint, str):
        return fingerprint
    _check_fingerprint(fingerprint)
    return fingerprint.key()


def _read_export(path: Path) -> dict:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CacheError(f"cache export {path}: cannot be read ({err.strerror or err})") from None
    except ValueError as err:
        raise CacheError(f"cache export {path}: is not JSON ({err})") from None
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise CacheError(f"cache export {path}: format must be {EXPORT_FORMAT!r} (written by export())")
    version = document.get("schema_version")
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise CacheError(f"cache export {path}: schema_version={version!r}: this version reads 1..{SCHEMA_VERSION}")
    return document


def _list_field(document: dict, name: str) -> list:
    value = document.get(name, [])
    if not isinstance(value, list):
        raise CacheError(f"cache export: {name!r} must be a list of rows")
    return value


def _export_fingerprints(value: Any) -> tuple[dict[str, Fingerprint], dict[str, str]]:
    """Fingerprints of an export file whose description hashes to their key, and why others don't."""
    if not isinstance(value, dict):
        raise CacheError("cache export: 'fingerprints' must map fingerprint keys to descriptions")
    good: dict[str, Fingerprint] = {}
    problems: dict[str, str] = {}
    for key, description in value.items():
        try:
            fingerprint = Fingerprint.from_dict(description)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            problems[key] = f"fingerprint description does not parse ({type(err).__name__}: {err})"
            continue
        if fingerprint.key() != key:
            problems[key] = f"fingerprint description hashes to {fingerprint.key()[:12]}, not to its key {key[:12]}"
            continue
        good[key] = fingerprint
    return good, problems


# ----- persistent store -------------------------------------------------------------------------
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
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _unsafe_for_plans(paths: Iterable[Path]) -> str:
    """Why native code must not be loaded from these paths ("" when it may)."""
    current_user = getattr(os, "geteuid", None)
    for path in paths:
        try:
            info = os.stat(path)
        except FileNotFoundError:
            continue
        if current_user is not None and info.st_uid != current_user():
            return f"{path} is owned by uid {info.st_uid}, not by this user (uid {current_user()})"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return ""


@contextlib.contextmanager
def _flock(path: Path, deadline: float) -> Iterator[bool]:
    """Exclusive flock on `path` until `deadline` (monotonic); yields whether it was acquired."""
    if fcntl is None:  # pragma: no cover - Windows
        yield True
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                acquired = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    acquired = False
                    break
                # Polling rather than a blocking flock keeps the timeout; 20 ms is small next to a
                # probe (a few ms fast, hundreds of ms full) and to a transaction wait.
                time.sleep(delay)
                delay = min(delay * 2, 0.02)
        try:
            yield acquired
        finally:
            if acquired:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# Connections inherited by a forked child: SQLite forbids using them there, and closing them in
# the child could disturb the parent, so they are kept alive and never touched.
_INHERITED_CONNECTIONS: list[sqlite3.Connection] = []


class PersistentStore(_Store):
    """Decisions and serialized plans in `<directory>/decisions.sqlite3`, shared by processes.

    Raises CacheUnavailableError when the directory cannot be created or written, or holds a
    database of a newer schema. See the module docstring for the guarantees.
    """

    kind = "sqlite"

    def __init__(self, directory: str | os.PathLike, max_bytes: int | None = None) -> None:
        super().__init__(max_bytes)
        self.directory = Path(directory).expanduser()
        self.path = self.directory / DATABASE_NAME
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._identity: tuple[int, int] | None = None
        self._plan_warning_given = False
        self._lock_warning_given = False
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise CacheUnavailableError(
                f"cache directory {self.directory} cannot be created ({err.strerror or err})"
            ) from None
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise CacheUnavailableError(f"cache directory {self.directory} is not writable")
        try:
            self._run("open", lambda conn: None)
        except _StoreFailure as err:
            raise CacheUnavailableError(f"cannot use the decision cache {self.path}: {err}") from None

    # ----- decisions ---------------------------------------------------------------------------
    def get(self, fingerprint: Fingerprint, key: str) -> tuple[tuple[Verdict, ...], ProbeDepth] | None:
        _check_fingerprint(fingerprint)
        fp_key = fingerprint.key()
        row = self._read_row("decision", "depth, verdicts", fp_key, key)
        if row is None:
            return None
        depth, text = row
        try:
            entry = _parse_row(depth, text)
        except _BadEntry as bad:
            self._drop_bad_row("decision", fp_key, key, bad, "verdicts", text)
            return None
        self._record_use("decision", fp_key, key)
        return entry

    def _put(self, fingerprint: Fingerprint, key: str, verdicts: Iterable[Verdict],
             depth: ProbeDepth | str) -> str:
        verdicts, depth = _checked_entry(fingerprint, key, verdicts, depth)
        fp_key = fingerprint.key()
        text = _encode_verdicts(verdicts)
        size = _verdict_row_size(fp_key, key, text)

        def write(conn: sqlite3.Connection) -> str:
            now = time.time()
            stored = conn.execute(
                "SELECT depth FROM verdicts WHERE fingerprint_key = ? AND config_key = ?", (fp_key, key),
            ).fetchone()
            if stored is not None and stored[0] == ProbeDepth.FULL.value and depth is ProbeDepth.FAST:
                conn.execute("UPDATE verdicts SET last_used = ? WHERE fingerprint_key = ? AND config_key = ?",
                             (now, fp_key, key))
                return "kept full entry"
            self._remember_fingerprint(conn, fingerprint, now)
            conn.execute(
                "INSERT INTO verdicts (fingerprint_key, config_key, depth, verdicts, size, created, last_used)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (fingerprint_key, config_key) DO UPDATE SET depth = excluded.depth,"
                " verdicts = excluded.verdicts, size = excluded.size, created = excluded.created,"
                " last_used = excluded.last_used",
                (fp_key, key, depth.value, text, size, now, now),
            )
            rowid = conn.execute("SELECT rowid FROM verdicts WHERE fingerprint_key = ? AND config_key = ?",
                                 (fp_key, key)).fetchone()[0]
            self._evict(conn, keep=("verdicts", rowid))
            return "stored"

        try:
            return self._run("store a decision", write, write=True)
        except _StoreFailure as err:
            log.warning("fusedattn_select: decision cache %s: %s; the decision is not persisted", self.path, err)
            return "failed"

    # ----- plans -------------------------------------------------------------------------------
    def put_plan(self, fingerprint: Fingerprint, plan_key: str, blob: bytes) -> bool:
        blob = self._plan_to_store(fingerprint, plan_key, blob)
        if blob is None or self._plan_refusal():
            return False
        fp_key = fingerprint.key()
        digest = _sha256(blob)

        def write(conn: sqlite3.Connection) -> None:
            now = time.time()
            self._remember_fingerprint(conn, fingerprint, now)
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
            self._run("store a plan", write, write=True)
        except _StoreFailure as err:
            log.warning("fusedattn_select: decision cache %s: %s; the plan is not persisted", self.path, err)
            return False
        return True

    def get_plan(self, fingerprint: Fingerprint, plan_key: str) -> bytes | None:
        _check_fingerprint(fingerprint)
        if self._plan_refusal():
            return None
        fp_key = fingerprint.key()
        row = self._read_row("plan", "sha256, size, blob", fp_key, plan_key)
        if row is None:
            return None
        digest, size, blob = row
        problem = ""
        if not isinstance(blob, bytes):
            problem = f"blob is {type(blob).__name__}, not bytes"
        elif len(blob) != size:
            problem = f"blob has {len(blob)} bytes, {size} were stored (truncated)"
        elif _sha256(blob) != digest:
            problem = "sha256 of the blob does not match the stored digest"
        if problem:
            self._drop_bad_row("plan", fp_key, plan_key, problem, "sha256", digest)
            return None
        self._record_use("plan", fp_key, plan_key)
        return blob

    def _plan_refusal(self) -> str:
        problem = _unsafe_for_plans((self.directory, self.path))
        if problem and not self._plan_warning_given:
            self._plan_warning_given = True
            log.warning(
                "fusedattn_select: not using serialized plans in %s: %s. Plans load native code, so "
                "the cache directory must be owned by you and writable by no one else (chmod 700); "
                "decisions are still cached", self.directory, problem,
            )
        return problem

    # ----- whole store -------------------------------------------------------------------------
    def info(self) -> dict[str, object]:
        def read(conn: sqlite3.Connection) -> tuple[int, int, int]:
            entries = conn.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]
            plans = conn.execute("SELECT COUNT(*) FROM plans").fetchone()[0]
            return entries, plans, self._payload_bytes(conn)

        try:
            entries, plans, payload = self._run("read the totals", read)
        except _StoreFailure as err:
            log.warning("fusedattn_select: decision cache %s: %s", self.path, err)
            entries = plans = payload = 0
        return {
            "kind": self.kind, "path": str(self.path), "entries": entries, "plans": plans,
            "bytes": payload, "max_bytes": self.max_bytes,
        }

    def clear(self) -> None:
        def wipe(conn: sqlite3.Connection) -> None:
            for table in _DATA_TABLES:
                conn.execute(f"DELETE FROM {table}")

        try:
            self._run("clear", wipe, write=True)
        except _StoreFailure as err:
            log.warning("fusedattn_select: decision cache %s: %s; not cleared", self.path, err)

    def close(self) -> None:
        """Close this process's connection (the next use reopens it)."""
        with self._lock:
            self._close()

    def integrity_check(self) -> list[str]:
        """SQLite's integrity_check of the database file: ["ok"] when it is sound."""
        return self._run("check integrity", lambda conn: [
            row[0] for row in conn.execute("PRAGMA integrity_check")
        ])

    def _export_rows(self, fingerprint_key: str | None) -> tuple[dict, list[dict], list[dict]]:
        where, args = ("WHERE fingerprint_key = ?", (fingerprint_key,)) if fingerprint_key else ("", ())

        def read(conn: sqlite3.Connection) -> tuple[list, list, list]:
            return (
                conn.execute(f"SELECT fingerprint_key, fingerprint FROM fingerprints {where}", args).fetchall(),
                conn.execute("SELECT fingerprint_key, config_key, depth, verdicts, created FROM verdicts "
                             f"{where} ORDER BY fingerprint_key, config_key", args).fetchall(),
                [] if self._plan_refusal() else conn.execute(
                    "SELECT fingerprint_key, plan_key, sha256, size, blob FROM plans "
                    f"{where} ORDER BY fingerprint_key, plan_key", args).fetchall(),
            )

        fingerprint_rows, verdict_rows, plan_rows = self._run("export", read)
        fingerprints = {}
        for fp_key, text in fingerprint_rows:
            with contextlib.suppress(ValueError, TypeError):
                fingerprints[fp_key] = json.loads(text)
        verdicts = []
        for fp_key, key, depth, text, created in verdict_rows:
            try:
                parsed, parsed_depth = _parse_row(depth, text)
            except _BadEntry as bad:
                log.warning("fusedattn_select: not exporting the decision %s: %s", key, bad)
                continue
            verdicts.append({"fingerprint": fp_key, "key": key, "depth": parsed_depth.value,
                             "verdicts": [v.to_dict() for v in parsed], "created": created})
        plans = []
        for fp_key, key, digest, size, blob in plan_rows:
            if not isinstance(blob, bytes) or len(blob) != size or _sha256(blob) != digest:
                log.warning("fusedattn_select: not exporting the damaged plan %s", key)
                continue
            plans.append({"fingerprint": fp_key, "key": key, "sha256": digest, "size": size,
                          "blob": base64.b64encode(blob).decode("ascii")})
        return fingerprints, verdicts, plans

    # ----- internals ---------------------------------------------------------------------------
    # A decision or a plan is one row of its table, keyed by (fingerprint_key, its key column).
    _ROWS = {"decision": ("verdicts", "config_key"), "plan": ("plans", "plan_key")}

    def _read_row(self, kind: str, columns: str, fp_key: str, key: str) -> tuple | None:
        """`columns` of the `kind` ("decision" or "plan") row, or None: no row, or unreadable (logged)."""
        table, key_column = self._ROWS[kind]
        try:
            return self._run(f"read a {kind}", lambda conn: conn.execute(
                f"SELECT {columns} FROM {table} WHERE fingerprint_key = ? AND {key_column} = ?",
                (fp_key, key),
            ).fetchone())
        except _StoreFailure as err:
            log.warning("fusedattn_select: decision cache %s: %s; treated as a miss", self.path, err)
            return None

    def _drop_bad_row(self, kind: str, fp_key: str, key: str, problem: object, column: str,
                      value: object) -> None:
        """Log and delete the damaged `kind` row that was read (its `column` was `value`)."""
        table, key_column = self._ROWS[kind]
        log.warning("fusedattn_select: dropped the cached %s %s from %s: %s", kind, key, self.path, problem)
        # Only the row that was read: another process may have replaced it meanwhile.
        self._write_quietly(f"drop a bad {kind}", lambda conn: conn.execute(
            f"DELETE FROM {table} WHERE fingerprint_key = ? AND {key_column} = ? AND {column} IS ?",
            (fp_key, key, value),
        ))

    def _record_use(self, kind: str, fp_key: str, key: str) -> None:
        """Stamp the `kind` row's last_used (for least-recently-used eviction)."""
        table, key_column = self._ROWS[kind]
        self._write_quietly(f"record a {kind}'s use", lambda conn: conn.execute(
            f"UPDATE {table} SET last_used = ? WHERE fingerprint_key = ? AND {key_column} = ?",
            (time.time(), fp_key, key),
        ))

    @staticmethod
    def _remember_fingerprint(conn: sqlite3.Connection, fingerprint: Fingerprint, now: float) -> None:
        conn.execute(
            "INSERT OR IGNORE INTO fingerprints (fingerprint_key, fingerprint, created) VALUES (?, ?, ?)",
            (fingerprint.key(), json.dumps(fingerprint.to_dict(), sort_keys=True), now),
        )

    @staticmethod
    def _payload_bytes(conn: sqlite3.Connection) -> int:
        return conn.execute(
            "SELECT (SELECT COALESCE(SUM(size), 0) FROM plans) + (SELECT COALESCE(SUM(size), 0) FROM verdicts)"
        ).fetchone()[0]

    def _evict(self, conn: sqlite3.Connection, keep: tuple[str, int]) -> None:
        """Least recently used first, plans before decisions, down to 90% of max_bytes."""
        total = self._payload_bytes(conn)
        if total <= self.max_bytes:
            return
        target = int(self.max_bytes * EVICT_TO_FRACTION)
        evicted = {}
        for table in ("plans", "verdicts"):
            doomed = []
            rows = conn.execute(f"SELECT rowid, size FROM {table} ORDER BY last_used, rowid").fetchall()
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
        log.info("fusedattn_select: decision cache over %d bytes: evicted %d plans and %d decisions",
                 self.max_bytes, evicted.get("plans", 0), evicted.get("verdicts", 0))

    def _process_lock(self, name: str, key: str, deadline: float) -> contextlib.AbstractContextManager[bool]:
        return self._key_file_lock(name, key, deadline)

    @contextlib.contextmanager
    def _key_file_lock(self, name: str, key: str, deadline: float) -> Iterator[bool]:
        with contextlib.ExitStack() as stack:
            try:
                acquired = stack.enter_context(_flock(self.directory / "locks" / f"{name}.lock", deadline))
            except OSError as err:
                acquired = False
                if not self._lock_warning_given:
                    self._lock_warning_given = True
                    log.warning("fusedattn_select: cannot create lock files in %s (%s); processes may "
                                "probe the same problem at once", self.directory / "locks", err.strerror or err)
            else:
                if not acquired:
                    log.warning("fusedattn_select: another process held the probe of %s past the "
                                "timeout; probing without the lock", key)
            yield acquired

    def _write_quietly(self, what: str, action: Callable[[sqlite3.Connection], object]) -> None:
        """A write that may fail without harm (bookkeeping): log it and go on, without waiting long."""
        try:
            self._run(what, action, write=True, patience_s=1.0)
        except _StoreFailure as err:
            log.debug("fusedattn_select: decision cache %s: %s", self.path, err)

    def _run(self, what: str, action: Callable[[sqlite3.Connection], T], *, write: bool = False,
             patience_s: float | None = None) -> T:
        """Run action(conn) (in one write transaction when `write`).

        Retries with backoff for `patience_s` (default LOCKED_RETRY_S) while another process holds
        the database lock; recovers once from a corrupt database (set aside, rebuilt) or one
        another process replaced. Raises _StoreFailure.
        """
        patience_s = LOCKED_RETRY_S if patience_s is None else patience_s
        deadline = time.monotonic() + patience_s
        delay = 0.005
        recovered = False
        while True:
            with self._lock:
                try:
                    conn = self._connection()
                    return self._transaction(conn, action) if write else action(conn)
                except sqlite3.OperationalError as err:
                    if _is_busy(err):
                        if time.monotonic() >= deadline:
                            raise _StoreFailure(f"{what}: the database stayed locked for {patience_s:.0f} s") from err
                    elif not recovered and _error_code(err) in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
                        self._recover(err)
                        recovered = True
                        continue
                    elif not recovered and self._identity is not None and _file_identity(self.path) != self._identity:
                        # Another process set a corrupt file aside, or someone deleted the cache.
                        self._close()
                        recovered = True
                        continue
                    else:
                        raise _StoreFailure(f"{what}: {err}") from err
                except sqlite3.DatabaseError as err:
                    if recovered:
                        raise _StoreFailure(f"{what}: {err}") from err
                    self._recover(err)
                    recovered = True
                    continue
                except (OSError, CacheUnavailableError) as err:
                    raise _StoreFailure(f"{what}: {err}") from err
            # Back off outside the thread lock, with jitter so waiting processes do not retry in step.
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.25)

    @staticmethod
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

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid != os.getpid():
            _INHERITED_CONNECTIONS.append(self._conn)
            self._conn = None
        if self._conn is None:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
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
                if self._schema_version(conn) != SCHEMA_VERSION:
                    self._transaction(conn, self._create_schema)
            except BaseException:
                conn.close()
                raise
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    @staticmethod
    def _schema_version(conn: sqlite3.Connection) -> int | None:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone() is None:
            return None
        row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        try:
            return int(row[0]) if row is not None else None
        except (TypeError, ValueError):
            return 0

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        version = self._schema_version(conn)  # again, inside the lock: another process may have won
        if version == SCHEMA_VERSION:
            return
        if version is not None and version > SCHEMA_VERSION:
            raise CacheUnavailableError(
                f"{self.path} has schema version {version}, written by a newer fusedattn-select; this "
                f"version ({__version__}) reads schema {SCHEMA_VERSION}"
            )
        if version is not None:
            log.warning("fusedattn_select: decision cache %s has schema %s; starting it over at schema %d",
                        self.path, version, SCHEMA_VERSION)
            for table in _DATA_TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('created_by', ?)",
                     (f"fusedattn-select {__version__}",))

    def _close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
        self._conn = None

    def _recover(self, err: sqlite3.Error) -> None:
        """The database reported corruption: set the file aside and let the next use start anew.

        Serialised across processes by a lock file, so two processes that both saw the damage do
        not set aside each other's rebuilt database.
        """
        identity = self._identity
        self._close()
        deadline = time.monotonic() + LOCKED_RETRY_S
        with _flock(self.directory / f"{DATABASE_NAME}.recover.lock", deadline):
            if _file_identity(self.path) != identity:
                return  # another process already replaced it
            problem = _integrity_problem(self.path)
            if problem is None:
                return  # sound after all: the caller retries once
            stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S.%f")
            aside = self.path.with_name(f"{DATABASE_NAME}.corrupt-{stamp}")
            os.replace(self.path, aside)
            # A stale write-ahead log must never be replayed into the new database.
            for suffix in ("-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
        log.warning("fusedattn_select: the decision cache %s is damaged (%s); moved it to %s and "
                    "started a new one", self.path, problem, aside.name)


def _integrity_problem(path: Path) -> str | None:
    """What is wrong with the database file, or None when integrity_check passes."""
    try:
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S)
        try:
            rows = [row[0] for row in conn.execute("PRAGMA integrity_check(5)")]
        finally:
            conn.close()
    except sqlite3.OperationalError as err:
        if _is_busy(err):
            return None  # cannot tell while another process writes; do not set a live file aside
        return str(err)
    except sqlite3.DatabaseError as err:
        return str(err)
    return None if rows == ["ok"] else "; ".join(rows)


# ----- memory store -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _MemoryEntry:
    verdicts: tuple[Verdict, ...]
    depth: ProbeDepth
    size: int
    created: float


class MemoryStore(_Store):
    """The persistent store's interface over dicts, for one process (persistence off or impossible)."""

    kind = "memory"
    path = None
    directory = None

    def __init__(self, max_bytes: int | None = None) -> None:
        super().__init__(max_bytes)
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[tuple[str, str], _MemoryEntry] = OrderedDict()
        self._plans: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._fingerprints: dict[str, Fingerprint] = {}

    def get(self, fingerprint: Fingerprint, key: str) -> tuple[tuple[Verdict, ...], ProbeDepth] | None:
        _check_fingerprint(fingerprint)
        with self._lock:
            entry = self._verdicts.get((fingerprint.key(), key))
            if entry is None:
                return None
            self._verdicts.move_to_end((fingerprint.key(), key))
            return entry.verdicts, entry.depth

    def _put(self, fingerprint: Fingerprint, key: str, verdicts: Iterable[Verdict],
             depth: ProbeDepth | str) -> str:
        verdicts, depth = _checked_entry(fingerprint, key, verdicts, depth)
        fp_key = fingerprint.key()
        size = _verdict_row_size(fp_key, key, _encode_verdicts(verdicts))
        with self._lock:
            stored = self._verdicts.get((fp_key, key))
            if stored is not None and stored.depth is ProbeDepth.FULL and depth is ProbeDepth.FAST:
                self._verdicts.move_to_end((fp_key, key))
                return "kept full entry"
            self._fingerprints.setdefault(fp_key, fingerprint)
            self._verdicts[(fp_key, key)] = _MemoryEntry(verdicts, depth, size, time.time())
            self._verdicts.move_to_end((fp_key, key))
            self._evict(keep=("verdicts", (fp_key, key)))
        return "stored"

    def put_plan(self, fingerprint: Fingerprint, plan_key: str, blob: bytes) -> bool:
        blob = self._plan_to_store(fingerprint, plan_key, blob)
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
        _check_fingerprint(fingerprint)
        with self._lock:
            blob = self._plans.get((fingerprint.key(), plan_key))
            if blob is not None:
                self._plans.move_to_end((fingerprint.key(), plan_key))
            return blob

    def info(self) -> dict[str, object]:
        with self._lock:
            return {
                "kind": self.kind, "path": None, "entries": len(self._verdicts), "plans": len(self._plans),
                "bytes": self._payload_bytes(), "max_bytes": self.max_bytes,
            }

    def clear(self) -> None:
        with self._lock:
            self._verdicts.clear()
            self._plans.clear()
            self._fingerprints.clear()

    def _payload_bytes(self) -> int:
        return sum(len(blob) for blob in self._plans.values()) + sum(e.size for e in self._verdicts.values())

    def _evict(self, keep: tuple[str, tuple[str, str]]) -> None:
        total = self._payload_bytes()
        if total <= self.max_bytes:
            return
        target = int(self.max_bytes * EVICT_TO_FRACTION)
        for table, rows in (("plans", self._plans), ("verdicts", self._verdicts)):
            for row_key in list(rows):  # oldest use first
                if total <= target:
                    return
                if (table, row_key) == keep:
                    continue
                value = rows.pop(row_key)
                total -= len(value) if isinstance(value, bytes) else value.size

    def _export_rows(self, fingerprint_key: str | None) -> tuple[dict, list[dict], list[dict]]:
        with self._lock:
            verdicts = [
                {"fingerprint": fp, "key": key, "depth": e.depth.value,
                 "verdicts": [v.to_dict() for v in e.verdicts], "created": e.created}
                for (fp, key), e in sorted(self._verdicts.items()) if fingerprint_key in (None, fp)
            ]
            plans = [
                {"fingerprint": fp, "key": key, "sha256": _sha256(blob), "size": len(blob),
                 "blob": base64.b64encode(blob).decode("ascii")}
                for (fp, key), blob in sorted(self._plans.items()) if fingerprint_key in (None, fp)
            ]
            fingerprints = {
                fp: fingerprint.to_dict() for fp, fingerprint in self._fingerprints.items()
                if fingerprint_key in (None, fp)
            }
        return fingerprints, verdicts, plans


# ----- the process's default store --------------------------------------------------------------
_fallback_warned = False
_fallback_lock = threading.Lock()


def open_default_store(max_bytes: int | None = None) -> PersistentStore | MemoryStore:
    """The store for this process: SQLite in default_cache_dir(), or memory.

    Memory when $FUSEDATTN_SELECT_CACHE=off, or (with one warning per process) when the cache
    directory cannot be used.
    """
    global _fallback_warned
    switch = os.environ.get(CACHE_SWITCH_ENV, "").strip().lower()
    if switch in CACHE_OFF_VALUES:
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
