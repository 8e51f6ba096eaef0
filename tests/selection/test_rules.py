"""Static rules: each fires on the problem it targets, on its backend, phase and cuDNN versions only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fusedattn_select import AttnConfig
from fusedattn_select.selection.rules import RULES, apply_rules, no_platform_verdict, rules_by_name
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, Provenance

ROOT = Path(__file__).resolve().parents[2]
BASE = dict(batch_size=2, num_heads_q=16, num_heads_kv=16, seqlen_q=2048, seqlen_kv=2048, head_dim_qk=128)
FP8 = dict(qkv_dtype="fp8_e4m3")


def hopper(version: int = 91900, cc: str = "9.0", frontend: str = "1.32.0") -> Fingerprint:
    return Fingerprint("cuda", "NVIDIA H100 80GB HBM3", cc, 132, version, frontend, "580.00", "0.1.0")


def cfg(**changes) -> AttnConfig:
    return AttnConfig(**{**BASE, **changes})


CUDA_GRAPH = dict(cuda_graph=True, seqlen_kv=1000, seqlen_q=1000)
WINDOW = dict(window_size=(128, 128), seqlen_kv=2048)
MLA = dict(head_dim_qk=256, head_dim_v=128)
DECODE = dict(seqlen_q=1, is_training=False)
FP8_D256 = dict(FP8, head_dim_qk=256, mask="causal", is_training=False)
DEV_FRONTEND = "1.29.0.dev66375696"
DROPOUT_ROW = dict(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=1, seqlen_kv=512, head_dim_qk=64,
                   dropout=0.1, is_training=False)
FP8_GQA = dict(FP8, num_heads_q=32, num_heads_kv=8, mask="causal", scaling_mode="delayed", is_training=True)
FP8_DROPOUT = dict(FP8, head_dim_qk=64, dropout=0.1, scaling_mode="current", is_training=False)

# (rule, config changes, cuDNN version, compute capability, phase): the rule rejects this problem.
FIRES = [
    ("pre-scale-bias", dict(bias="pre_scale_bias"), 91900, "9.0", Phase.FORWARD),
    ("pre-scale-bias", dict(FP8, bias="pre_scale_bias"), 91900, "9.0", Phase.BACKWARD),
    ("fp8-bias", dict(FP8, bias="alibi"), 91900, "9.0", Phase.FORWARD),
    ("fp8-bias", dict(FP8, bias="post_scale_bias", bias_shape="1hss"), 91900, "9.0", Phase.BACKWARD),
    ("fp8-max-logit", dict(FP8, return_max_logit=True), 91900, "9.0", Phase.FORWARD),
    ("fp8-layout", dict(FP8, qkv_layout="thd_thd_thd", mask="padding"), 91900, "9.0", Phase.FORWARD),
    ("fp8-layout", dict(FP8, qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", page_size=16, num_pages=64,
                        is_training=False), 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.10.0-fp8", dict(FP8), 91000, "9.0", Phase.FORWARD),
    ("cudnn-9.10.0-9.10.1-f16", {}, 91000, "9.0", Phase.BACKWARD),
    ("cudnn-9.10.0-9.10.1-f16", {}, 91001, "9.0", Phase.FORWARD),
    ("cudnn-9.14.0-window-non-causal", WINDOW, 91400, "9.0", Phase.FORWARD),
    ("cudnn-9.14.0-window-non-causal", dict(WINDOW, mask="padding", window_size=(128, 0)), 91400, "9.0",
     Phase.BACKWARD),
    ("cudnn-le-9.15.0-cuda-graph-training", CUDA_GRAPH, 91500, "9.0", Phase.BACKWARD),
    ("cudnn-le-9.15.0-cuda-graph-training", dict(CUDA_GRAPH, qkv_layout="sbhd_sbhd_sbhd"), 90100, "9.0",
     Phase.BACKWARD),
    ("cudnn-9.11-hopper-mla-backward", MLA, 91100, "9.0", Phase.BACKWARD),
    ("cudnn-9.11-hopper-mla-backward", dict(head_dim_qk=128, head_dim_v=256), 91900, "9.0", Phase.BACKWARD),
    ("cudnn-9.19-9.25.0-blackwell-decode", DECODE, 91900, "10.0", Phase.FORWARD),
    ("cudnn-9.19-9.25.0-blackwell-decode", DECODE, 92500, "10.3", Phase.FORWARD),
    ("cudnn-9.19-9.25.0-blackwell-decode", dict(DECODE, is_training=True), 92400, "11.0", Phase.FORWARD),
    ("cudnn-9.19-9.25.0-blackwell-decode", dict(DECODE, is_training=True), 92400, "10.0", Phase.BACKWARD),
    ("cudnn-9.19-9.25.0-blackwell-decode", DECODE, 91900, "10.1", Phase.FORWARD),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", FP8_D256, 91900, "10.0", Phase.FORWARD, DEV_FRONTEND),
    ("cudnn-9.19-hopper-dropout-one-query-row", DROPOUT_ROW, 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-dropout-one-query-row", dict(DROPOUT_ROW, seqlen_kv=257, dropout=0.01), 91999, "9.0",
     Phase.FORWARD),
    ("cudnn-9.19-hopper-dropout-one-query-row", dict(DROPOUT_ROW, is_training=True), 91900, "9.0", Phase.BACKWARD),
    ("cudnn-9.19-hopper-fp8-gqa-backward", FP8_GQA, 91900, "9.0", Phase.BACKWARD),
    ("cudnn-9.19-hopper-fp8-dropout", FP8_DROPOUT, 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-fp8-dropout", dict(FP8_DROPOUT, is_training=True, mask="causal"), 91999, "9.0",
     Phase.BACKWARD),
    ("cudnn-9.19-hopper-fp8-gqa-backward", dict(FP8_GQA, num_heads_kv=1, dqkv_dtype="fp8_e5m2"), 91999, "9.0",
     Phase.BACKWARD),
    ("cudnn-9.19-hopper-fp8-gqa-backward", dict(FP8_GQA, scaling_mode="current", o_dtype="fp8_e4m3"), 91900, "9.0",
     Phase.BACKWARD),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", dict(FP8_D256, mask="causal_bottom_right"), 92600, "10.3",
     Phase.FORWARD, "1.29.0.dev0"),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", dict(FP8_D256, mask="no_mask", window_size=(128, 0)), 92600,
     "10.0", Phase.FORWARD, DEV_FRONTEND),
]

# Near misses: one condition (backend, phase, version bound, shape) away from a rule; it must not fire.
NEAR_MISSES = [
    ("pre-scale-bias", dict(bias="post_scale_bias", bias_shape="1hss"), 91900, "9.0", Phase.FORWARD),
    ("fp8-bias", dict(bias="alibi"), 91900, "9.0", Phase.FORWARD),
    ("fp8-bias", dict(FP8), 91900, "9.0", Phase.FORWARD),
    ("fp8-max-logit", dict(return_max_logit=True), 91900, "9.0", Phase.FORWARD),
    ("fp8-max-logit", dict(FP8, return_max_logit=True), 91900, "9.0", Phase.BACKWARD),
    ("fp8-layout", dict(qkv_layout="thd_thd_thd", mask="padding"), 91900, "9.0", Phase.FORWARD),
    ("fp8-layout", dict(FP8, qkv_layout="bhsd_bhsd_bhsd"), 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.10.0-fp8", dict(FP8), 91002, "9.0", Phase.FORWARD),
    ("cudnn-9.10.0-fp8", dict(FP8), 90900, "9.0", Phase.FORWARD),
    ("cudnn-9.10.0-fp8", {}, 91000, "9.0", Phase.FORWARD),
    ("cudnn-9.10.0-9.10.1-f16", {}, 91002, "9.0", Phase.FORWARD),
    ("cudnn-9.10.0-9.10.1-f16", {}, 90999, "9.0", Phase.FORWARD),
    ("cudnn-9.10.0-9.10.1-f16", dict(FP8), 91001, "9.0", Phase.FORWARD),
    ("cudnn-9.14.0-window-non-causal", WINDOW, 91401, "9.0", Phase.FORWARD),
    ("cudnn-9.14.0-window-non-causal", WINDOW, 91300, "9.0", Phase.FORWARD),
    ("cudnn-9.14.0-window-non-causal", dict(WINDOW, seqlen_kv=1024, seqlen_q=1024), 91400, "9.0", Phase.FORWARD),
    ("cudnn-9.14.0-window-non-causal", dict(WINDOW, mask="causal", window_size=(128, 0)), 91400, "9.0",
     Phase.FORWARD),
    ("cudnn-9.14.0-window-non-causal", dict(seqlen_kv=2048), 91400, "9.0", Phase.FORWARD),
    ("cudnn-9.14.0-window-non-causal", dict(WINDOW, **FP8), 91400, "9.0", Phase.FORWARD),
    ("cudnn-le-9.15.0-cuda-graph-training", CUDA_GRAPH, 91501, "9.0", Phase.BACKWARD),
    ("cudnn-le-9.15.0-cuda-graph-training", dict(CUDA_GRAPH, seqlen_kv=1024, seqlen_q=1024), 91500, "9.0",
     Phase.BACKWARD),
    ("cudnn-le-9.15.0-cuda-graph-training", dict(CUDA_GRAPH, mask="padding"), 91500, "9.0", Phase.BACKWARD),
    ("cudnn-le-9.15.0-cuda-graph-training", dict(CUDA_GRAPH, cuda_graph=False), 91500, "9.0", Phase.BACKWARD),
    ("cudnn-le-9.15.0-cuda-graph-training", dict(CUDA_GRAPH, qkv_layout="bhsd_bhsd_bhsd"), 91500, "9.0",
     Phase.BACKWARD),
    ("cudnn-le-9.15.0-cuda-graph-training", CUDA_GRAPH, 91500, "9.0", Phase.FORWARD),
    # The widened CUDA-graph guard of the reference implementation: FP8 is not affected.
    ("cudnn-le-9.15.0-cuda-graph-training", dict(CUDA_GRAPH, **FP8), 91500, "9.0", Phase.BACKWARD),
    ("cudnn-9.11-hopper-mla-backward", MLA, 91000, "9.0", Phase.BACKWARD),
    ("cudnn-9.11-hopper-mla-backward", MLA, 91900, "10.0", Phase.BACKWARD),
    ("cudnn-9.11-hopper-mla-backward", MLA, 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.11-hopper-mla-backward", dict(head_dim_qk=192, head_dim_v=128), 91900, "9.0", Phase.BACKWARD),
    ("cudnn-9.11-hopper-mla-backward", dict(head_dim_qk=128, head_dim_v=128), 91900, "9.0", Phase.BACKWARD),
    ("cudnn-9.11-hopper-mla-backward", dict(head_dim_qk=96, head_dim_v=128), 91900, "9.0", Phase.BACKWARD),
    # Decode on Blackwell: outside 9.19-9.25.0, at 9.24.1, on Hopper or SM 12.x, with seqlen_q > 1, FP8.
    ("cudnn-9.19-9.25.0-blackwell-decode", DECODE, 91802, "10.0", Phase.FORWARD),
    ("cudnn-9.19-9.25.0-blackwell-decode", DECODE, 92501, "10.0", Phase.FORWARD),
    ("cudnn-9.19-9.25.0-blackwell-decode", DECODE, 92401, "10.0", Phase.FORWARD),
    ("cudnn-9.19-9.25.0-blackwell-decode", DECODE, 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.19-9.25.0-blackwell-decode", DECODE, 91900, "12.0", Phase.FORWARD),
    ("cudnn-9.19-9.25.0-blackwell-decode", dict(DECODE, seqlen_q=2), 91900, "10.0", Phase.FORWARD),
    ("cudnn-9.19-9.25.0-blackwell-decode", dict(DECODE, **FP8), 91900, "10.0", Phase.FORWARD),
    # FP8 d256: released frontends before and after the development builds, other archs, no mask, d128, F16.
    # The FP8 GQA backward on Hopper: MHA, 16-bit gradients, the forward, cuDNN outside 9.19, not Hopper.
    ("cudnn-9.19-hopper-dropout-one-query-row", dict(DROPOUT_ROW, seqlen_kv=256), 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-dropout-one-query-row", dict(DROPOUT_ROW, seqlen_kv=513), 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-dropout-one-query-row", dict(DROPOUT_ROW, seqlen_q=2), 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-dropout-one-query-row", dict(DROPOUT_ROW, head_dim_qk=128), 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-dropout-one-query-row", dict(DROPOUT_ROW, dropout=0.0), 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-dropout-one-query-row", dict(DROPOUT_ROW, qkv_layout="thd_thd_thd", mask="padding"), 91900,
     "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-dropout-one-query-row", DROPOUT_ROW, 92000, "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-dropout-one-query-row", DROPOUT_ROW, 91900, "10.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-fp8-gqa-backward", dict(FP8_GQA, num_heads_kv=32), 91900, "9.0", Phase.BACKWARD),
    # FP8 with dropout on Hopper 9.19: no dropout, F16 with dropout, other cuDNN versions, not Hopper.
    ("cudnn-9.19-hopper-fp8-dropout", dict(FP8_DROPOUT, dropout=0.0), 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-fp8-dropout", dict(FP8_DROPOUT, qkv_dtype="bf16", scaling_mode=None), 91900, "9.0",
     Phase.FORWARD),
    ("cudnn-9.19-hopper-fp8-dropout", FP8_DROPOUT, 92000, "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-fp8-dropout", FP8_DROPOUT, 91900, "10.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-fp8-gqa-backward", dict(FP8_GQA, dqkv_dtype="bf16"), 91900, "9.0", Phase.BACKWARD),
    ("cudnn-9.19-hopper-fp8-gqa-backward", dict(FP8_GQA, scaling_mode="current"), 91900, "9.0", Phase.BACKWARD),
    ("cudnn-9.19-hopper-fp8-gqa-backward", FP8_GQA, 91900, "9.0", Phase.FORWARD),
    ("cudnn-9.19-hopper-fp8-gqa-backward", FP8_GQA, 91802, "9.0", Phase.BACKWARD),
    ("cudnn-9.19-hopper-fp8-gqa-backward", FP8_GQA, 92000, "9.0", Phase.BACKWARD),
    ("cudnn-9.19-hopper-fp8-gqa-backward", FP8_GQA, 91900, "10.0", Phase.BACKWARD),
    ("cudnn-9.19-hopper-fp8-gqa-backward", dict(FP8_GQA, qkv_dtype="bf16", scaling_mode=None), 91900, "9.0",
     Phase.BACKWARD),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", FP8_D256, 91900, "10.0", Phase.FORWARD, "1.28.0"),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", FP8_D256, 91900, "10.0", Phase.FORWARD, "1.29.0"),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", FP8_D256, 91900, "10.0", Phase.FORWARD, "1.32.0"),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", FP8_D256, 91900, "10.0", Phase.FORWARD, ""),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", FP8_D256, 91900, "9.0", Phase.FORWARD, DEV_FRONTEND),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", FP8_D256, 91900, "10.1", Phase.FORWARD, DEV_FRONTEND),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", FP8_D256, 91900, "10.2", Phase.FORWARD, DEV_FRONTEND),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", FP8_D256, 91900, "10.0", Phase.FORWARD, "1.29.0rc1"),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", FP8_D256, 91900, "12.0", Phase.FORWARD, DEV_FRONTEND),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", dict(FP8_D256, mask="no_mask"), 91900, "10.0", Phase.FORWARD,
     DEV_FRONTEND),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", dict(FP8_D256, mask="padding"), 91900, "10.0", Phase.FORWARD,
     DEV_FRONTEND),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", dict(FP8_D256, head_dim_qk=128), 91900, "10.0", Phase.FORWARD,
     DEV_FRONTEND),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", dict(FP8_D256, qkv_dtype="bf16"), 91900, "10.0", Phase.FORWARD,
     DEV_FRONTEND),
    ("cudnn-frontend-1.29-dev-fp8-d256-masked", dict(FP8_D256, is_training=True), 91900, "10.0", Phase.BACKWARD,
     DEV_FRONTEND),
]


def _fires(name: str, changes: dict, version: int, cc: str, phase: Phase, frontend: str = "1.32.0") -> bool:
    rule = rules_by_name()[name]
    return phase in rule.phases and rule.applies(cfg(**changes), hopper(version, cc, frontend))


@pytest.mark.parametrize("case", FIRES, ids=[f"{c[0]}-{i}" for i, c in enumerate(FIRES)])
def test_rule_fires_on_the_problem_it_targets(case):
    name, changes, version, cc, phase, *frontend = case
    assert _fires(*case)
    verdict = apply_rules(cfg(**changes), hopper(version, cc, *frontend), phase)
    assert verdict is not None and verdict.stage == f"rule:{name}"


@pytest.mark.parametrize("case", NEAR_MISSES, ids=[f"{c[0]}-{i}" for i, c in enumerate(NEAR_MISSES)])
def test_rule_does_not_fire_on_a_near_miss(case):
    assert not _fires(*case)


def test_every_rule_has_a_firing_case_and_a_near_miss():
    names = {rule.name for rule in RULES}
    assert {case[0] for case in FIRES} == names
    assert {case[0] for case in NEAR_MISSES} == names


def test_version_scoped_rule_does_not_fire_when_the_cudnn_version_is_unknown():
    assert not rules_by_name()["cudnn-le-9.15.0-cuda-graph-training"].applies(cfg(**CUDA_GRAPH), hopper(0))


def test_known_bug_rules_state_their_versions():
    for rule in RULES:
        if rule.known_bug:
            assert (rule.cudnn_versions, rule.frontend_versions) != ((None, None), (None, None)), rule.name


def test_every_rule_has_a_reason_and_a_source_link():
    for rule in RULES:
        # A link, or for a bug this project measured, its documentation and recorded runs in this repository.
        for source in (rule.source, *rule.see_also):
            assert source.startswith("https://") or (ROOT / source).is_file(), (rule.name, source)
        assert rule.reason, rule.name
        assert rule.backends and rule.phases, rule.name


def test_rule_verdict_names_the_rule_and_keeps_the_source():
    rule = rules_by_name()["fp8-bias"]
    verdict = rule.verdict(cfg(**FP8, bias="alibi"), Phase.FORWARD)
    assert (verdict.backend, verdict.outcome, verdict.provenance) == (Backend.FP8, Outcome.UNSUPPORTED, Provenance.RULE)
    assert verdict.stage == "rule:fp8-bias"
    assert verdict.message == rule.reason and rule.source in verdict.detail
    assert verdict.reason() == f"FP8 forward not supported at rule:fp8-bias: {rule.reason}"


def test_apply_rules_returns_none_when_no_rule_rejects():
    for phase in Phase:
        assert apply_rules(cfg(mask="causal"), hopper(), phase) is None


def test_platform_rule_is_no_data_and_says_how_to_get_an_answer():
    verdict = no_platform_verdict(cfg(), Phase.FORWARD, "no NVIDIA driver")
    assert verdict.stage == "rule:platform" and verdict.outcome is Outcome.NO_DATA
    for hint in ("no NVIDIA driver", "fusedattn-select[cuda]", "--snapshot", "FUSEDATTN_SELECT_SNAPSHOT", "--target",
                 "use_snapshots()"):
        assert hint in verdict.message


def test_docs_rules_table_lists_every_rule_with_its_reason():
    doc = (ROOT / "docs" / "rules.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", doc, re.MULTILINE)}
    for rule in RULES:
        assert rule.name in rows, f"docs/rules.md's table misses {rule.name}"
        assert rule.reason in rows[rule.name], f"docs/rules.md's reason for {rule.name} is stale"


def test_platform_rule_names_the_install_hint_once():
    detail = "cudnn-frontend is not installed (No module named 'cudnn'); install 'fusedattn-select[cuda]' to probe cuDNN"
    message = no_platform_verdict(cfg(), Phase.FORWARD, detail).message
    assert message.count("fusedattn-select[cuda]") == 1
    assert no_platform_verdict(cfg(), Phase.FORWARD, "no NVIDIA driver").message.count("fusedattn-select[cuda]") == 1
