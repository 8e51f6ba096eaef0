"""Alternatives from recorded answers and for known silent-corruption refusals: a recorded neighbour
is offered only where it computes the same result (dtypes, memory order, switches); a padded head dim
is looked up at the recording's default scale and offered at the original scale; a refusal by a
known-bug rule lists one on the same backend only with a note saying so."""

from __future__ import annotations

import math

import pytest

from fusedattn_select import AttnConfig, Backend
from fusedattn_select.probing.nearest import RecordedProblem
from fusedattn_select.selection import alternatives
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Fingerprint, Outcome, Phase, Provenance, Verdict


def asked(**changes) -> AttnConfig:
    base = dict(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=512, seqlen_kv=512, head_dim_qk=128,
                mask="causal", is_training=False, deterministic=False)
    return AttnConfig(**{**base, **changes})


def recorded(name: str, cfg: AttnConfig, supported: bool = True) -> RecordedProblem:
    outcome = Outcome.SUPPORTED if supported else Outcome.UNSUPPORTED
    verdicts = tuple(Verdict(cfg.candidate, phase, outcome, "check_support", "" if supported else "no",
                             provenance=Provenance.SNAPSHOT) for phase in cfg.phases)
    return RecordedProblem(name=name, suite="suite", file_name="test.json", config=cfg, verdicts=verdicts)


