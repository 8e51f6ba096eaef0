"""Calling one function from several threads at the same moment (shared by CPU and GPU tests).

Importable because pytest puts tests/ (the folder of the root conftest.py) on sys.path.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def call_at_once(fn: Callable[[], T], threads: int) -> list[T]:
    """`fn`'s results from `threads` threads released together by one barrier, in finishing order.

    An exception in any thread is raised here once all have finished (the first one raised).
    """
    barrier = threading.Barrier(threads)
    lock = threading.Lock()
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        barrier.wait()
        try:
            value = fn()
        except BaseException as err:  # noqa: BLE001 -- handed to the caller below
            with lock:
                errors.append(err)
            return
        with lock:
            results.append(value)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return results
