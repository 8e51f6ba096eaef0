"""Warmup builds plans through the PlanBuilder protocol and plan_store, never through an engine's own
modules: an engine that implements PlanBuilder gets its plans built and stored once, one that does
not (a snapshot) gets none. The engine here is a TEST DOUBLE that answers from nothing and "builds"
blobs of fixed bytes; it proves the seam, not what cuDNN builds."""

from __future__ import annotations

import hashlib

import pytest

from fusedattn_select.config import AttnConfig
from fusedattn_select.plan_store import blob
from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine
from fusedattn_select.probing.engine_protocol import PlanBuilder
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.local_warmup import warmup
from fusedattn_select.selection.plan_warmup import plan_target
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store import PersistentStore
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, ProbeDepth, Provenance, Verdict

DENSE = AttnConfig(batch_size=2, num_heads_q=8, num_heads_kv=2, seqlen_q=128, seqlen_kv=128, head_dim_qk=64,
                   mask="causal")


class PlanBuilderForTests:
    """TEST DOUBLE of an engine that builds plans: every graph SUPPORTED; a plan is a blob of fixed bytes."""

    name = "plan-builder-test-engine"
    provenance = Provenance.LIVE_PROBE
    device = 0

    def __init__(self, refuse: Phase | None = None) -> None:
        self.refuse = refuse
        self.builds: list[tuple[str, Phase]] = []

    def fingerprint(self) -> Fingerprint:
        return Fingerprint("cuda", "PlanBuilderForTests", "9.0", 1, 91900, "1.32.0", "0", "test")

    def probe(self, cfg, backend, phase, depth):
        return Verdict(backend, phase, Outcome.SUPPORTED, "build_plans", depth=depth)

    def plan_key(self, cfg: AttnConfig, backend: Backend, phase: Phase) -> str:
        return hashlib.sha256(f"{cfg.cache_key()} {backend.value} {phase.value}".encode()).hexdigest()

    def build_plan(self, cfg, backend, phase, plan_key):
        if phase is self.refuse:
            return Verdict(backend, phase, Outcome.UNSUPPORTED, "build_plans", "refused (test double)",
                           depth=ProbeDepth.FULL)
        self.builds.append((cfg.cache_key(), phase))
        header = blob.PlanHeader(plan_key, "sdpa", 0, {"q": blob.TensorRecord(1, (1,), (1,), "HALF")})
        return blob.pack(header, b"graph bytes of PlanBuilderForTests")


@pytest.fixture
def store(tmp_path):
    directory = tmp_path / "plans"
    directory.mkdir(mode=0o700)
    return PersistentStore(directory)


def test_the_live_engine_is_a_plan_builder_and_a_snapshot_is_not():
    live = object.__new__(CudnnEngine)  # no device is started: only the protocol's members are checked
    live.device = 0
    assert isinstance(live, PlanBuilder)
    assert not isinstance(object.__new__(SnapshotEngine), PlanBuilder)
    assert isinstance(PlanBuilderForTests(), PlanBuilder)


def test_warmup_builds_each_plan_once_through_the_plan_builder(store):
    engine = PlanBuilderForTests()
    first = warmup([DENSE], selector=Selector(engine, store=store))
    assert first.totals["plans_built"] == len(DENSE.phases) and first.totals["plans_stored"] == 0
    assert {phase for _, phase in engine.builds} == set(DENSE.phases)
    again = PlanBuilderForTests()
    second = warmup([DENSE], selector=Selector(again, store=PersistentStore(store.directory)))
    assert second.totals["plans_stored"] == len(DENSE.phases) and again.builds == []


def test_a_plan_the_builder_refuses_flips_the_answer(store):
    engine = PlanBuilderForTests(refuse=Phase.BACKWARD)
    report = warmup([DENSE], selector=Selector(engine, store=store))
    assert report.rows[0].backend is Backend.NONE and "refused (test double)" in report.rows[0].reason


def test_plans_need_a_plan_builder_on_a_cuda_device(store):
    target, note = plan_target(Selector(PlanBuilderForTests(), store=store), ProbeDepth.FULL)
    assert target is not None and target.builder.device == 0 and note == ""
