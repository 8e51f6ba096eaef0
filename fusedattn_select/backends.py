"""The backend registry: one priority list of the backends select() can answer with.

Each entry declares its backend, the qkv dtypes and phases it answers, and its probe. A problem's
candidate is the first entry, in priority order, that answers its qkv_dtype and every phase it
runs; that entry's probe (or, where it declares none, the selector's engine) decides the verdict.
What runs a selected backend is the runtime's table (runtime/entries.BACKEND_RUNNERS). To add a
backend, see README "Add a backend". Torch-free; core (imports no higher layer).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from fusedattn_select.dtypes import F16_DTYPES, FP8_DTYPES
from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.types import Backend, Phase, ProbeDepth, Verdict

# probe(engine, cfg, backend, phase, depth) -> Verdict; `engine` is the selector's ProbeEngine.
Probe = Callable[[Any, Any, Backend, Phase, ProbeDepth], Verdict]


@dataclass(frozen=True)
class BackendEntry:
    """One backend of the priority list: what it answers, and how its verdicts are found (`probe`;
    None: the selector's engine probes it, as it does F16 and FP8)."""

    backend: Backend
    dtypes: tuple[str, ...]
    phases: tuple[Phase, ...] = (Phase.FORWARD, Phase.BACKWARD)
    probe: Probe | None = None

    def answers(self, qkv_dtype: str, phases: tuple[Phase, ...]) -> bool:
        return qkv_dtype in self.dtypes and all(p in self.phases for p in phases)


F16 = BackendEntry(Backend.F16, F16_DTYPES)
FP8 = BackendEntry(Backend.FP8, FP8_DTYPES)

class Registry:
    """The priority list and its lock: one object owns the registry's state."""

    def __init__(self, entries: tuple[BackendEntry, ...]) -> None:
        self._renew_locks()
        renew_locks_after_fork(self)
        # Replaced whole on each change: readers take it without the lock.
        self.entries = entries

    def _renew_locks(self) -> None:
        self._lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there

    def candidate(self, qkv_dtype: str, phases: tuple[Phase, ...]) -> BackendEntry | None:
        for entry in self.entries:
            if entry.answers(qkv_dtype, phases):
                return entry
        return None

    def register(self, entry: BackendEntry, before: Backend | None) -> None:
        with self._lock:
            entries = [e for e in self.entries if e.backend is not entry.backend]
            at = next((i for i, e in enumerate(entries) if e.backend is before), len(entries))
            self.entries = (*entries[:at], entry, *entries[at:])

    def unregister(self, backend: Backend) -> None:
        with self._lock:
            self.entries = tuple(e for e in self.entries if e.backend is not backend)


registry = Registry((F16, FP8))


def priority() -> tuple[BackendEntry, ...]:
    """The registered backends, first asked first."""
    return registry.entries


def candidate(qkv_dtype: str, phases: tuple[Phase, ...]) -> BackendEntry | None:
    """The first registered backend that answers `qkv_dtype` in every one of `phases`; None if none does."""
    return registry.candidate(qkv_dtype, phases)


def register(entry: BackendEntry, *, before: Backend | None = None) -> BackendEntry:
    """Add `entry` to the priority list, ahead of `before` (None: last), replacing any entry of its
    backend. Decisions a selector cached before are kept: register before selecting."""
    registry.register(entry, before)
    return entry


def unregister(backend: Backend) -> None:
    """Remove `backend`'s entry from the priority list (nothing when it has none)."""
    registry.unregister(backend)
