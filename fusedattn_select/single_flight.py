"""Single flight: a value missing from a table or a store is made once, however many threads or
processes ask for it at the same time."""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Generic, Hashable, Iterator, TypeVar

from fusedattn_select.forking import renew_locks_after_fork

V = TypeVar("V")


class OncePerKey(Generic[V]):
    """Values by key; `get_or_build` runs `build` once per missing key while other threads asking
    for that key wait for it, and threads asking for other keys build theirs at the same time.

    A read of a present key takes no lock (values are only ever added, replaced whole or cleared).
    """

    def __init__(self) -> None:
        self._values: dict[Hashable, V] = {}
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        # Fresh in a forked child too: a build another thread of the parent was running at fork()
        # never ends there, so a child asking for that key builds it itself.
        self._guard = threading.Lock()
        self._building: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable) -> V | None:
        return self._values.get(key)

    def get_or_build(self, key: Hashable, build: Callable[[], V]) -> tuple[V, bool]:
        """(value, built): `built` is True for the one call that ran `build`."""
        value = self._values.get(key)
        if value is not None:
            return value, False
        with self._guard:
            lock = self._building.setdefault(key, threading.Lock())
        with lock:
            value = self._values.get(key)
            if value is not None:
                return value, False
            value = build()
            with self._guard:
                self._values[key] = value
                self._building.pop(key, None)
            return value, True

    def replace(self, key: Hashable, value: V) -> None:
        """Put `value` in place of the present value of `key`."""
        with self._guard:
            self._values[key] = value

    def items(self) -> Iterator[tuple[Hashable, V]]:
        return iter(list(self._values.items()))

    def values(self) -> Iterator[V]:
        return iter(list(self._values.values()))

    def __len__(self) -> int:
        return len(self._values)

    def clear(self) -> None:
        with self._guard:
            self._values.clear()


class MakingLock:
    """`lock`: held while a process-wide value is made once; fresh in a forked child, where a thread
    of the parent that was making the value at fork() never finishes."""

    def __init__(self) -> None:
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        self.lock = threading.Lock()


def read_or_make(read: Callable[[], V | None], make: Callable[[], V],
                 lock: "contextlib.AbstractContextManager[object] | None" = None) -> tuple[V, bool]:
    """The value `read` finds, else the one `make` returns, made once across processes.

    `lock` (a store's key_lock) is held around a second `read` and `make`: the holder that came
    first usually wrote the value meanwhile, so the waiters read it instead of making it again.
    Returns (value, made).
    """
    value = read()
    if value is not None:
        return value, False
    with lock if lock is not None else contextlib.nullcontext():
        value = read()
        if value is not None:
            return value, False
        return make(), True
