"""Known silent-corruption bugs are rules: where "it builds" is known to compute the wrong answer,
select() answers NONE with the rule's reason and links at depth fast, without asking the engine;
outside the versions, devices and conditions the reports name, the engine answers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fusedattn_select import AttnConfig, Backend
from fusedattn_select.selection import rules
from fusedattn_select.selection.rules import frontend_version_key, rules_by_name
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Fingerprint, Outcome, Phase, Provenance, Verdict

ROOT = Path(__file__).resolve().parents[2]
DECODE_RULE = "cudnn-9.19-9.25.0-blackwell-decode"
FP8_D256_RULE = "cudnn-frontend-1.29-dev-fp8-d256-masked"


class YesTestEngine:
    """TEST DOUBLE of a device that says "supported" to every graph and counts the questions."""

    name = "yes-test-engine"
    provenance = Provenance.LIVE_PROBE

    def __init__(self, fingerprint: Fingerprint) -> None:
        self._fingerprint = fingerprint
        self.calls = 0

    def fingerprint(self) -> Fingerprint:
        return self._fingerprint

    def probe(self, cfg, backend, phase, depth) -> Verdict:
        self.calls += 1
        return Verdict(backend, phase, Outcome.SUPPORTED, "check_support", depth=depth)


def blackwell(cudnn: int = 91900, cc: str = "10.0", frontend: str = "1.32.0") -> Fingerprint:
    return Fingerprint("cuda", "NVIDIA B200", cc, 148, cudnn, frontend, "580.00", "0.1.0")


def decode_step(**changes) -> AttnConfig:
    base = dict(batch_size=8, num_heads_q=32, num_heads_kv=8, seqlen_q=1, seqlen_kv=4096, head_dim_qk=128,
                qkv_layout="bshd_bshd_bshd", is_training=False)
    return AttnConfig(**{**base, **changes})


def fp8_d256(**changes) -> AttnConfig:
    base = dict(batch_size=2, num_heads_q=32, num_heads_kv=2, seqlen_q=4096, seqlen_kv=4096, head_dim_qk=256,
                qkv_dtype="fp8_e4m3", mask="causal", is_training=False)
    return AttnConfig(**{**base, **changes})


def _answer(fingerprint: Fingerprint, cfg: AttnConfig):
    engine = YesTestEngine(fingerprint)
    return Selector(engine).select(cfg, "fast"), engine


@pytest.mark.parametrize("cudnn, cc", [(91900, "10.0"), (92000, "10.3"), (92500, "10.0"), (92400, "11.0")])
def test_decode_on_blackwell_at_an_affected_cudnn_answers_none_at_depth_fast(cudnn, cc):
    selection, engine = _answer(blackwell(cudnn, cc), decode_step())
    rule = rules_by_name()[DECODE_RULE]
    assert selection.backend is Backend.NONE and engine.calls == 0
    (verdict,) = selection.verdicts
    assert (verdict.outcome, verdict.stage, verdict.provenance) == (Outcome.UNSUPPORTED, f"rule:{DECODE_RULE}",
                                                                     Provenance.RULE)
    assert rule.reason in selection.message and "silently" in selection.message
    assert rule.source in verdict.detail and "pytorch/pytorch/issues/193893" in verdict.detail


@pytest.mark.parametrize("cudnn, cc, cfg", [
    (91802, "10.0", decode_step()),                 # before 9.19
    (92501, "10.0", decode_step()),                 # 9.25.1, after the range PyTorch guards
    (92401, "10.0", decode_step()),                 # 9.24.1: left out by PyTorch's guard
    (91900, "9.0", decode_step()),                  # Hopper
    (91900, "12.0", decode_step()),                 # consumer Blackwell, SM 12.x
    (91900, "10.0", decode_step(seqlen_q=16)),      # not a decode step
    (0, "10.0", decode_step()),                     # cuDNN version unknown
])
def test_decode_rule_leaves_the_answer_to_the_engine_outside_its_report(cudnn, cc, cfg):
    selection, engine = _answer(blackwell(cudnn, cc), cfg)
    assert selection.backend is Backend.F16 and engine.calls == 1


def test_fp8_d256_masked_forward_on_a_frontend_dev_build_answers_none_at_depth_fast():
    selection, engine = _answer(blackwell(92600, "10.0", "1.29.0.dev66375696"), fp8_d256())
    assert selection.backend is Backend.NONE and engine.calls == 0
    (verdict,) = selection.verdicts
    assert verdict.stage == f"rule:{FP8_D256_RULE}" and verdict.phase is Phase.FORWARD
    assert "cudnn-frontend/issues/981" in verdict.detail and "cudnn-frontend/pull/985" in verdict.detail


def test_fp8_d256_training_is_refused_for_its_forward_only():
    selection, engine = _answer(blackwell(92600, "10.3", "1.29.0.dev1"), fp8_d256(is_training=True))
    refused = [v for v in selection.verdicts if not v.supported]
    assert selection.backend is Backend.NONE and [v.phase for v in refused] == [Phase.FORWARD]
    assert engine.calls == 0  # a rule answers the whole problem: no probe of its backward either


@pytest.mark.parametrize("frontend, cc, cfg", [
    ("1.28.0", "10.0", fp8_d256()),                     # released before the kernel
    ("1.29.0", "10.0", fp8_d256()),                     # the first release after the fix
    ("1.32.0", "10.0", fp8_d256()),
    ("1.29.0.dev5", "9.0", fp8_d256()),                 # Hopper
    ("1.29.0.dev5", "10.0", fp8_d256(mask="no_mask")),  # the no-mask path was always right
    ("1.29.0.dev5", "10.0", fp8_d256(head_dim_qk=128)),
])
def test_fp8_d256_rule_leaves_the_answer_to_the_engine_outside_its_report(frontend, cc, cfg):
    selection, engine = _answer(blackwell(92600, cc, frontend), cfg)
    assert selection.backend is Backend.FP8 and engine.calls == 1


VERSION_ORDER = [
    ("1.28.0", "1.29.0.dev0"), ("1.29.0.dev0", "1.29.0.dev66375696"), ("1.29.0.dev66375696", "1.29.0a0.dev0"),
    ("1.29.0.dev3", "1.29.0rc1.dev3"), ("1.29.0a1", "1.29.0b1"), ("1.29.0rc1.dev3", "1.29.0rc1"),
    ("1.29.0rc1", "1.29.0"), ("1.29.0", "1.29.0.post1.dev1"), ("1.29.0.post1.dev1", "1.29.0.post1"),
    ("1.29.0.post1", "1.29.1"), ("1.9.0", "1.10.0"), ("1.29", "1.29.1"),
]


@pytest.fixture(params=["packaging", "built-in"])
def version_parser(request, monkeypatch):
    """frontend_version_key with packaging.version, and with the parser used where it is not installed."""
    if request.param == "built-in":
        monkeypatch.setattr(rules, "_Version", None)
    return request.param


@pytest.mark.parametrize("older, newer", VERSION_ORDER)
def test_frontend_versions_sort_as_pep_440_orders_them(version_parser, older, newer):
    assert frontend_version_key(older) < frontend_version_key(newer)


def test_a_release_and_its_trailing_zero_form_are_the_same_version(version_parser):
    assert frontend_version_key("1.29") == frontend_version_key("1.29.0")


@pytest.mark.parametrize("text", ["", "unknown", "1.x.0", "1.29.0.devX"])
def test_a_frontend_version_that_is_not_one_has_no_key(version_parser, text):
    assert frontend_version_key(text) is None


@pytest.mark.parametrize("frontend, fires", [
    ("1.29.0.dev0", True), ("1.29.0.dev66375696", True),
    # Pre-releases of 1.29.0 and their dev builds are taken as fixed, like the release (docs/rules.md).
    ("1.29.0a1", False), ("1.29.0rc1.dev3", False), ("1.29.0rc1", False), ("1.29.0", False),
])
def test_fp8_d256_rule_names_the_1_29_0_nightlies_only(version_parser, frontend, fires):
    selection, _ = _answer(blackwell(92600, "10.0", frontend), fp8_d256())
    assert (selection.backend is Backend.NONE) is fires


@pytest.mark.parametrize("cc, fires", [("10.0", True), ("10.1", False), ("10.2", False), ("10.3", True)])
def test_fp8_d256_rule_holds_for_the_archs_its_reason_names(cc, fires):
    rule = rules_by_name()[FP8_D256_RULE]
    assert "SM 10.0/10.3" in rule.reason
    selection, _ = _answer(blackwell(92600, cc, "1.29.0.dev5"), fp8_d256())
    assert (selection.backend is Backend.NONE) is fires


def test_decode_rule_refuses_the_backward_too():
    selection, engine = _answer(blackwell(), decode_step(is_training=True))
    assert engine.calls == 0
    assert {(v.phase, v.stage) for v in selection.verdicts} == {(Phase.FORWARD, f"rule:{DECODE_RULE}"),
                                                                 (Phase.BACKWARD, f"rule:{DECODE_RULE}")}


@pytest.mark.parametrize("cudnn, refused", [(91900, True), (92501, False)])
def test_a_decode_step_after_a_prefill_of_its_class_is_decided_on_its_own_seqlen_q(cudnn, refused):
    """The prefill's bucket (S_q=4096) holds the decode step's shape: a GPU would run the step in it with
    one query per sequence, which is what the report is about, so the rule decides on the step asked."""
    engine = YesTestEngine(blackwell(cudnn))
    selector = Selector(engine)
    prefill = selector.select(decode_step(seqlen_q=4096))
    assert prefill.selected and prefill.plan_form.startswith("bucket")
    step = selector.select(decode_step(batch_size=4))
    if refused:
        assert step.backend is Backend.NONE and f"rule:{DECODE_RULE}" in step.message
        assert selector.select_own(decode_step(batch_size=4)).backend is Backend.NONE
    else:  # outside the report the prefill's bucket answers the step: no probe of its own
        assert step.selected and step.plan_form == prefill.plan_form


def test_a_bhsd_decode_step_is_refused_although_its_heads_as_batch_problem_has_several_rows():
    selection, engine = _answer(blackwell(), decode_step(qkv_layout="bhsd_bhsd_bhsd"))
    assert selection.backend is Backend.NONE and engine.calls == 0
    assert all(v.stage == f"rule:{DECODE_RULE}" for v in selection.verdicts)


def test_dispatch_never_passes_execute_time_shape_overrides():
    """docs/rules.md: the Attention docs' off-tile shape-override hazard does not apply because no
    graph is executed with override shapes; this pins that (a new use must come with a rule)."""
    runtime = ROOT / "fusedattn_select"
    pattern = re.compile(r"override_(shapes|uids|strides)|override_shape")
    users = [str(path.relative_to(ROOT)) for path in runtime.rglob("*.py") if pattern.search(path.read_text())]
    assert users == []


def test_an_fp8_gqa_training_problem_on_hopper_with_cudnn_9_19_answers_none_at_depth_fast():
    # Measured on an H100 (docs/rules.md): dK differs run to run. MHA is left to the engine.
    hopper = Fingerprint("cuda", "NVIDIA H100 80GB HBM3", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")
    llama = AttnConfig(batch_size=2, num_heads_q=32, num_heads_kv=8, seqlen_q=8192, seqlen_kv=8192, head_dim_qk=128,
                       qkv_dtype="fp8_e4m3", mask="causal", is_training=True)
    answer, engine = _answer(hopper, llama)
    assert answer.backend is Backend.NONE
    [refused] = [v for v in answer.verdicts if not v.supported]
    assert refused.phase is Phase.BACKWARD and refused.stage == "rule:cudnn-9.19-hopper-fp8-gqa-backward"
    assert "docs/rules.md" in refused.detail and "fp8-dk-check-h100.json" in refused.detail
    mha, _ = _answer(hopper, llama.replace(num_heads_kv=32))
    assert mha.backend is Backend.FP8
