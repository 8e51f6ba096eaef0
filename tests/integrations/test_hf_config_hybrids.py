"""The config.json reader on hybrid models (softmax attention between Mamba / linear-attention layers), on
Cohere 2's sliding pattern and on Granite's attention_multiplier: which layers are attention at all, as
transformers' config classes place them, and a note for the layers that are not.

The configs are the attention keys of public model files (sources beside each); where transformers is
installed, the layer types are also checked against the config object it builds from the same dict."""

from __future__ import annotations

import json

import pytest

from fusedattn_select import cli
from fusedattn_select.integrations.transformers import configs_from_hf
from fusedattn_select.integrations.transformers.problems import ATTENTION_LAYER_TYPES, hf_config

# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (attention keys; no layer_types in the hub file).
QWEN3_NEXT = {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 2048,
              "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "num_hidden_layers": 48,
              "full_attention_interval": 4, "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}
# ai21labs/Jamba-v0.1 (attention keys): attention at layer i with i % 8 == 4.
JAMBA = {"model_type": "jamba", "architectures": ["JambaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "attn_layer_offset": 4, "attn_layer_period": 8,
         "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}
# ibm-ai-platform/Bamba-9B (attention keys).
BAMBA = {"model_type": "bamba", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "num_hidden_layers": 32, "attn_layer_indices": [9, 18, 27], "torch_dtype": "bfloat16"}
# nvidia Nemotron-H style pattern: M mamba, - MLP, * attention (one letter a layer).
NEMOTRON_H = {"model_type": "nemotron_h", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "head_dim": 128, "num_hidden_layers": 12, "hybrid_override_pattern": "M-M*-M-M*-M-",
              "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
# transformers' GraniteMoeHybrid docs example config (granite-4.0 layout): legacy layer type names.
GRANITE_HYBRID = {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"],
                  "attention_multiplier": 0.015625, "hidden_size": 512, "num_attention_heads": 8,
                  "num_key_value_heads": 8, "num_hidden_layers": 8, "max_position_embeddings": 4096,
                  "layer_types": ["mamba", "mamba", "mamba", "attention", "mamba", "mamba", "mamba", "attention"],
                  "mamba_n_heads": 8, "mamba_d_head": 128, "mamba_expand": 2, "torch_dtype": "bfloat16"}
# IBM Granite 3.x 8B's config.json (attention keys): the softmax scale is attention_multiplier.
GRANITE = {"model_type": "granite", "architectures": ["GraniteForCausalLM"], "attention_multiplier": 0.0078125,
           "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 40,
           "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
# CohereForAI/c4ai-command-r7b-12-2024 (attention keys of the file that predates layer_types): three sliding
# layers, then one global.
COHERE2 = {"model_type": "cohere2", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "num_hidden_layers": 8, "sliding_window": 4096, "sliding_window_pattern": 4,
           "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
# MiniMaxAI/MiniMax-Text-01-hf layout, cut to 16 layers: seven lightning (linear) layers, then one softmax.
MINIMAX = {"model_type": "minimax", "hidden_size": 6144, "num_attention_heads": 64, "num_key_value_heads": 8,
           "head_dim": 128, "num_hidden_layers": 16,
           "layer_types": (["linear_attention"] * 7 + ["full_attention"]) * 2, "torch_dtype": "bfloat16"}

HYBRIDS = {"qwen3_next": (QWEN3_NEXT, list(range(3, 48, 4))), "jamba": (JAMBA, [4, 12, 20, 28]),
           "bamba": (BAMBA, [9, 18, 27]), "nemotron_h": (NEMOTRON_H, [3, 8]), "granitemoehybrid": (GRANITE_HYBRID, [3, 7]),
           "minimax": (MINIMAX, [7, 15])}


def attention_layers(config: dict) -> list[int]:
    return sorted(layer for _, _, layers in configs_from_hf(config) for layer in layers)


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_a_hybrid_models_attention_layers_are_only_those_its_config_places(model_type):
    config, expected = HYBRIDS[model_type]
    assert attention_layers(config) == expected


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_the_layers_that_are_no_softmax_attention_are_named_in_a_note(model_type):
    config, expected = HYBRIDS[model_type]
    layers = len(hf_config(config).stacks[0].layer_types)
    (note,) = [note for note in hf_config(config).notes if "no softmax attention" in note]
    assert note.startswith(f"the model's layers: {layers - len(expected)} of {layers} layers are no softmax attention")


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_the_layer_types_are_those_transformers_builds_from_the_same_config(model_type):
    transformers = pytest.importorskip("transformers")
    config, _ = HYBRIDS[model_type]
    built = transformers.CONFIG_MAPPING[model_type](**{k: v for k, v in config.items() if k != "model_type"})
    theirs = [i for i, kind in enumerate(built.layer_types) if kind in ATTENTION_LAYER_TYPES]
    assert attention_layers(config) == theirs


def test_granite_hybrid_with_legacy_layer_names_is_answered_not_refused(capsys):
    code = cli.main(["why", "--hf-config", json.dumps(GRANITE_HYBRID), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code != 2
    assert [result["name"] for result in document["results"]] == ["full_attention (layers 3,7)"]


def test_granite_softmax_scale_is_its_attention_multiplier():
    assert {cfg.attn_scale for _, cfg, _ in configs_from_hf(GRANITE)} == {0.0078125}
    assert {cfg.attn_scale for _, cfg, _ in configs_from_hf(GRANITE_HYBRID)} == {0.015625}
    # GraniteConfig's default multiplier is 1.0, not 1/sqrt(head_dim).
    without = {k: v for k, v in GRANITE.items() if k != "attention_multiplier"}
    assert {cfg.attn_scale for _, cfg, _ in configs_from_hf(without)} == {1.0}


def test_cohere2_slides_three_layers_of_four_without_layer_types():
    rows = [(name, layers, cfg.window_size) for name, cfg, layers in configs_from_hf(COHERE2, seqlen=8192)]
    assert rows == [("sliding_attention", [0, 1, 2, 4, 5, 6], (4095, 0)), ("full_attention", [3, 7], (-1, -1))]


def test_a_nemotron_h_file_without_a_layer_count_is_counted_by_its_pattern():
    without = {k: v for k, v in NEMOTRON_H.items() if k != "num_hidden_layers"}
    assert attention_layers(without) == [3, 8]
    assert len(hf_config(without).stacks[0].layer_types) == 12


def test_a_bad_hybrid_key_is_an_error_naming_it(capsys):
    assert cli.main(["why", "--hf-config", json.dumps({**NEMOTRON_H, "hybrid_override_pattern": "MX*"})]) == 2
    assert "hf_config.hybrid_override_pattern" in capsys.readouterr().err
    assert cli.main(["why", "--hf-config", json.dumps({**JAMBA, "attn_layer_offset": 8})]) == 2
    assert "hf_config.attn_layer_offset" in capsys.readouterr().err
