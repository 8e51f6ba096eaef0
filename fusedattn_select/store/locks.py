"""Key locks: one prober per (fingerprint, key) among threads, and among processes sharing a directory.

The selector's single flight covers the threads of one process. Eight ranks warming the same
problems are eight processes; to build each problem once in total, a persistent store adds an
exclusive `fcntl.flock` on `<cache dir>/locks/<fingerprint key>-<cache key>.lock` (the fingerprint
is in the name so GPUs of different kinds sharing one directory do not wait for each other) to the
thread lock. Where fcntl is missing (Windows) key locks only exclude threads. A process that dies
holding a flock releases it (the kernel drops flocks with the file descriptor).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; key locks exclude threads only
    fcntl = None  # type: ignore[assignment]

from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.store.entry_rows import check_fingerprint, check_key
from fusedattn_select.types import Fingerprint

log = logging.getLogger("fusedattn_select")

# (lock name, cache key for messages, monotonic deadline) -> a context yielding whether it is held.
ProcessLock = Callable[[str, str, float], contextlib.AbstractContextManager[bool]]


def flock(path: Path, deadline: float) -> contextlib.AbstractContextManager[bool]:
    """Exclusive flock on `path` until `deadline` (monotonic); yields whether it was acquired."""

    def open_lock_file() -> int:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    return _exclusive(open_lock_file, deadline)


def flock_directory(directory: Path, deadline: float) -> contextlib.AbstractContextManager[bool]:
    """Exclusive flock on the directory itself until `deadline`: a lock that leaves no file behind."""
    return _flocked(lambda: os.open(directory, os.O_RDONLY), deadline, shared=False)


def shared_flock(directory: Path, deadline: float) -> contextlib.AbstractContextManager[bool]:
    """Shared flock on the directory itself until `deadline` (held by writers, excluding a salvage)."""
    return _flocked(lambda: os.open(directory, os.O_RDONLY), deadline, shared=True)


def _exclusive(open_descriptor: Callable[[], int], deadline: float) -> contextlib.AbstractContextManager[bool]:
    return _flocked(open_descriptor, deadline, shared=False)


@contextlib.contextmanager
def _flocked(open_descriptor: Callable[[], int], deadline: float, shared: bool) -> Iterator[bool]:
    """A flock on the descriptor `open_descriptor` opens (on entry) until `deadline`."""
    if fcntl is None:  # pragma: no cover - Windows
        yield True
        return
    fd = open_descriptor()
    try:
        acquired = _poll_flock(fd, deadline, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield acquired
        finally:
            if acquired:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _poll_flock(fd: int, deadline: float, mode: int) -> bool:
    delay = 0.001
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            # Polling rather than a blocking flock keeps the timeout; 20 ms is small next to a
            # probe (a few ms fast, hundreds of ms full) and to a transaction wait.
            time.sleep(delay)
            delay = min(delay * 2, 0.02)


def lock_name(fingerprint: Fingerprint, key: str) -> str:
    """The lock's name (and file name): the fingerprint key and the key, hashed if it is not a safe name."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", key):
        key = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"{fingerprint.key()}-{key}"


def _threads_only(name: str, key: str, deadline: float) -> contextlib.AbstractContextManager[bool]:
    return contextlib.nullcontext(True)


class KeyLocks:
    """A store's key_lock: a thread lock per key, re-entrant per thread, then `process_lock` if any.

    Re-entrant so that warmup and the selector can both take the lock of one key on one thread:
    an inner hold of a key the thread already holds yields True at once.
    """

    def __init__(self, process_lock: ProcessLock | None = None) -> None:
        self._process_lock = process_lock
        self._held = threading.local()  # (a forked child keeps its one thread's: holds it is inside)
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        # Fresh in a forked child too: a hold the child's thread was inside at the fork releases
        # the lock object it took. The parent's probes still exclude the child by their flocks.
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @contextlib.contextmanager
    def hold(self, fingerprint: Fingerprint, key: str, timeout: float) -> Iterator[bool]:
        """Hold (fingerprint, key) exclusively; yields False if it had to go on without after `timeout`."""
        check_fingerprint(fingerprint)
        check_key("key", key)
        name = lock_name(fingerprint, key)
        held: set[str] = self._held.__dict__.setdefault("names", set())
        if name in held:
            yield True
            return
        with self._guard:
            thread_lock = self._locks.setdefault(name, threading.Lock())
        deadline = time.monotonic() + timeout
        if not thread_lock.acquire(timeout=max(timeout, 0.0)):
            log.warning("fusedattn_select: waited %.0f s for the probe of %s in another thread; "
                        "probing without the lock", timeout, key)
            yield False
            return
        held.add(name)
        try:
            process_lock = self._process_lock or _threads_only
            with process_lock(name, key, deadline) as exclusive:
                yield exclusive
        finally:
            held.discard(name)
            thread_lock.release()


class LockFiles:
    """The cross-process half of a persistent store's key locks: flock files in `<directory>/locks`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory / "locks"
        self._warning_given = False

    @contextlib.contextmanager
    def hold(self, name: str, key: str, deadline: float) -> Iterator[bool]:
        """The flock of `name` until `deadline`; yields False (with a warning) when it could not be had."""
        with contextlib.ExitStack() as stack:
            try:
                acquired = stack.enter_context(flock(self.directory / f"{name}.lock", deadline))
            except OSError as err:
                acquired = False
                if not self._warning_given:
                    self._warning_given = True
                    log.warning("fusedattn_select: cannot create lock files in %s (%s); processes may "
                                "probe the same problem at once", self.directory, err.strerror or err)
            else:
                if not acquired:
                    log.warning("fusedattn_select: another process held the probe of %s past the "
                                "timeout; probing without the lock", key)
            yield acquired
