"""The config.json reader on the readings issue 36 found wrong, and on the families whose real
config files the corpus (test_hf_config_corpus.py) lacks: configs written here with each
family's keys. Runs without transformers."""

from __future__ import annotations

import json

import pytest

from fusedattn_select import cli
from fusedattn_select.errors import ConfigError
from fusedattn_select.integrations.transformers import configs_from_hf
from fusedattn_select.integrations.transformers.problems import hf_config

GPT2 = {"model_type": "gpt2", "n_head": 12, "n_layer": 12, "n_embd": 768, "n_positions": 1024, "attn_pdrop": 0.1,
        "torch_dtype": "float32"}
LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "num_hidden_layers": 4, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
GEMMA2 = {"model_type": "gemma2", "hidden_size": 3584, "num_attention_heads": 16, "num_key_value_heads": 8,
          "head_dim": 256, "num_hidden_layers": 4, "max_position_embeddings": 8192, "sliding_window": 4096,
          "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0}


def shapes(config, **kwargs):
    return [(name, layers, cfg.num_heads_q, cfg.num_heads_kv, cfg.head_dim_qk, cfg.resolved_head_dim_v, cfg.mask,
             cfg.seqlen_q, cfg.seqlen_kv, cfg.window_size) for name, cfg, layers in configs_from_hf(config, **kwargs)]


def test_gpt2_keys_are_read_with_its_attention_dropout():
    ((name, cfg, layers),) = configs_from_hf(GPT2)
    assert (name, layers[-1], cfg.num_heads_q, cfg.head_dim_qk, cfg.seqlen_q, cfg.mask) == (
        "full_attention", 11, 12, 64, 1024, "causal")
    assert cfg.dropout == 0.1 and cfg.qkv_dtype == "bf16"


def test_float32_checkpoints_are_read_at_bf16_with_a_note():
    assert hf_config(GPT2).notes == ("hf_config.torch_dtype='float32' is not a dtype fused attention runs "
                                     "(fp16, bf16, fp8); the problems are read at bf16 unless you set qkv_dtype",)
    assert configs_from_hf({**LLAMA, "torch_dtype": "float16"})[0][1].qkv_dtype == "fp16"
    assert configs_from_hf({**LLAMA, "dtype": "float16"}, dtype="bf16")[0][1].qkv_dtype == "bf16"


def test_gemma2_alternates_sliding_and_full_layers_without_layer_types():
    rows = shapes(GEMMA2, seqlen=8192)
    assert [(name, layers, window) for name, layers, *_, window in rows] == [
        ("sliding_attention+softcap", [0, 2], (4095, 0)), ("full_attention+softcap", [1, 3], (-1, -1))]


def test_qwen2_slides_from_max_window_layers_only_when_switched_on():
    qwen = {**LLAMA, "model_type": "qwen2", "sliding_window": 1024, "max_window_layers": 2}
    assert [r[0] for r in shapes(qwen)] == ["full_attention"]
    assert [(r[0], r[1]) for r in shapes({**qwen, "use_sliding_window": True})] == [
        ("full_attention", [0, 1]), ("sliding_attention", [2, 3])]


def test_vit_is_a_bidirectional_encoder_over_patches_and_a_class_token():
    vit = {"model_type": "vit", "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12,
           "image_size": 224, "patch_size": 16}
    assert shapes(vit)[0][:9] == ("encoder", list(range(12)), 12, 12, 64, 64, "no_mask", 197, 197)
    assert shapes({**vit, "image_size": 384})[0][7] == 577


def test_clip_reads_its_causal_text_tower_and_its_vision_tower():
    clip = {"model_type": "clip", "text_config": {"hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 12,
                                                  "max_position_embeddings": 77},
            "vision_config": {"hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12,
                              "image_size": 224, "patch_size": 32}}
    rows = shapes(clip)
    assert [(r[0], r[6], r[7]) for r in rows] == [("full_attention", "causal", 77), ("vision", "no_mask", 50)]


def test_whisper_describes_encoder_decoder_and_cross_attention():
    whisper = {"model_type": "whisper", "d_model": 384, "encoder_attention_heads": 6, "decoder_attention_heads": 6,
               "encoder_layers": 4, "decoder_layers": 4, "max_source_positions": 1500, "max_target_positions": 448}
    rows = shapes(whisper)
    assert [(r[0], r[6], r[7], r[8]) for r in rows] == [
        ("encoder", "no_mask", 1500, 1500), ("decoder", "causal", 448, 448), ("cross_attention", "no_mask", 448, 1500)]


def test_an_encoder_decoder_model_not_described_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"hf_config.is_encoder_decoder=True: model_type 'bart'.*t5, mt5, whisper"):
        configs_from_hf({**LLAMA, "model_type": "bart", "is_encoder_decoder": True})


def test_bloom_is_alibi_and_falcon_multi_query_has_one_kv_head():
    bloom = {"model_type": "bloom", "n_head": 16, "n_layer": 2, "hidden_size": 1024}
    assert configs_from_hf(bloom)[0][1].bias == "alibi"
    falcon = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 2,
              "multi_query": True}
    assert shapes(falcon)[0][2:5] == (71, 1, 64)
    assert shapes({**falcon, "new_decoder_architecture": True, "num_kv_heads": 71})[0][3] == 71


