"""Warmup's plan step: where plans can be built and kept (`plan_target`), and building a problem's
plans into the store through the engine's PlanBuilder protocol (`persist_plans`).

The plan key, the blob and load-or-build are plan_store's; the graphs are the engine's. Nothing
here names a platform: an engine that implements PlanBuilder (live cuDNN) builds plans, any other
(a snapshot) does not. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from fusedattn_select.config import AttnConfig
from fusedattn_select.plan_store.blob import unpack
from fusedattn_select.plan_store.persistence import LOADED, obtain, persists_plans
from fusedattn_select.probing.engine_protocol import PlanBuilder
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store.protocol import Store
from fusedattn_select.types import Backend, Fingerprint, Phase, ProbeDepth, Verdict


class PlanTarget(NamedTuple):
    """Where warmup builds plans: the persistent store, the fingerprint they are filed under, the engine."""

    store: Store
    fingerprint: Fingerprint
    builder: PlanBuilder


def plan_target(selector: Selector, depth: ProbeDepth) -> tuple[PlanTarget | None, str]:
    """(the PlanTarget to build plans for, "") or (None, why no plans are built)."""
    if not depth.answers(ProbeDepth.FULL):
        return None, "depth fast builds nothing"
    engine, fingerprint = selector.engine, selector.fingerprint
    if not isinstance(engine, PlanBuilder) or fingerprint.platform != "cuda":
        return None, "plans are built with the live cuDNN engine on a CUDA device (none here)"
    store = selector.store
    if store is None or not persists_plans(store):
        return None, "no persistent store to keep plans in (decisions are cached in memory only)"
    return PlanTarget(store, fingerprint, engine), ""


@dataclass(frozen=True)
class PersistResult:
    """What persist_plans did for one config: plans built now, plans already stored, and a note."""

    built: int = 0
    stored: int = 0
    note: str = ""
    failure: Verdict | None = None  # when a plan did not build (UNSUPPORTED or FAILED)


class _NotBuilt(Exception):
    """Carries the verdict of a plan that did not build out of obtain()."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason())
        self.verdict = verdict


def persist_plans(cfg: AttnConfig, backend: Backend, target: PlanTarget) -> PersistResult:
    """Build and store the plans attention() will run for `cfg`, unless stored.

    `cfg` is a config attention() runs (plan_store.calls.dispatch_config). Plans are built the way
    dispatch builds them (the engine's build_plan), once per plan key across threads and processes.
    """
    built = stored = 0
    for phase in cfg.phases:
        key = target.builder.plan_key(cfg, backend, phase)
        if isinstance(key, Verdict):
            return PersistResult(built, stored, f"{phase.value} plan did not build: {key.reason()}", key)

        def build(phase: Phase = phase, key: str = key) -> bytes:
            blob = target.builder.build_plan(cfg, backend, phase, key)
            if isinstance(blob, Verdict):
                raise _NotBuilt(blob)
            return blob

        try:
            _, origin = obtain(key, store=target.store, fingerprint=target.fingerprint, build=build,
                               serialize=lambda blob: blob, load=lambda blob, key=key: unpack(blob, key))
        except _NotBuilt as failed:
            verdict = failed.verdict
            return PersistResult(built, stored, f"{phase.value} plan did not build: {verdict.reason()}", verdict)
        if origin == LOADED:
            stored += 1
        else:
            built += 1
    return PersistResult(built, stored)
