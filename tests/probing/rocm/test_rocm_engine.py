"""DeclaredRocmEngine: verdicts per arch from the declared tables, every one labelled `declared`."""

from __future__ import annotations

import sys
import types

import pytest

from fusedattn_select.config import AttnConfig
from fusedattn_select.probing.engine_protocol import ProbeEngine
from fusedattn_select.probing.rocm import DeclaredRocmEngine, load_table, select_rocm_engine
from fusedattn_select.types import Backend, Outcome, Phase, ProbeDepth

FWD, BWD = Phase.FORWARD, Phase.BACKWARD
ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201")


def problem(**changes) -> AttnConfig:
    base = dict(batch_size=2, num_heads_q=16, num_heads_kv=16, seqlen_q=4096, seqlen_kv=4096, head_dim_qk=128)
    return AttnConfig(**{**base, **changes})


CONFIGS = {
    "bf16-d128-causal-train": problem(mask="causal"),
    "bf16-d128-causal-br-infer": problem(mask="causal_bottom_right", is_training=False),
    "fp16-d256": problem(qkv_dtype="fp16", head_dim_qk=256),
    "fp8-e4m3-d128": problem(qkv_dtype="fp8_e4m3", is_training=False),
    "bf16-d512-causal-infer": problem(head_dim_qk=512, mask="causal", is_training=False),
    "bf16-gqa-d128": problem(num_heads_q=32, num_heads_kv=8, mask="causal"),
    "bf16-padding-d128": problem(mask="padding_causal"),
}


def verdict(arch, cfg, phase=FWD, tables=None, backend=None):
    engine = DeclaredRocmEngine(arch, tables) if tables else DeclaredRocmEngine(arch)
    return engine.probe(cfg, backend or cfg.candidate, phase, ProbeDepth.FAST)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("phase", [FWD, BWD])
def test_every_verdict_reads_declared_and_cites_its_sources(arch, name, phase):
    cfg = CONFIGS[name]
    if phase is BWD and not cfg.is_training:
        cfg = cfg.replace(is_training=True)
    v = verdict(arch, cfg, phase)
    assert v.provenance.value == "declared"
    assert v.outcome in (Outcome.SUPPORTED, Outcome.UNSUPPORTED, Outcome.NO_DATA)
    assert v.stage.startswith("declared:")
    assert v.message.startswith("declared, not probed: ")
    for name in ("hipdnn_sdpa", "ck_fmha", "pytorch_sdpa"):
        for source in load_table(name).sources:
            assert source.commit[:12] in v.detail


def test_hipdnn_declares_bf16_d128_bottom_right_causal_inference_on_gfx942():
    v = verdict("gfx942", CONFIGS["bf16-d128-causal-br-infer"])
    assert (v.outcome, v.stage) == (Outcome.SUPPORTED, "declared:hipdnn_sdpa")


def test_hipdnn_has_no_top_left_causal_kernel_so_ck_answers():
    cfg = problem(mask="causal", is_training=False)
    only_hipdnn = verdict("gfx942", cfg, tables=("hipdnn_sdpa",))
    assert only_hipdnn.outcome is Outcome.UNSUPPORTED
    assert "mask='causal' (top_left_causal): no gfx942 forward kernel" in only_hipdnn.message
    assert verdict("gfx942", cfg).stage == "declared:ck_fmha"


def test_hipdnn_rejects_a_training_forward_because_it_cannot_output_stats():
    v = verdict("gfx950", CONFIGS["bf16-d128-causal-train"], tables=("hipdnn_sdpa",))
    assert v.outcome is Outcome.UNSUPPORTED
    assert "rejects generate_stats" in v.message


def test_hipdnn_backward_is_gfx942_bf16_unmasked_only():
    assert verdict("gfx942", problem(), BWD, ("hipdnn_sdpa",)).outcome is Outcome.SUPPORTED
    masked = verdict("gfx942", CONFIGS["bf16-d128-causal-train"], BWD, ("hipdnn_sdpa",))
    assert "masked attention not dispatched in backward" in masked.message
    other_arch = verdict("gfx950", problem(), BWD, ("hipdnn_sdpa",))
    assert "the backward engine runs on gfx942 only" in other_arch.message


def test_hipdnn_backward_head_dim_64_has_no_kernel_row_and_192_is_not_verified():
    assert "no backward kernel row" in verdict("gfx942", problem(head_dim_qk=64), BWD, ("hipdnn_sdpa",)).message
    d192 = verdict("gfx942", problem(head_dim_qk=192), BWD, ("hipdnn_sdpa",))
    assert d192.outcome is Outcome.SUPPORTED
    assert "not verified against hipDNN's CPU reference" in d192.message


def test_fp16_d256_is_a_ck_kernel_on_every_declared_arch():
    for arch in ARCHS:
        for phase in (FWD, BWD):
            v = verdict(arch, CONFIGS["fp16-d256"], phase)
            assert (v.outcome, v.stage) == (Outcome.SUPPORTED, "declared:ck_fmha"), (arch, phase, v.message)


