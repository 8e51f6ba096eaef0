"""How far the calling thread may go to answer a question now: anything (the default), only what
memory and the persistent store hold (no probe, no build), or only what memory holds.

attention() decides a new call signature under `only(MEMORY)` first: a call whose selections and
plans this process already holds runs on them at once; anything more raises NotReady, and the call
runs on torch while the rest is obtained off its path (runtime/tiers.py). Torch-free (core): the
selector and the plan cache both check it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

MEMORY = "memory"   # what this process holds in memory
STORED = "stored"   # and what the persistent store holds (reads and plan loads, no probe or build)


class NotReady(Exception):
    """What a limited decision would have to probe, build or read to go on."""


_local = threading.local()


def limit() -> str | None:
    """The calling thread's limit: None (anything), STORED or MEMORY."""
    return getattr(_local, "limit", None)


@contextlib.contextmanager
def only(level: str) -> Iterator[None]:
    """Limit the calling thread to `level` (MEMORY or STORED) inside the block."""
    previous = limit()
    _local.limit = level
    try:
        yield
    finally:
        _local.limit = previous


def require(what: str, needs: str | None) -> None:
    """Raise NotReady naming `what` when the thread's limit forbids work that needs `needs`: STORED
    (a store read or plan load: forbidden under MEMORY) or None (a probe or build: forbidden under
    either limit)."""
    current = limit()
    if current is None or current == needs:
        return
    raise NotReady(what)