class RecordedTestEngine:
    """TEST DOUBLE of a snapshot: answers the recorded problems, no data for any other."""

    name = "snapshot:test.json"
    provenance = Provenance.SNAPSHOT

    def __init__(self, problems: list[RecordedProblem]) -> None:
        self.recorded = tuple(problems)
        self._by_key = {p.config.cache_key(): p for p in problems}
        self.calls = 0

    def fingerprint(self) -> Fingerprint:
        return Fingerprint("snapshot", "Test GPU H100", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")

    def probe(self, cfg, backend, phase, depth) -> Verdict:
        self.calls += 1
        problem = self._by_key.get(cfg.cache_key())
        if problem is None:
            return Verdict(backend, phase, Outcome.NO_DATA, "snapshot", "not recorded", provenance=Provenance.SNAPSHOT)
        return next(v for v in problem.verdicts if v.phase is phase)


def _search(problems: list[RecordedProblem], cfg: AttnConfig, **options):
    selector = Selector(RecordedTestEngine(problems))
    selection = selector.select(cfg)
    assert selection.backend is Backend.NONE and not selection.no_data
    return alternatives.find(selector, selection, max_probes=64, **options)


CHANGES_THE_RESULT = {
    "mask": dict(mask="causal_bottom_right", seqlen_kv=1024),  # with seqlen_kv too: another diagonal
    "window": dict(window_size=(128, 0)),
    "softmax": dict(softmax="off_by_one"),
    "max logit": dict(return_max_logit=True),
    "shorter keys": dict(seqlen_kv=256),
    "training": dict(is_training=True),
    "head dim": dict(head_dim_qk=192),
    "dropout": dict(dropout=0.1),
}


@pytest.mark.parametrize("what", sorted(CHANGES_THE_RESULT))
def test_a_recorded_neighbour_that_changes_the_result_is_not_offered(what):
    refused = asked(qkv_dtype="fp16")
    problems = [recorded("refused", refused, supported=False),
                recorded("neighbour", refused.replace(**CHANGES_THE_RESULT[what]))]
    search = _search(problems, refused)
    assert all(not a.kind.startswith("recorded problem") for a in search.alternatives), what


def test_a_recorded_neighbour_in_another_dtype_and_layout_is_offered():
    refused = asked(qkv_dtype="fp16")
    neighbour = refused.replace(qkv_layout="sbhd_sbhd_sbhd", deterministic=True)
    search = _search([recorded("refused", refused, supported=False), recorded("neighbour", neighbour)], refused)
    (alternative,) = search.alternatives
    assert alternative.kind == "recorded problem suite/neighbour" and alternative.config == neighbour


def test_a_recorded_neighbour_shows_the_fields_that_follow_a_changed_one():
    refused = asked(qkv_dtype="fp8_e4m3", scaling_mode="current")
    neighbour = refused.replace(scaling_mode="delayed")
    search = _search([recorded("refused", refused, supported=False), recorded("neighbour", neighbour)], refused)
    (alternative,) = [a for a in search.alternatives if a.kind.startswith("recorded problem")]
    assert {(c.field, c.asked, c.instead) for c in alternative.changes} == {
        ("scaling_mode", "current", "delayed"), ("o_dtype", "bf16", "fp8_e4m3")}


def test_a_padded_head_dim_is_looked_up_at_the_recorded_scale_and_offered_at_the_original():
    refused = asked(head_dim_qk=88)
    padded = refused.replace(head_dim_qk=96)  # recorded at its default scale, 1/sqrt(96)
    search = _search([recorded("refused", refused, supported=False), recorded("padded", padded)], refused)
    (alternative,) = search.alternatives
    assert alternative.kind == "pad head dim" and alternative.answered_by == padded
    assert alternative.config.resolved_attn_scale == pytest.approx(1 / math.sqrt(88))
    assert "default scale 1/sqrt(96)" in alternative.note
    assert alternative.to_dict()["answered_by"] == padded.to_dict()


class BlackwellYesTestEngine:
    """TEST DOUBLE of a B200 at cuDNN 9.19 that supports every graph (rules refuse before it is asked)."""

    name = "blackwell-yes-test-engine"
    provenance = Provenance.LIVE_PROBE

    def __init__(self, frontend: str = "1.32.0") -> None:
        self._frontend = frontend

    def fingerprint(self) -> Fingerprint:
        return Fingerprint("cuda", "NVIDIA B200", "10.0", 148, 91900, self._frontend, "580.00", "0.1.0")

    def probe(self, cfg, backend, phase, depth) -> Verdict:
        return Verdict(backend, phase, Outcome.SUPPORTED, "check_support", depth=depth)


def test_a_known_corruption_refusal_gets_no_alternative_on_the_same_kernels():
    """A BHSD decode step would otherwise be offered as 'another layout' (its heads-as-batch graphs run
    the same F16 kernels) or as fp16, deterministic off, ...: none is covered by the report."""
    decode = AttnConfig(batch_size=8, num_heads_q=32, num_heads_kv=8, seqlen_q=1, seqlen_kv=4096, head_dim_qk=128,
                        is_training=False, dropout=0.0, mask="no_mask")
    selector = Selector(BlackwellYesTestEngine())
    selection = selector.select(decode)
    assert selection.backend is Backend.NONE and "blackwell-decode" in selection.message
    search = alternatives.find(selector, selection, max_probes=64)
    assert search.alternatives == ()


def test_a_same_backend_alternative_to_a_known_bug_refusal_says_so():
    engine = BlackwellYesTestEngine()
    engine.fingerprint = lambda: Fingerprint("cuda", "NVIDIA H100", "9.0", 132, 91500, "1.32.0", "580.00", "0.1.0")
    graphed = asked(is_training=True, cuda_graph=True, seqlen_q=1000, seqlen_kv=1000, mask="causal")
    selector = Selector(engine)
    selection = selector.select(graphed)
    assert selection.backend is Backend.NONE and "cuda-graph-training" in selection.message
    search = alternatives.find(selector, selection, max_probes=64)
    eager = next(a for a in search.alternatives if a.kind == "no CUDA-graph capture")
    assert "known-bug rule cudnn-le-9.15.0-cuda-graph-training" in eager.note and "verify" in eager.note


def test_a_known_corruption_refusal_may_get_another_backend():
    fp8 = AttnConfig(batch_size=2, num_heads_q=32, num_heads_kv=2, seqlen_q=4096, seqlen_kv=4096, head_dim_qk=256,
                     qkv_dtype="fp8_e4m3", mask="causal", is_training=False)
    selector = Selector(BlackwellYesTestEngine("1.29.0.dev5"))
    selection = selector.select(fp8)
    assert selection.backend is Backend.NONE and "fp8-d256" in selection.message
    search = alternatives.find(selector, selection, max_probes=64)
    assert [a.kind for a in search.alternatives] == ["bf16 instead of FP8"]
    assert "known-bug" not in search.alternatives[0].note  # other kernels: nothing to say
    assert all(v.backend is Backend.F16 and v.phase is Phase.FORWARD for v in search.alternatives[0].verdicts)
