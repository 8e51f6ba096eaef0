"""What the declared ROCm tables do not cover is no data, never a declared "yes": deeper depths, head-dim gaps and the
fields no table reads (FP8 scaling, the max logit, a deterministic backward, bias shapes, page sizes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusedattn_select.config import AttnConfig
from fusedattn_select.probing.rocm import DeclaredRocmEngine, load_table
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Outcome, Phase, ProbeDepth, Provenance

ROOT = Path(__file__).resolve().parents[3]
FWD, BWD = Phase.FORWARD, Phase.BACKWARD
# bf16, head dim 128, bottom-right causal inference: hipDNN declares it on gfx942 (and CK does too).
DECLARED = dict(batch_size=2, num_heads_q=16, num_heads_kv=16, seqlen_q=4096, seqlen_kv=4096, head_dim_qk=128,
                mask="causal_bottom_right", is_training=False)


def problem(**changes) -> AttnConfig:
    return AttnConfig(**{**DECLARED, **changes})


def probe(cfg: AttnConfig, phase: Phase = FWD, depth: ProbeDepth = ProbeDepth.FAST, arch: str = "gfx942",
          tables=None):
    engine = DeclaredRocmEngine(arch, tables) if tables else DeclaredRocmEngine(arch)
    return engine.probe(cfg, cfg.candidate, phase, depth)


# ----- depth: a declared table answers at depth fast only --------------------------------------------------
def test_a_declared_yes_is_at_depth_fast():
    v = probe(problem())
    assert (v.outcome, v.stage, v.depth) == (Outcome.SUPPORTED, "declared:hipdnn_sdpa", ProbeDepth.FAST)


@pytest.mark.parametrize("depth, asks", [(ProbeDepth.FULL, "whether the kernels build"),
                                         (ProbeDepth.VERIFY, "whether they compute the right results")])
def test_a_deeper_question_is_no_data_saying_why(depth, asks):
    v = probe(problem(), depth=depth)
    assert v.outcome is Outcome.NO_DATA and v.provenance is Provenance.DECLARED
    assert v.depth is ProbeDepth.FAST  # what the tables answered at, never the depth asked
    assert v.stage == "declared:hipdnn_sdpa"
    assert "hipdnn_sdpa declares it, at depth fast only" in v.message
    assert asks in v.message and "only a live hipDNN probe could answer" in v.message


def test_a_declared_rejection_still_answers_a_deeper_question_at_depth_fast():
    v = probe(problem(head_dim_qk=1024), depth=ProbeDepth.VERIFY)
    assert (v.outcome, v.depth) == (Outcome.UNSUPPORTED, ProbeDepth.FAST)


def test_the_selector_answers_no_data_at_verify_and_supported_at_fast():
    selector = Selector(DeclaredRocmEngine("gfx942"))
    assert selector.select(problem(), "verify").no_data
    assert selector.select(problem(), "fast").selected
    assert selector.select(problem(), "full").no_data


# ----- a dtype the CK table lists with no head-dim table -----------------------------------------------------
FP8_IN_FP16_OUT = dict(qkv_dtype="fp8_e4m3", o_dtype="fp16")


def test_a_listed_dtype_without_a_head_dim_table_is_a_gap_not_a_rejection():
    ck = load_table("ck_fmha")
    assert "fp8fp16" in ck.facts["architectures"]["gfx942"]["dtypes"] and "fp8fp16" not in ck.facts["forward_head_dims"]
    engine = DeclaredRocmEngine("gfx942")
    cfg = problem(**FP8_IN_FP16_OUT)
    (answer,) = [a for a in engine.answers(cfg, FWD) if a.table == "ck_fmha"]
    assert answer.reasons == () and answer.no_data
    assert any("dtype fp8fp16: no forward head-dim table is declared" in gap for gap in answer.gaps)
    v = engine.probe(cfg, cfg.candidate, FWD, ProbeDepth.FAST)
    assert v.outcome is Outcome.NO_DATA
    assert "ck_fmha has no data" in v.message and "no forward head-dim table" in v.message


def test_a_rejection_in_the_same_table_wins_over_its_gap():
    v = probe(problem(**FP8_IN_FP16_OUT, head_dim_qk=100))
    assert v.outcome is Outcome.UNSUPPORTED
    assert "ck_fmha: head_dim_qk=100, head_dim_v=100: must be multiples of 8" in v.message


# ----- fields no declared table reads ----------------------------------------------------------------------
# (field, the problem that sets it, phase): each one is a problem a table declares without the field.
FIELDS = {
    "return_max_logit": (problem(return_max_logit=True), FWD),
    "deterministic": (problem(mask="no_mask", is_training=True, deterministic=True), BWD),
    "bias_shape": (problem(mask="causal", bias="post_scale_bias", bias_shape="1hss"), FWD),
    "page_size": (problem(seqlen_q=1, mask="padding_causal_bottom_right", qkv_layout="paged_kv_bshd_bshd_bshd",
                          page_size=64, num_pages=1024), FWD),
    "scaling_mode": (problem(mask="causal", qkv_dtype="fp8_e4m3", scaling_mode="delayed"), FWD),
}
WITHOUT = {
    "return_max_logit": dict(return_max_logit=False),
    "deterministic": dict(deterministic=False),
    "bias_shape": dict(bias="no_bias", bias_shape=None),
    "page_size": dict(qkv_layout="bshd_bshd_bshd", page_size=None, num_pages=None),
    "scaling_mode": dict(qkv_dtype="bf16", scaling_mode=None),
}


@pytest.mark.parametrize("field", FIELDS)
def test_a_field_no_table_reads_is_no_data_naming_it(field):
    cfg, phase = FIELDS[field]
    assert probe(cfg.replace(**WITHOUT[field]), phase).outcome is Outcome.SUPPORTED
    v = probe(cfg, phase)
    assert v.outcome is Outcome.NO_DATA, v.message
    assert f"{field}=" in v.message and "not declared" in v.message


def test_mxfp8_is_refused_citing_ck_dtype_maps_at_the_pinned_commit():
    cfg = problem(mask="causal", qkv_dtype="fp8_e4m3", scaling_mode="mxfp8")
    v = probe(cfg)
    assert v.outcome is Outcome.UNSUPPORTED
    (symbol_map,) = [s for s in load_table("ck_fmha").sources if s.path.endswith("symbol_map.py")]
    assert "ck_fmha: scaling_mode='mxfp8': no block-scaled (MX) type in CK's FWD_DTYPE_MAP" in v.message
    assert symbol_map.commit[:12] in v.message
    text = (ROOT / symbol_map.pinned).read_text(encoding="utf-8")
    maps = text[text.index("FWD_DTYPE_MAP"):text.index("MASK_CANONICAL")]
    assert "mx" not in maps.lower()  # the pinned source has no block-scaled type


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201", "gfx1234"])
def test_no_table_ever_declares_a_field_it_does_not_read(field, arch):
    cfg, phase = FIELDS[field]
    for depth in ProbeDepth:
        assert probe(cfg, phase, depth, arch).outcome is not Outcome.SUPPORTED
