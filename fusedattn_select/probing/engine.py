"""The probing-engine protocol: what every source of ground-truth verdicts implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from fusedattn_select.config import AttnConfig
from fusedattn_select.types import Backend, Fingerprint, Phase, ProbeDepth, Provenance, Verdict


@runtime_checkable
class ProbeEngine(Protocol):
    """A source of ground-truth verdicts for one platform (live cuDNN, a recorded snapshot, ...).

    `probe` answers one backend and one phase of one problem. It returns an UNSUPPORTED verdict
    (with the stage and the engine's own message) when the platform rejects the problem, and a
    FAILED verdict for incidents (out of memory, driver errors); it never raises for either.
    """

    name: str
    provenance: Provenance

    def fingerprint(self) -> Fingerprint: ...

    def probe(self, cfg: AttnConfig, backend: Backend, phase: Phase, depth: ProbeDepth) -> Verdict: ...