def test_falcon_files_from_before_transformers_read_their_rwconfig_keys():
    # The keys of tiiuae/falcon-40b's original config.json (SOURCES.md, fourth search): 8 K/V groups.
    falcon_40b = {"model_type": "RefinedWeb", "hidden_size": 8192, "n_head": 128, "n_head_kv": 8, "n_layer": 60,
                  "alibi": False, "attention_dropout": 0.0, "torch_dtype": "bfloat16"}
    assert shapes(falcon_40b)[0][1:7] == (list(range(60)), 128, 8, 64, 64, "causal")
    # falcon-7b's original (RefinedWebModel) says multi_query: one K/V head.
    falcon_7b = {"model_type": "RefinedWebModel", "hidden_size": 4544, "n_head": 71, "n_layer": 32, "multi_query": True}
    assert shapes(falcon_7b)[0][2:5] == (71, 1, 64)


def test_gemma3_reads_its_text_config_layer_pattern_and_query_pre_attn_scalar():
    # google/gemma-3-27b-it's attention keys (SOURCES.md, fourth search), 12 of its 62 layers.
    text = {"model_type": "gemma3_text", "hidden_size": 5376, "num_attention_heads": 32, "num_key_value_heads": 16,
            "head_dim": 128, "num_hidden_layers": 12, "max_position_embeddings": 131072, "sliding_window": 1024,
            "sliding_window_pattern": 6, "query_pre_attn_scalar": 168, "attn_logit_softcapping": None,
            "rope_local_base_freq": 10000.0, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}
    gemma3 = {"model_type": "gemma3", "dtype": "bfloat16", "text_config": text,
              "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "num_attention_heads": 16,
                                "num_hidden_layers": 27, "image_size": 896, "patch_size": 14}}
    sliding = [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    rows = shapes(gemma3)
    assert [(r[0], r[1], r[9]) for r in rows] == [("sliding_attention", sliding, (1023, 0)),
                                                 ("full_attention", [5, 11], (-1, -1))]
    assert rows[0][2:9] == (32, 16, 128, 128, "causal", 4096, 4096)
    assert {(round(c.attn_scale, 6), c.qkv_dtype) for _, c, _ in configs_from_hf(gemma3)} == {(0.077152, "bf16")}
    assert hf_config(gemma3).notes == (
        "vision_config (model_type 'siglip_vision_model') is not described: only the text model is read",)
    # layer_types, as transformers 4.56 writes it, gives the same layers.
    types = ["full_attention" if i in (5, 11) else "sliding_attention" for i in range(12)]
    assert shapes({**gemma3, "text_config": {**text, "layer_types": types, "sliding_window_pattern": None}}) == rows


def test_deepseek_v2_lite_mla_head_dims():
    lite = {**LLAMA, "model_type": "deepseek_v2", "num_attention_heads": 16, "num_key_value_heads": 16,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    assert shapes(lite)[0][4:6] == (192, 128)


@pytest.mark.parametrize("change,error", [
    ({"hidden_size": 4100}, "hf_config.hidden_size=4100: must be a positive multiple of num_attention_heads (32)"),
    ({"num_hidden_layers": 0}, "hf_config.num_hidden_layers=0: must be a positive integer"),
    ({"num_attention_heads": 0}, "hf_config.num_attention_heads=0: must be a positive integer"),
    ({"sliding_window": 0, "model_type": "mistral"}, "hf_config.sliding_window=0: must be a positive integer, or null"),
    ({"num_key_value_heads": 5}, "hf_config.num_key_value_heads=5: must divide num_attention_heads (32)"),
])
def test_a_field_that_cannot_be_read_right_is_exit_2_naming_the_key(change, error, capsys):
    code = cli.main(["why", "--target", "h100", "--hf-config", json.dumps({**LLAMA, **change})])
    assert code == 2 and capsys.readouterr().err.startswith(f"error: {error}")


def test_set_of_one_length_changes_that_length_only_and_says_so(capsys):
    code = cli.main(["why", "--target", "h100", "--hf-config", json.dumps(LLAMA), "--set", "seqlen_kv=2048",
                     "--set", "head_dim_qk=64", "--json"])
    document = json.loads(capsys.readouterr().out)
    config = document["results"][0]["selection"]["config"]
    assert code in (0, 1, 3)
    assert (config["seqlen_q"], config["seqlen_kv"], config["head_dim_qk"], config["head_dim_v"]) == (4096, 2048, 64, 128)
    assert any("seqlen_q stays 4096" in note for note in document["notes"])
    assert any("head_dim_v stays 128" in note for note in document["notes"])


@pytest.mark.parametrize("seqlen", [0, False, True, -1, "8", 8.0, 2**31])
def test_seqlen_that_is_no_length_is_an_error_naming_seqlen(seqlen):
    # 0 and False used to be read as "no length given" (each stack's own: 4096 here); the others
    # were errors naming seqlen_q, a field the caller never wrote.
    from fusedattn_select.integrations.transformers import layer_problems, report

    for function in (configs_from_hf, layer_problems, report):
        with pytest.raises(ConfigError) as raised:
            function(LLAMA, seqlen=seqlen)
        assert raised.value.field == "seqlen" and "positive integer" in raised.value.allowed


def test_seqlen_none_is_each_stacks_own_length_and_a_length_is_kept():
    assert {cfg.seqlen_q for _, cfg, _ in configs_from_hf(LLAMA, seqlen=None)} == {4096}
    assert {(cfg.seqlen_q, cfg.seqlen_kv) for _, cfg, _ in configs_from_hf(LLAMA, seqlen=1)} == {(1, 1)}
