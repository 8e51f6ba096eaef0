"""Thread locks renewed in a forked child: a lock another thread of the parent held at fork() stays held
in the child for ever (the thread that would release it does not exist there). DataLoader workers,
pre-fork servers and multiprocessing's fork start method make such children."""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class RenewsLocks(Protocol):
    def _renew_locks(self) -> None: ...


# Objects whose thread locks a forked child renews: a lock that another thread of the parent held at
# fork() stays held in the child for ever (the thread that would release it does not exist there),
# so a child that used the store, the selector or the runtime after a background thread of its parent
# did would wait for good.
_RENEWED_AFTER_FORK: "weakref.WeakSet[RenewsLocks]" = weakref.WeakSet()


def renew_locks_after_fork(owner: RenewsLocks) -> None:
    """Have a forked child call owner._renew_locks() (replace its thread locks with fresh ones) first."""
    _RENEWED_AFTER_FORK.add(owner)


def _renew_in_child() -> None:
    for owner in list(_RENEWED_AFTER_FORK):
        owner._renew_locks()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_in_child)
