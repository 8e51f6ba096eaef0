"""Alternatives through a live engine (a scripted test double): candidates are probed through the
selector that answered, counted and capped; the answer for the problem asked never changes."""

from __future__ import annotations

import json
import pickle

import pytest

from fusedattn_select import AttnConfig, Backend, select
from fusedattn_select.errors import ConfigError
from fusedattn_select.selection import alternatives
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
        if cfg.head_dim_qk % 16 or (cfg.qkv_dtype == "bf16" and cfg.head_dim_qk == 96):
            return Verdict(backend, phase, Outcome.UNSUPPORTED, "check_support", "head dim", depth=depth)
        if cfg.deterministic and phase is Phase.BACKWARD:
            return Verdict(backend, phase, Outcome.UNSUPPORTED, "check_support", "deterministic", depth=depth)
        return Verdict(backend, phase, Outcome.SUPPORTED, "check_support", depth=depth)


def problem(**changes) -> AttnConfig:
    base = dict(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=512, seqlen_kv=512, head_dim_qk=88,
                mask="causal", qkv_layout="bshd_bshd_bshd", cuda_graph=True)
    return AttnConfig(**{**base, **changes})


def _search(cfg: AttnConfig, **options):
    engine = RuleBookTestEngine()
    selector = Selector(engine)
    selection = selector.select(cfg)
    before = engine.calls
    return selection, alternatives.find(selector, selection, **options), engine.calls - before


def test_a_padded_head_dim_is_found_by_probing_and_says_what_it_costs():
    selection, search, probed = _search(problem())
    assert selection.backend is Backend.NONE
    (alternative,) = [a for a in search.alternatives if a.kind == "pad head dim"]
    # 96 was asked first and refused (the double refuses bf16 at 96): 128 is the next size tried.
    assert [(c.field, c.asked, c.instead) for c in alternative.changes] == [("head_dim_qk", 88, 128)]
    assert alternative.configs[0].head_dim_qk == 128 and alternative.backend is Backend.F16
    assert alternative.extra_flops_percent == pytest.approx((128 * 2 / (88 * 2) - 1) * 100)
    assert {v.provenance for v in alternative.verdicts} == {Provenance.LIVE_PROBE}
    assert probed > 0 and search.probes <= alternatives.DEFAULT_MAX_PROBES


def test_alternatives_come_cheapest_change_first_and_at_most_the_limit():
    _, search, _ = _search(problem(head_dim_qk=96), limit=3)
    assert [a.kind for a in search.alternatives] == ["pad head dim", "fp16 instead of bf16"]
    _, search, _ = _search(problem(head_dim_qk=96), limit=1)
    assert [a.kind for a in search.alternatives] == ["pad head dim"]


def test_the_probe_cap_bounds_what_is_asked():
    for cap in (0, 1, 3):
        _, search, probed = _search(problem(), max_probes=cap)
        assert search.probes <= cap and search.max_probes == cap
        assert probed <= 2 * cap  # one candidate problem: its forward and backward graphs
    _, search, _ = _search(problem(), max_probes=1)
    assert search.capped


def test_deterministic_off_and_inference_are_offered_for_a_refused_backward():
    _, search, _ = _search(problem(head_dim_qk=128, deterministic=True, cuda_graph=False))
    kinds = [a.kind for a in search.alternatives]
    assert kinds[0] == "deterministic off"
    assert all(a.backend is Backend.F16 for a in search.alternatives)


def test_a_selected_answer_has_no_alternatives_and_costs_nothing():
    selection, search, probed = _search(problem(head_dim_qk=128))
    assert selection.selected and search.alternatives == () and search.probes == 0 and probed == 0


@pytest.mark.parametrize("name, value", [("limit", -1), ("max_probes", "8"), ("max_probes", True)])
def test_bad_limits_name_the_field(name, value):
    engine = RuleBookTestEngine()
    selector = Selector(engine)
    with pytest.raises(ConfigError, match=name):
        alternatives.find(selector, selector.select(problem()), **{name: value})


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


def test_select_with_alternatives_from_the_bundled_snapshot():
    use_snapshots(target="h100")
    cfg = AttnConfig(batch_size=2, num_heads_q=32, num_heads_kv=8, seqlen_q=8192, seqlen_kv=8192, head_dim_qk=128,
                     qkv_dtype="fp8_e4m3", mask="causal", scaling_mode="current")
    selection = select(cfg, "full", alternatives=True)
    assert selection.backend is Backend.NONE
    assert any(a.kind == "FP8 output" and a.backend is Backend.FP8 for a in selection.alternatives)
