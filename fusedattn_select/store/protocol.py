"""The store contract: what selection, warmup and dispatch may ask of a decision and plan store.

Entries belong to a fingerprint: `get` and `get_plan` only return rows written under
`fingerprint.key()`. `put` raises ValueError for FAILED verdicts (incidents are never cached) and
never replaces a FULL entry with a FAST one; otherwise a store never raises into selection: a
locked, full or damaged database is a miss (or a skipped write) with a warning.

`key_lock` is the cross-process half of single flight: the code that probes or builds on a miss
takes it, re-reads the store (another process may have written the entry meanwhile), and writes
inside the lock. It yields False when it had to go on without exclusivity (after `timeout`): a
hung probe elsewhere costs a duplicate probe, never a deadlock.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterable, Protocol, runtime_checkable

from fusedattn_select.types import Fingerprint, ProbeDepth, Verdict

KEY_LOCK_TIMEOUT_S = 120.0

Entry = tuple[tuple[Verdict, ...], ProbeDepth]


@runtime_checkable
class Store(Protocol):
    """A store of verdicts and serialized execution plans, keyed by fingerprint and key.

    `persistent` says whether entries outlive the process; `plans_enabled` whether serialized
    plans are kept (a persistent store refuses them in a directory others can write).
    """

    kind: str
    path: Path | None
    persistent: bool
    plans_enabled: bool

    def get(self, fingerprint: Fingerprint, key: str) -> Entry | None: ...

    def put(self, fingerprint: Fingerprint, key: str, verdicts: Iterable[Verdict], depth: ProbeDepth) -> bool: ...

    def get_plan(self, fingerprint: Fingerprint, plan_key: str) -> bytes | None: ...

    def put_plan(self, fingerprint: Fingerprint, plan_key: str, blob: bytes) -> bool: ...

    def key_lock(self, fingerprint: Fingerprint, key: str,
                 timeout: float = KEY_LOCK_TIMEOUT_S) -> contextlib.AbstractContextManager[bool]: ...

    def info(self) -> dict[str, object]: ...

    def clear(self) -> None: ...

    def export(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> dict: ...

    def import_(self, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> object: ...
