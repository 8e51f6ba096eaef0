"""The probing-engine protocols: what every source of ground-truth verdicts implements, and what an
engine that also builds execution plans adds."""

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


@runtime_checkable
class PlanBuilder(ProbeEngine, Protocol):
    """A ProbeEngine that also builds, on its device, the execution plans attention() runs.

    Warmup and shared warmup find and build plans through this; the plan key's form, the blob
    format and persistence are plan_store's. An engine without it (a snapshot) has no plans.
    Both methods return a verdict (UNSUPPORTED or FAILED) instead of raising when the graph cannot
    be described or built.
    """

    device: int

    def plan_key(self, cfg: AttnConfig, backend: Backend, phase: Phase) -> str | Verdict:
        """The plan_store key attention() looks up for `phase` of `cfg` (a config it runs)."""
        ...

    def build_plan(self, cfg: AttnConfig, backend: Backend, phase: Phase, plan_key: str) -> bytes | Verdict:
        """The plan built as dispatch builds it (FULL, static), as a plan_store blob for `plan_key`."""
        ...