def test_fp8_on_gfx90a_lists_the_reasons_of_every_table():
    v = verdict("gfx90a", CONFIGS["fp8-e4m3-d128"])
    assert v.outcome is Outcome.UNSUPPORTED
    assert v.stage == "declared:hipdnn_sdpa+ck_fmha+pytorch_sdpa"
    assert "hipdnn_sdpa: arch='gfx90a'" in v.message
    assert "ck_fmha: dtype fp8: not supported on gfx90a" in v.message
    assert "pytorch_sdpa: flash: qkv_dtype='fp8_e4m3': SDPA on ROCm has no fp8 kernel" in v.message


def test_fp8_in_bf16_out_forward_is_no_data_on_gfx942_and_its_backward_is_refused():
    # CK lists fp8bf16 kernels but not how their inputs are scaled: no data, never a declared "yes".
    cfg = problem(qkv_dtype="fp8_e4m3", scaling_mode="current")
    assert cfg.resolved_o_dtype == "bf16"
    forward = verdict("gfx942", cfg.replace(is_training=False))
    assert forward.outcome is Outcome.NO_DATA
    assert "ck_fmha: scaling_mode='current': not declared" in forward.message
    backward = verdict("gfx942", cfg, BWD)
    assert backward.outcome is Outcome.UNSUPPORTED
    assert "ck_fmha: dtype fp8bf16: backward kernels exist for fp32, fp16, bf16 only" in backward.message


def test_d512_is_pytorch_flash_except_on_gfx11_where_the_limit_is_256():
    cfg = CONFIGS["bf16-d512-causal-infer"]
    assert verdict("gfx942", cfg).stage == "declared:pytorch_sdpa"
    navi = verdict("gfx1100", cfg)
    assert navi.outcome is Outcome.UNSUPPORTED
    assert "head dims 512/512: must be <= 256 on gfx1100" in navi.message


def test_gqa_with_a_bias_is_rejected_by_both_sdpa_kernels_for_different_reasons():
    cfg = problem(num_heads_q=32, num_heads_kv=8, head_dim_qk=512, bias="post_scale_bias", bias_shape="1hss")
    v = verdict("gfx942", cfg, tables=("pytorch_sdpa",))
    assert "flash: bias='post_scale_bias': needs an attn_mask" in v.message
    assert "efficient: num_heads_q=32 != num_heads_kv=8: no grouped-query attention" in v.message


def test_padding_is_rejected_by_hipdnn_no_data_for_ck_and_declared_by_sdpa_through_an_attn_mask():
    cfg = CONFIGS["bf16-padding-d128"].replace(is_training=False)
    hipdnn = verdict("gfx942", cfg, tables=("hipdnn_sdpa",))
    assert "padding_mask must be false" in hipdnn.message and "group mode" not in hipdnn.message
    ck = verdict("gfx942", cfg, tables=("ck_fmha",))  # the CK table records no variable-length (group) mode
    assert ck.outcome is Outcome.NO_DATA and "mask='padding_causal' (padding)" in ck.message
    assert verdict("gfx942", cfg).stage == "declared:pytorch_sdpa"


def test_every_reason_is_listed_not_just_the_first():
    cfg = problem(qkv_dtype="fp16", head_dim_qk=256, dropout=0.1, bias="alibi", mask="causal")
    message = verdict("gfx90a", cfg, tables=("hipdnn_sdpa",)).message
    for part in ("arch='gfx90a'", "qkv_dtype='fp16'", "dropout=0.1", "alibi_mask must be false", "generate_stats"):
        assert part in message


def test_a_backend_other_than_the_problems_candidate_is_unsupported():
    v = verdict("gfx942", CONFIGS["bf16-d128-causal-br-infer"], backend=Backend.FP8)
    assert v.outcome is Outcome.UNSUPPORTED
    assert "asks for backend F16, not FP8" in v.message


def test_fingerprint_names_the_platform_and_the_arch_without_feature_flags():
    engine = DeclaredRocmEngine("gfx942:sramecc+:xnack-")
    fingerprint = engine.fingerprint()
    assert (fingerprint.platform, fingerprint.device_name) == ("rocm", "gfx942")
    assert "hipdnn_sdpa-" in fingerprint.library_version
    assert engine.name == "declared:rocm:gfx942"
    assert isinstance(engine, ProbeEngine)


def test_without_hipdnn_frontend_the_declared_engine_answers_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "hipdnn_frontend", None)
    engine, reason = select_rocm_engine("gfx950")
    assert isinstance(engine, DeclaredRocmEngine) and engine.arch == "gfx950"
    assert reason.startswith("hipdnn_frontend is not installed")


def test_with_hipdnn_frontend_the_live_factory_builds_the_engine(monkeypatch):
    frontend = types.ModuleType("hipdnn_frontend")
    monkeypatch.setitem(sys.modules, "hipdnn_frontend", frontend)
    built = []

    def factory(module, arch):
        built.append((module, arch))
        return DeclaredRocmEngine(arch)  # stands in for a live engine: none exists yet

    engine, reason = select_rocm_engine("gfx942:xnack-", factory)
    assert (built, reason) == ([(frontend, "gfx942")], "")
    _, no_factory_reason = select_rocm_engine("gfx942")
    assert "no live hipDNN probe is implemented" in no_factory_reason
