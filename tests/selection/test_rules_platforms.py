"""The cuDNN rules describe the cuda platform only: a ROCm question is answered by the ROCm declared tables alone."""

from __future__ import annotations

import dataclasses

import pytest

from fusedattn_select.config import AttnConfig
from fusedattn_select.probing.rocm import DeclaredRocmEngine
from fusedattn_select.selection.rules import RULES, apply_rules
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Fingerprint, Phase, ProbeDepth, Provenance

CUDA_H100 = Fingerprint("cuda", "NVIDIA H100 80GB HBM3", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")
ROCM_GFX942 = Fingerprint(platform="rocm", device_name="gfx942", library_version="0.1.0+declared")

BASE = dict(batch_size=8, num_heads_q=32, num_heads_kv=8, seqlen_q=1, seqlen_kv=8192, head_dim_qk=128,
            is_training=False)
FP8 = dict(qkv_dtype="fp8_e4m3", o_dtype="fp8_e4m3")
# Problems one of the cuDNN structural rules refuses on cuda (the rule named first).
REFUSED_BY_CUDNN_RULES = {
    "fp8-layout": dict(**FP8, qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding_causal_bottom_right",
                       page_size=64, num_pages=1024),
    "fp8-bias": dict(**FP8, bias="alibi"),
    "pre-scale-bias": dict(bias="pre_scale_bias"),
}


def problem(**changes) -> AttnConfig:
    return AttnConfig(**{**BASE, **changes})


def test_every_rule_describes_cuda_only():
    assert all(rule.platforms == ("cuda",) for rule in RULES)


@pytest.mark.parametrize("name", REFUSED_BY_CUDNN_RULES)
def test_a_cudnn_rule_refuses_on_cuda_and_says_nothing_on_rocm(name):
    cfg = problem(**REFUSED_BY_CUDNN_RULES[name])
    on_cuda = apply_rules(cfg, CUDA_H100, Phase.FORWARD)
    assert on_cuda is not None and on_cuda.stage == f"rule:{name}"
    assert apply_rules(cfg, ROCM_GFX942, Phase.FORWARD) is None
    assert not any(rule.covers(ROCM_GFX942) for rule in RULES)


@pytest.mark.parametrize("name", REFUSED_BY_CUDNN_RULES)
def test_why_platform_rocm_answers_what_the_declared_tables_say(name):
    cfg = problem(**REFUSED_BY_CUDNN_RULES[name])
    engine = DeclaredRocmEngine("gfx942")
    selection = Selector(engine).select(cfg)
    direct = engine.probe(cfg, cfg.candidate, Phase.FORWARD, ProbeDepth.FAST)
    (verdict,) = selection.verdicts
    assert verdict.provenance is Provenance.DECLARED and verdict.stage.startswith("declared:")
    assert (verdict.outcome, verdict.stage, verdict.message) == (direct.outcome, direct.stage, direct.message)


def test_the_fp8_paged_decode_the_ck_table_declares_is_not_refused_by_a_cudnn_rule():
    cfg = problem(**REFUSED_BY_CUDNN_RULES["fp8-layout"])
    selection = Selector(DeclaredRocmEngine("gfx942")).select(cfg)
    assert all("cuDNN" not in v.message for v in selection.verdicts)


def test_a_platform_the_library_does_not_know_keeps_the_cuda_rules():
    from fusedattn_select.selection.rules import rule_platform

    double = dataclasses.replace(CUDA_H100, platform="test-double")
    assert (rule_platform(double), rule_platform(ROCM_GFX942), rule_platform(CUDA_H100)) == ("cuda", "rocm", "cuda")
    cfg = problem(**REFUSED_BY_CUDNN_RULES["fp8-bias"])
    assert apply_rules(cfg, double, Phase.FORWARD).stage == "rule:fp8-bias"
