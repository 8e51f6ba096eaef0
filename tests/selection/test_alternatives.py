"""Alternatives through a live engine (scripted test doubles): candidates are probed through the
selector that answered; the engine calls they make are counted and capped; every alternative is a
problem attention() can run with the result asked for; the answer for the problem asked never changes."""

from __future__ import annotations

import json
import math
import pickle

import pytest

from fusedattn_select import AttnConfig, Backend, select
from fusedattn_select.errors import ConfigError
from fusedattn_select.result import Alternative, Change
from fusedattn_select.selection import alternatives
from fusedattn_select.selection import selector as selector_module
from fusedattn_select.selection.selector import Selector, set_default_selector, use_snapshots
from fusedattn_select.types import Fingerprint, Outcome, Phase, Provenance, Verdict


class RuleBookTestEngine:
    """TEST DOUBLE of a live device: refuses head dims that are not multiples of 16, the backward
    of deterministic problems and bf16 at head dim 96; supports the rest. Counts its probes."""

    name = "rule-book-test-engine"
    provenance = Provenance.LIVE_PROBE

    def __init__(self) -> None:
        self.calls = 0

    def fingerprint(self) -> Fingerprint:
        return Fingerprint("test-double", "Test GPU H100", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")

    def probe(self, cfg, backend, phase, depth) -> Verdict:
        self.calls += 1
        if cfg.head_dim_qk % 16 or cfg.resolved_head_dim_v % 16 or (cfg.qkv_dtype == "bf16" and cfg.head_dim_qk == 96):
            return Verdict(backend, phase, Outcome.UNSUPPORTED, "check_support", "head dim", depth=depth)
        if cfg.deterministic and phase is Phase.BACKWARD:
            return Verdict(backend, phase, Outcome.UNSUPPORTED, "check_support", "deterministic", depth=depth)
        return Verdict(backend, phase, Outcome.SUPPORTED, "check_support", depth=depth)


class RefusingTestEngine(RuleBookTestEngine):
    """TEST DOUBLE of a live device that refuses every graph."""

    def probe(self, cfg, backend, phase, depth) -> Verdict:
        self.calls += 1
        return Verdict(backend, phase, Outcome.UNSUPPORTED, "check_support", "no", depth=depth)


def problem(**changes) -> AttnConfig:
    base = dict(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=512, seqlen_kv=512, head_dim_qk=88,
                mask="causal", qkv_layout="bshd_bshd_bshd", cuda_graph=True)
    return AttnConfig(**{**base, **changes})


def _search(cfg: AttnConfig, engine=None, **options):
    engine = engine or RuleBookTestEngine()
    selector = Selector(engine)
    selection = selector.select(cfg, options.get("probe_depth", "fast"))
    before = engine.calls
    return selection, alternatives.find(selector, selection, **options), engine.calls - before


def _flops(qk, v, pq, pv, training):
    forward = ((pq + pv) / (qk + v) - 1) * 100
    backward = ((3 * pq + 2 * pv) / (3 * qk + 2 * v) - 1) * 100
    return forward, backward if training else None


# ----- padded head dims -----------------------------------------------------------------------------
def test_a_padded_head_dim_keeps_the_original_scale_and_shows_every_changed_field():
    selection, search, probed = _search(problem())
    assert selection.backend is Backend.NONE
    (alternative,) = [a for a in search.alternatives if a.kind == "pad head dim"]
    # 96 was asked first and refused (the double refuses bf16 at 96): 128 is the next size tried.
    assert [(c.field, c.asked, c.instead) for c in alternative.changes] == [("head_dim_qk", 88, 128),
                                                                           ("head_dim_v", 88, 128)]
    assert alternative.config.resolved_attn_scale == pytest.approx(1 / math.sqrt(88))  # pad + slice == original
    assert "1/sqrt(88)" in alternative.note
    forward, backward = _flops(88, 88, 128, 128, True)
    assert dict(alternative.extra_flops_percent) == {Phase.FORWARD: pytest.approx(forward),
                                                     Phase.BACKWARD: pytest.approx(backward)}
    assert {v.provenance for v in alternative.verdicts} == {Provenance.LIVE_PROBE} and probed > 0


def test_with_two_head_dims_only_the_one_that_needs_it_is_padded():
    _, search, _ = _search(problem(head_dim_qk=88, head_dim_v=128, cuda_graph=False))
    alternative = next(a for a in search.alternatives if a.kind == "pad head dim")
    assert [(c.field, c.asked, c.instead) for c in alternative.changes] == [("head_dim_qk", 88, 128)]
    assert alternative.note.startswith("zero-pad Q and K,")
    forward, backward = _flops(88, 128, 128, 128, True)
    assert dict(alternative.extra_flops_percent) == {Phase.FORWARD: pytest.approx(forward),
                                                     Phase.BACKWARD: pytest.approx(backward)}


def test_paddings_are_asked_cheapest_first():
    cfg = problem(head_dim_qk=88, head_dim_v=128, is_training=False)
    selection = Selector(RuleBookTestEngine()).select(cfg)
    padded = [c for c in alternatives.candidates(cfg, selection, Selector(RuleBookTestEngine()))
              if c.kind == "pad head dim"]
    costs = [c.config.head_dim_qk + c.config.resolved_head_dim_v for c in padded]
    assert costs == sorted(costs) and len(padded) == alternatives.PAD_TRIES
    assert [(c.config.head_dim_qk, c.config.resolved_head_dim_v) for c in padded] == [(96, 128), (128, 128), (88, 192)]


def test_an_inference_padding_costs_forward_flops_only():
    _, search, _ = _search(problem(is_training=False))
    alternative = next(a for a in search.alternatives if a.kind == "pad head dim")
    assert [phase for phase, _ in alternative.extra_flops_percent] == [Phase.FORWARD]
    assert "forward attention FLOPs" in alternative.describe()


# ----- what is offered ------------------------------------------------------------------------------
def test_alternatives_come_cheapest_change_first_and_at_most_the_limit():
    _, search, _ = _search(problem(head_dim_qk=96), limit=3)
    assert [a.kind for a in search.alternatives] == ["pad head dim", "fp16 instead of bf16"]
    _, search, _ = _search(problem(head_dim_qk=96), limit=1)
    assert [a.kind for a in search.alternatives] == ["pad head dim"]


def test_deterministic_off_and_inference_are_offered_for_a_refused_backward():
    _, search, _ = _search(problem(head_dim_qk=128, deterministic=True, cuda_graph=False))
    kinds = [a.kind for a in search.alternatives]
    assert kinds[0] == "deterministic off"
    assert all(a.backend is Backend.F16 for a in search.alternatives)


@pytest.mark.parametrize("mask, seqlen_kv, offered", [
    ("causal", 512, True), ("causal_bottom_right", 512, True), ("causal", 1024, False),
    ("padding_causal", 512, False), ("padding_causal_bottom_right", 512, False),
])
def test_the_other_causal_diagonal_is_offered_only_where_it_gives_the_same_result(mask, seqlen_kv, offered):
    cfg = problem(mask=mask, seqlen_kv=seqlen_kv)
    selection = Selector(RefusingTestEngine()).select(cfg)
    kinds = [c.kind for c in alternatives.candidates(cfg, selection, Selector(RefusingTestEngine()))]
    assert ("another mask form" in kinds) is offered


def test_an_fp8_forward_with_a_bf16_backward_is_never_offered():
    """attention() cannot run it: it selects the whole FP8 training problem or none."""
    cfg = problem(head_dim_qk=128, qkv_dtype="fp8_e4m3", cuda_graph=False, deterministic=True)
    selection = Selector(RuleBookTestEngine()).select(cfg)
    assert {v.phase for v in selection.verdicts if not v.supported} == {Phase.BACKWARD}
    candidates = list(alternatives.candidates(cfg, selection, Selector(RuleBookTestEngine())))
    assert all("backward" not in c.kind for c in candidates)
    assert all(c.config.is_training or c.kind == "inference instead of training" for c in candidates)


def test_an_alternative_that_only_adds_changes_to_one_found_is_dropped():
    def alternative(kind, *changes):
        return Alternative(kind, tuple(Change(f, a, b) for f, a, b in changes), Backend.F16, problem(), ())
    small = alternative("one", ("o_dtype", "bf16", "fp8_e4m3"))
    larger = alternative("two", ("o_dtype", "bf16", "fp8_e4m3"), ("scaling_mode", "current", "delayed"))
    other = alternative("three", ("qkv_dtype", "fp8_e4m3", "bf16"))
    assert alternatives._without_supersets([small], larger) == [small]
    assert alternatives._without_supersets([larger, other], small) == [other, small]


# ----- counted and capped in engine calls -----------------------------------------------------------
def test_probes_count_engine_calls_and_answers_already_given_cost_none():
    """Training, deterministic, dropout, depth full, every graph refused: each candidate may probe its
    bucket form and then its dense graphs, forward and backward."""
    cfg = problem(head_dim_qk=72, deterministic=True, dropout=0.1, cuda_graph=False)
    engine = RefusingTestEngine()
    selector = Selector(engine)
    selection = selector.select(cfg, "full")
    before = engine.calls
    first = alternatives.find(selector, selection, max_probes=64)
    assert first.probes == engine.calls - before > first.candidates > 0
    again = alternatives.find(selector, selection, max_probes=64)
    assert (again.probes, again.candidates) == (0, first.candidates) and engine.calls - before == first.probes


@pytest.mark.parametrize("cap", [0, 1, 3, 4, 7])
def test_the_cap_bounds_the_engine_calls(cap):
    engine = RefusingTestEngine()
    _, search, probed = _search(problem(head_dim_qk=72, deterministic=True, dropout=0.1), engine, max_probes=cap)
    assert probed == search.probes <= cap and search.max_probes == cap and search.capped
    if cap == 0:
        assert search.candidates == 0


def test_a_candidate_that_does_not_fit_the_cap_does_not_stop_cheaper_ones_after_it():
    # Training candidates may probe 4 graphs (bucket and dense, two passes); the inference one 2.
    _, search, probed = _search(problem(head_dim_qk=128, deterministic=True, cuda_graph=False), max_probes=3)
    assert [a.kind for a in search.alternatives] == ["inference instead of training"]
    assert search.capped and probed == search.probes <= 3


def test_a_selected_answer_has_no_alternatives_and_costs_nothing():
    selection, search, probed = _search(problem(head_dim_qk=128))
    assert selection.selected and search.alternatives == () and search.probes == search.candidates == probed == 0


def test_an_alternative_answered_from_the_cache_keeps_its_live_provenance_visible():
    engine = RuleBookTestEngine()
    selector = Selector(engine)
    selection = selector.select(problem())
    first = alternatives.find(selector, selection).alternatives[0]
    again = alternatives.find(selector, selection).alternatives[0]
    assert not first.from_cache and first.provenance == (Provenance.LIVE_PROBE,)
    assert again.from_cache and {v.provenance for v in again.verdicts} == {Provenance.MEMORY_CACHE}
    assert again.provenance == (Provenance.LIVE_PROBE,) and "live_probe, cached" in again.describe()
    assert again.to_dict()["provenance"] == ["live_probe"] and again.to_dict()["from_cache"] is True


@pytest.mark.parametrize("name, value", [("limit", -1), ("max_probes", "8"), ("max_probes", True)])
def test_bad_limits_name_the_field(name, value):
    engine = RuleBookTestEngine()
    selector = Selector(engine)
    with pytest.raises(ConfigError, match=name):
        alternatives.find(selector, selector.select(problem()), **{name: value})


# ----- select(alternatives=True) --------------------------------------------------------------------
def test_select_with_alternatives_leaves_the_answer_equal_and_serialisable():
    set_default_selector(Selector(RuleBookTestEngine()))
    plain = select(problem())
    asked = select(problem(), alternatives=True)
    assert plain.alternatives == () and plain.alternative_probes == 0
    assert asked.alternatives and asked.alternative_probes > 0
    again = select(problem())
    assert again.alternatives == ()  # not kept in the decision cache
    assert select(problem(), alternatives=True) == again  # equal with or without alternatives
    assert (asked.backend, asked.message, asked.reasons) == (Backend.NONE, plain.message, plain.reasons)
    document = json.loads(json.dumps(asked.to_dict()))
    assert document["alternatives"][0]["kind"] == asked.alternatives[0].kind
    assert pickle.loads(pickle.dumps(asked)).alternatives == asked.alternatives


def test_select_with_alternatives_reads_the_process_selector_once(monkeypatch):
    made = Selector(RuleBookTestEngine())
    reads = []
    monkeypatch.setattr(selector_module, "default_selector", lambda: reads.append(1) or made)
    assert select(problem(), alternatives=True).alternatives and len(reads) == 1


def test_select_says_alternatives_cost_probes():
    assert "probes" in select.__doc__ and "cap" in select.__doc__


def test_select_with_alternatives_from_the_bundled_snapshot():
    use_snapshots(target="h100")
    # FP8 training with current scaling and a 16-bit output: Hopper builds no such forward; the FP8
    # output form of the hopper suite is recorded as built and verified.
    cfg = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=16, seqlen_q=512, seqlen_kv=512, head_dim_qk=128,
                     qkv_dtype="fp8_e4m3", mask="causal", scaling_mode="current")
    selection = select(cfg, "full", alternatives=True)
    assert selection.backend is Backend.NONE
    assert any(a.kind == "FP8 output" and a.backend is Backend.FP8 for a in selection.alternatives)
