"""AttnConfig: validation, derived values, serialisation and the cache key (YAML files: test_config_yaml.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from fusedattn_select import AttnConfig, Backend, ConfigError, FusedAttnSelectError
from fusedattn_select.config_files import load_config_file
from fusedattn_select.layouts import LAYOUTS
from fusedattn_select.types import Phase, ProbeDepth

ROOT = Path(__file__).resolve().parents[2]
BASE = dict(batch_size=2, num_heads_q=32, num_heads_kv=8, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128)
FP8 = dict(BASE, qkv_dtype="fp8_e4m3")


def make(**changes) -> AttnConfig:
    return AttnConfig(**{**BASE, **changes})


# ----- single-field validation -----------------------------------------------------------------
BAD_VALUES = [
    ("batch_size", 0), ("batch_size", -1), ("batch_size", 1.5), ("batch_size", True), ("batch_size", "2"),
    ("num_heads_q", 0), ("num_heads_kv", 0), ("seqlen_q", 0), ("seqlen_kv", -4),
    ("head_dim_qk", 0), ("head_dim_v", 0), ("head_dim_v", 64.0),
    ("qkv_dtype", "fp32"), ("qkv_dtype", None), ("o_dtype", "fp32"), ("do_dtype", "int8"), ("dqkv_dtype", "f16"),
    ("qkv_layout", "bshd"), ("qkv_layout", "BSHD_BSHD_BSHD"), ("o_format", "bsd"), ("do_format", "hd"),
    ("dqkv_layout", "nope"), ("dqkv_layout", "paged_kv_bshd_bshd_bshd"),
    ("mask", "sliding"), ("bias", "relative"), ("bias_shape", "bss"), ("softmax", "sparse"),
    ("scaling_mode", "tensor"),
    ("is_training", "yes"), ("deterministic", 1), ("cuda_graph", None), ("return_max_logit", "false"),
    ("bottom_right_diagonal", "yes"),
    ("page_size", 0), ("num_pages", -1),
    ("window_size", (1, 2, 3)), ("window_size", (-2, 0)), ("window_size", (1.5, 0)), ("window_size", "128"),
    ("window_size", (True, 0)),
    ("dropout", 1.0), ("dropout", -0.1), ("dropout", "0.1"), ("dropout", True),
    ("attn_scale", 0.0), ("attn_scale", -1.0), ("attn_scale", math.inf), ("attn_scale", math.nan),
    ("attn_scale", "1"), ("attn_scale", True),
]


@pytest.mark.parametrize("name, value", BAD_VALUES, ids=[f"{n}={v!r}" for n, v in BAD_VALUES])
def test_bad_field_value_raises_config_error_naming_the_field(name, value):
    with pytest.raises(ConfigError) as info:
        make(**{name: value})
    err = info.value
    assert err.field == name
    assert str(err).startswith(f"{name}=")
    assert isinstance(err, ValueError) and isinstance(err, FusedAttnSelectError)


def test_bad_choice_message_lists_the_allowed_values():
    with pytest.raises(ConfigError, match="must be one of 'no_mask', 'padding', 'causal'"):
        make(mask="sliding")


def test_error_message_names_field_value_and_rule():
    with pytest.raises(ConfigError) as info:
        make(head_dim_qk=0)
    assert str(info.value) == "head_dim_qk=0: must be a positive integer"


# ----- cross-field validation ------------------------------------------------------------------
CROSS_FIELD = [
    ("gqa-heads-must-divide", dict(num_heads_q=32, num_heads_kv=6), "num_heads_kv", "must divide"),
    ("ragged-needs-padding-mask", dict(qkv_layout="thd_thd_thd", mask="causal"), "mask", "ragged"),
    ("qkv-interleaved-needs-equal-seqlens", dict(qkv_layout="bs3hd", num_heads_kv=32, seqlen_kv=512),
     "qkv_layout", "interleaved QKV"),
    ("qkv-interleaved-needs-equal-heads", dict(qkv_layout="bs3hd"), "qkv_layout", "interleaved QKV"),
    ("qkv-interleaved-needs-equal-head-dims", dict(qkv_layout="sbh3d", num_heads_kv=32, head_dim_v=64),
     "qkv_layout", "interleaved QKV"),
    ("kv-interleaved-needs-equal-head-dims", dict(qkv_layout="bshd_bs2hd", head_dim_v=64),
     "qkv_layout", "interleaved KV"),
    ("paged-needs-page-size", dict(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", is_training=False,
                                   num_pages=64), "page_size", "needs page_size and num_pages"),
    ("paged-needs-num-pages", dict(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", is_training=False,
                                   page_size=64), "page_size", "needs page_size and num_pages"),
    ("paged-is-inference-only", dict(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", page_size=64,
                                     num_pages=64), "is_training", "inference only"),
    ("paged-needs-padding-mask", dict(qkv_layout="paged_kv_bshd_bshd_bshd", mask="causal", page_size=64,
                                      num_pages=64, is_training=False), "mask", "padding mask"),
    ("page-size-only-with-paged-layout", dict(page_size=64), "page_size", "paged_kv"),
    ("num-pages-only-with-paged-layout", dict(num_pages=64), "num_pages", "paged_kv"),
    ("thd-output-needs-thd-q", dict(o_format="thd"), "o_format", "exactly when Q is THD"),
    ("thd-grad-output-needs-thd-q", dict(do_format="thd"), "do_format", "exactly when Q is THD"),
    ("thd-q-needs-thd-grad-output", dict(qkv_layout="thd_thd_thd", mask="padding", do_format="bshd"), "do_format", "exactly when Q is THD"),
    ("thd-q-needs-thd-output", dict(qkv_layout="thd_thd_thd", mask="padding", o_format="bshd"),
     "o_format", "exactly when Q is THD"),
    ("dqkv-layout-raggedness-must-match", dict(dqkv_layout="thd_thd_thd"), "dqkv_layout", "ragged"),
    ("causal-window-right-bound", dict(mask="causal", window_size=(128, 64)), "window_size", "right bound"),
    ("bottom-right-false-contradicts-mask", dict(mask="causal_bottom_right", bottom_right_diagonal=False),
     "bottom_right_diagonal", "contradicts"),
    ("post-scale-bias-needs-shape", dict(bias="post_scale_bias"), "bias_shape", "needs a bias_shape"),
    ("bias-shape-only-with-post-scale-bias", dict(bias="alibi", bias_shape="1hss"), "bias_shape",
     "only allowed with bias='post_scale_bias'"),
    ("scaling-mode-only-for-fp8", dict(scaling_mode="current"), "scaling_mode", "only for FP8"),
    ("f16-o-dtype-must-be-f16", dict(o_dtype="fp8_e4m3"), "o_dtype", "is not FP8"),
    ("f16-do-dtype-must-be-f16", dict(do_dtype="fp8_e5m2"), "do_dtype", "is not FP8"),
    ("f16-dqkv-dtype-must-be-f16", dict(dqkv_dtype="fp8_e4m3"), "dqkv_dtype", "is not FP8"),
    ("inference-has-no-do-dtype", dict(is_training=False, do_dtype="bf16"), "do_dtype", "backward pass"),
    ("inference-has-no-dqkv-dtype", dict(is_training=False, dqkv_dtype="bf16"), "dqkv_dtype", "backward pass"),
    ("inference-has-no-do-format", dict(is_training=False, do_format="bshd"), "do_format", "backward pass"),
    ("inference-has-no-dqkv-layout", dict(is_training=False, dqkv_layout="bshd_bshd_bshd"), "dqkv_layout",
     "backward pass"),
]


@pytest.mark.parametrize("changes, field, text", [c[1:] for c in CROSS_FIELD], ids=[c[0] for c in CROSS_FIELD])
def test_cross_field_check_rejects_inconsistent_config(changes, field, text):
    with pytest.raises(ConfigError) as info:
        make(**changes)
    assert info.value.field == field
    assert text in str(info.value)


VALID_NEIGHBOURS = [
    dict(num_heads_q=32, num_heads_kv=1),
    dict(qkv_layout="thd_thd_thd", mask="padding_causal"),
    dict(qkv_layout="bs3hd", num_heads_kv=32),
    dict(qkv_layout="bshd_bs2hd", head_dim_v=128),
    dict(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", page_size=64, num_pages=64, is_training=False),
    dict(qkv_layout="thd_thd_thd", mask="padding", o_format="thd", dqkv_layout="thd_thd_thd"),
    dict(mask="causal", window_size=(128, 0)),
    dict(mask="causal_bottom_right", bottom_right_diagonal=True),
    dict(bias="post_scale_bias", bias_shape="1hss"),
    dict(FP8, scaling_mode="current", o_dtype="bf16", do_dtype="fp8_e5m2", dqkv_dtype="bf16"),
    dict(o_dtype="fp16", do_dtype="fp16", dqkv_dtype="fp16", do_format="sbhd", dqkv_layout="sbhd_sbhd_sbhd"),
]


@pytest.mark.parametrize("changes", VALID_NEIGHBOURS, ids=range(len(VALID_NEIGHBOURS)))
def test_consistent_neighbour_of_each_cross_field_check_is_accepted(changes):
    make(**changes)


# ----- derived values --------------------------------------------------------------------------
FORMATS = [
    ("bshd_bshd_bshd", "bshd", "bshd", {}),
    ("sbhd_sbhd_sbhd", "sbhd", "sbhd", {}),
    ("bhsd_bhsd_bhsd", "bhsd", "bhsd", {}),
    ("bs3hd", "bshd", "bshd", dict(num_heads_kv=32)),
    ("sbh3d", "sbhd", "sbhd", dict(num_heads_kv=32)),
    ("thd_t2hd", "thd", "thd", dict(mask="padding")),
    ("sbhd_bshd_bshd", "sbhd", "bshd", {}),
    ("thd_sbhd_sbhd", "thd", "sbhd", dict(mask="padding")),
    ("paged_kv_thd_bshd_bshd", "thd", "bshd", dict(mask="padding", page_size=16, num_pages=8, is_training=False)),
]


@pytest.mark.parametrize("layout, q_format, kv_format, extra", FORMATS, ids=[f[0] for f in FORMATS])
def test_formats_derive_from_the_layout(layout, q_format, kv_format, extra):
    cfg = make(qkv_layout=layout, **extra)
    assert (cfg.q_format, cfg.kv_format) == (q_format, kv_format)
    assert cfg.resolved_o_format == q_format
    if cfg.is_training:
        assert cfg.resolved_do_format == q_format
        assert cfg.resolved_dqkv_layout == layout


def test_every_layout_name_is_accepted():
    for layout, spec in LAYOUTS.items():
        extra = dict(mask="padding") if spec.ragged or spec.paged else {}
        if spec.paged:
            extra.update(page_size=16, num_pages=8, is_training=False)
        if spec.packing in ("3hd", "h3d"):
            extra.update(num_heads_kv=32)
        assert make(qkv_layout=layout, **extra).layout is spec


def test_do_format_follows_an_explicit_o_format():
    cfg = make(o_format="sbhd")
    assert cfg.resolved_do_format == "sbhd"


def test_explicit_formats_and_dqkv_layout_are_kept():
    cfg = make(o_format="sbhd", do_format="bhsd", dqkv_layout="sbhd_sbhd_sbhd")
    assert (cfg.resolved_o_format, cfg.resolved_do_format, cfg.resolved_dqkv_layout) == (
        "sbhd", "bhsd", "sbhd_sbhd_sbhd")


@pytest.mark.parametrize("mask, expected", [
    ("no_mask", False), ("padding", False), ("causal", False), ("padding_causal", False),
    ("causal_bottom_right", True), ("padding_causal_bottom_right", True),
])
def test_bottom_right_diagonal_derives_from_the_mask(mask, expected):
    assert make(mask=mask).resolved_bottom_right_diagonal is expected


def test_explicit_bottom_right_diagonal_overrides_a_top_left_mask():
    assert make(mask="causal", bottom_right_diagonal=True).resolved_bottom_right_diagonal is True


def test_attn_scale_defaults_to_inverse_sqrt_head_dim_qk():
    assert make(head_dim_qk=64, head_dim_v=128).resolved_attn_scale == pytest.approx(1 / 8)
    assert make(attn_scale=0.5).resolved_attn_scale == 0.5


def test_integer_attn_scale_and_dropout_become_floats():
    cfg = make(attn_scale=1, dropout=0)
    assert isinstance(cfg.attn_scale, float) and isinstance(cfg.dropout, float)


def test_head_dim_v_defaults_to_head_dim_qk():
    assert make(head_dim_qk=96).resolved_head_dim_v == 96
    assert make(head_dim_qk=192, head_dim_v=128).resolved_head_dim_v == 128


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_f16_output_and_gradient_dtypes_are_qkv_dtype(dtype):
    cfg = make(qkv_dtype=dtype)
    assert cfg.candidate is Backend.F16
    assert (cfg.resolved_o_dtype, cfg.resolved_do_dtype, cfg.resolved_dqkv_dtype) == (dtype, dtype, dtype)
    assert cfg.resolved_scaling_mode is None


@pytest.mark.parametrize("scaling, o_dtype", [(None, "fp8_e4m3"), ("delayed", "fp8_e4m3"),
                                              ("current", "bf16"), ("mxfp8", "bf16")])
def test_fp8_dtypes_follow_the_scaling_mode(scaling, o_dtype):
    cfg = AttnConfig(**FP8, scaling_mode=scaling)
    assert cfg.candidate is Backend.FP8
    assert cfg.resolved_scaling_mode == (scaling or "delayed")
    assert cfg.resolved_o_dtype == o_dtype
    assert cfg.resolved_do_dtype == "fp8_e5m2"
    assert cfg.resolved_dqkv_dtype == o_dtype


def test_fp8_explicit_dtypes_are_kept():
    cfg = AttnConfig(**FP8, o_dtype="fp16", do_dtype="fp8_e4m3", dqkv_dtype="fp8_e5m2")
    assert (cfg.resolved_o_dtype, cfg.resolved_do_dtype, cfg.resolved_dqkv_dtype) == ("fp16", "fp8_e4m3", "fp8_e5m2")


def test_inference_resolves_no_backward_fields():
    resolved = make(is_training=False).resolved()
    assert resolved["do_dtype"] is None and resolved["dqkv_dtype"] is None
    assert resolved["do_format"] is None and resolved["dqkv_layout"] is None


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        make().batch_size = 4  # type: ignore[misc]


# ----- (de)serialisation -----------------------------------------------------------------------
ROUND_TRIP = [
    make(),
    make(is_training=False, mask="causal", window_size=(4096, 0)),
    make(qkv_layout="thd_thd_thd", mask="padding_causal_bottom_right", o_format="thd"),
    make(qkv_layout="sbhd_bshd_bshd", o_format="bshd", do_format="sbhd", dqkv_layout="bshd_bshd_bshd"),
    make(bias="post_scale_bias", bias_shape="bhss", softmax="learnable", dropout=0.1, attn_scale=0.125),
    make(deterministic=True, cuda_graph=True, return_max_logit=True, bottom_right_diagonal=True),
    make(qkv_layout="paged_kv_sbhd_sbhd_sbhd", mask="padding", page_size=16, num_pages=512, is_training=False),
    AttnConfig(**FP8, scaling_mode="mxfp8", mask="causal"),
    make(head_dim_qk=192, head_dim_v=128, qkv_dtype="fp16"),
]


@pytest.mark.parametrize("cfg", ROUND_TRIP, ids=range(len(ROUND_TRIP)))
def test_to_dict_from_dict_round_trip(cfg):
    assert AttnConfig.from_dict(cfg.to_dict()) == cfg
    assert AttnConfig.from_dict(cfg.to_dict(include_defaults=True)) == cfg
    assert AttnConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_to_dict_omits_defaults_unless_asked():
    assert make().to_dict() == BASE
    assert len(make().to_dict(include_defaults=True)) == len(dataclasses.fields(AttnConfig))


CONFIG_FILES = sorted(ROOT.glob("configs/*.yaml")) + sorted(ROOT.glob("probes/*.yaml"))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[p.name for p in CONFIG_FILES])
def test_shipped_config_file_entries_round_trip(path):
    config_file = load_config_file(path)
    assert config_file.entries
    for entry in config_file.entries:
        cfg = entry.config
        assert AttnConfig.from_dict(cfg.to_dict()) == cfg, entry.name
        assert AttnConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))).cache_key() == cfg.cache_key()


def test_from_dict_rejects_unknown_field():
    with pytest.raises(ConfigError) as info:
        AttnConfig.from_dict(dict(BASE, head_dim=128))
    assert info.value.field == "head_dim"
    assert "unknown field" in str(info.value)


def test_from_dict_rejects_missing_required_field():
    data = dict(BASE)
    del data["seqlen_kv"]
    with pytest.raises(ConfigError) as info:
        AttnConfig.from_dict(data)
    assert info.value.field == "seqlen_kv"


def test_from_dict_rejects_non_mapping():
    with pytest.raises(ConfigError, match="must be a mapping"):
        AttnConfig.from_dict([1, 2])  # type: ignore[arg-type]


# ----- cache key -------------------------------------------------------------------------------
TRAIN = dict(BASE, mask="causal")
# One change per field; every field of AttnConfig must appear (checked below).
KEY_CHANGES = [
    ({}, dict(batch_size=3)),
    ({}, dict(num_heads_q=16)),
    ({}, dict(num_heads_kv=4)),
    ({}, dict(seqlen_q=1)),
    ({}, dict(seqlen_kv=2048)),
    ({}, dict(head_dim_qk=64)),
    ({}, dict(head_dim_v=64)),
    ({}, dict(qkv_dtype="fp16")),
    ({}, dict(o_dtype="fp16")),
    ({}, dict(do_dtype="fp16")),
    ({}, dict(dqkv_dtype="fp16")),
    ({}, dict(qkv_layout="sbhd_sbhd_sbhd")),
    ({}, dict(o_format="sbhd")),
    ({}, dict(do_format="sbhd")),
    ({}, dict(dqkv_layout="sbhd_sbhd_sbhd")),
    ({}, dict(mask="no_mask")),
    ({}, dict(bias="alibi")),
    ({}, dict(bias="post_scale_bias", bias_shape="1hss")),
    (dict(bias="post_scale_bias", bias_shape="1hss"), dict(bias_shape="bhss")),
    ({}, dict(softmax="off_by_one")),
    ({}, dict(window_size=(128, 0))),
    ({}, dict(bottom_right_diagonal=True)),
    ({}, dict(dropout=0.1)),
    ({}, dict(attn_scale=0.5)),
    ({}, dict(is_training=False)),
    ({}, dict(deterministic=True)),
    ({}, dict(cuda_graph=True)),
    ({}, dict(return_max_logit=True)),
    (dict(qkv_dtype="fp8_e4m3"), dict(scaling_mode="current")),
    (dict(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", page_size=16, num_pages=64, is_training=False),
     dict(page_size=32)),
    (dict(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", page_size=16, num_pages=64, is_training=False),
     dict(num_pages=128)),
]


@pytest.mark.parametrize("base, change", KEY_CHANGES, ids=[",".join(c) for _, c in KEY_CHANGES])
def test_cache_key_changes_with_every_graph_changing_field(base, change):
    before = AttnConfig(**{**TRAIN, **base})
    after = AttnConfig(**{**TRAIN, **base, **change})
    assert before.cache_key() != after.cache_key()


def test_key_change_table_covers_every_field():
    changed = {name for _, change in KEY_CHANGES for name in change}
    assert changed == {f.name for f in dataclasses.fields(AttnConfig)}


def test_batch_and_seqlen_keep_the_shape_class_key():
    cfg = AttnConfig(**TRAIN)
    assert cfg.replace(batch_size=7, seqlen_q=333, seqlen_kv=999).shape_class_key() == cfg.shape_class_key()
    assert cfg.replace(head_dim_qk=64).shape_class_key() != cfg.shape_class_key()


@pytest.mark.parametrize("explicit", [
    dict(head_dim_v=128), dict(o_format="bshd"), dict(do_format="bshd"), dict(dqkv_layout="bshd_bshd_bshd"),
    dict(bottom_right_diagonal=False), dict(attn_scale=1 / math.sqrt(128)), dict(o_dtype="bf16"),
    dict(do_dtype="bf16"), dict(dqkv_dtype="bf16"),
])
def test_explicit_value_equal_to_the_derived_one_is_the_same_problem(explicit):
    assert AttnConfig(**TRAIN, **explicit).cache_key() == AttnConfig(**TRAIN).cache_key()


def test_fp8_default_scaling_mode_is_delayed_for_the_key():
    assert AttnConfig(**FP8, scaling_mode="delayed").cache_key() == AttnConfig(**FP8).cache_key()


def test_cache_key_is_stable_across_processes():
    cfg = AttnConfig(**TRAIN, window_size=(128, 0), dropout=0.1)
    code = (
        "from fusedattn_select import AttnConfig; "
        f"print(AttnConfig(**{dict(TRAIN, window_size=(128, 0), dropout=0.1)!r}).cache_key())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""}, cwd=ROOT)
    assert out.stdout.strip() == cfg.cache_key()


def _json_digests(cfg: AttnConfig) -> tuple[str, str]:
    """(cache_key, shape_class_key) by their definition: digests of the resolved fields as sorted
    JSON, with and without the shape fields."""
    import hashlib

    data = cfg.resolved()
    digests = []
    for drop in ((), ("batch_size", "seqlen_q", "seqlen_kv", "num_pages")):
        for name in drop:
            data.pop(name)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        digests.append(hashlib.sha256(text.encode()).hexdigest()[:32])
    return digests[0], digests[1]


@pytest.mark.parametrize("base, change", KEY_CHANGES, ids=[",".join(c) for _, c in KEY_CHANGES])
def test_keys_are_the_digests_of_the_resolved_fields_for_every_shape_of_a_class(base, change):
    # A class's keys are made from its JSON text once; each shape's must be what json.dumps gives.
    first = AttnConfig(**{**TRAIN, **base, **change})
    shapes = [dict(batch_size=1, seqlen_q=1, seqlen_kv=1), dict(batch_size=7, seqlen_q=333, seqlen_kv=999),
              dict(batch_size=2**31 - 1, seqlen_q=1, seqlen_kv=1)]
    for shape in shapes:
        if first.qkv_layout.startswith("t3hd") or "3hd" in first.qkv_layout:
            shape = dict(shape, seqlen_kv=shape["seqlen_q"])
        cfg = first.replace(**shape)
        assert (cfg.cache_key(), cfg.shape_class_key()) == _json_digests(cfg)
    assert (first.cache_key(), first.shape_class_key()) == _json_digests(first)


def test_paged_keys_hold_num_pages():
    paged = dict(TRAIN, qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", page_size=16, num_pages=64,
                 is_training=False)
    for pages in (64, 65, 4096):
        cfg = AttnConfig(**dict(paged, num_pages=pages))
        assert (cfg.cache_key(), cfg.shape_class_key()) == _json_digests(cfg)


SHAPE_ERRORS = [
    (dict(), dict(batch_size=0), "batch_size"),
    (dict(), dict(batch_size=True), "batch_size"),
    (dict(), dict(seqlen_q=-1), "seqlen_q"),
    (dict(), dict(seqlen_kv=2.0), "seqlen_kv"),
    (dict(), dict(batch_size=2**31 - 1, seqlen_q=2**31 - 1), "batch_size*seqlen_q*num_heads_q*head_dim_qk"),
    (dict(qkv_layout="t3hd", mask="padding", num_heads_kv=32), dict(seqlen_kv=512), "qkv_layout"),
    (dict(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", page_size=16, num_pages=64, is_training=False),
     dict(num_pages=None), "page_size"),
    (dict(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", page_size=16, num_pages=64, is_training=False),
     dict(num_pages=0), "num_pages"),
]


@pytest.mark.parametrize("base, shape, field", SHAPE_ERRORS, ids=[f"{f}:{s}" for _, s, f in SHAPE_ERRORS])
def test_a_validated_class_still_checks_each_shape(base, shape, field):
    # The class's other fields were validated with the first config; the shape fields never are skipped.
    valid = AttnConfig(**{**TRAIN, **base})
    with pytest.raises(ConfigError) as info:
        valid.replace(**shape)
    assert info.value.field == field


@pytest.mark.parametrize("name, number, flag", [("num_heads_kv", 1, True), ("dropout", 0.0, False),
                                                ("deterministic", False, 0), ("window_size", (1, 0), (True, 0))])
def test_a_bool_is_not_the_number_it_equals_for_a_validated_class(name, number, flag):
    # True == 1 and False == 0.0: the class of a valid config must not vouch for the bool (or the int).
    changes = dict(num_heads_q=1) if name == "num_heads_kv" else {}
    AttnConfig(**{**TRAIN, **changes, name: number})
    with pytest.raises(ConfigError) as info:
        AttnConfig(**{**TRAIN, **changes, name: flag})
    assert info.value.field == name


def test_equal_configs_have_equal_keys_and_window_list_equals_tuple():
    assert make(window_size=[128, 0], mask="causal") == make(window_size=(128, 0), mask="causal")
    assert make(window_size=[128, 0], mask="causal").cache_key() == make(window_size=(128, 0), mask="causal").cache_key()


def test_negative_zero_dropout_is_dropout_zero_whichever_a_class_met_first():
    # A class's key text keeps the first spelling it meets: -0.0 first made every later 0.0 key differ.
    first, later = make(num_heads_q=40, dropout=-0.0), make(num_heads_q=40, dropout=0.0)
    assert math.copysign(1.0, first.dropout) == 1.0 and first.cache_key() == later.cache_key()
    assert first.cache_key() == make(num_heads_q=40, dropout=0).cache_key()


def test_probe_depth_parse_names_the_field_and_allowed_values():
    assert ProbeDepth.parse("full") is ProbeDepth.FULL
    with pytest.raises(ConfigError, match=r"depth='deep': must be 'fast', 'full' or 'verify'"):
        ProbeDepth.parse("deep", "depth")


def test_phases_of_a_config_follow_is_training():
    base = dict(batch_size=1, num_heads_q=1, num_heads_kv=1, seqlen_q=8, seqlen_kv=8, head_dim_qk=64)
    assert AttnConfig(**base, is_training=True).phases == (Phase.FORWARD, Phase.BACKWARD)
    assert AttnConfig(**base, is_training=False).phases == (Phase.FORWARD,)
