"""config.json files that leave out a key: the reader gives the default transformers' config class gives
(num_key_value_heads, head_dim), and builds layer_types as that class does (Qwen2-MoE, Qwen3-MoE with
use_sliding_window), so a file read as JSON and the same file loaded by transformers agree."""

from __future__ import annotations

import pytest

from fusedattn_select import ConfigError
from fusedattn_select.integrations.transformers import configs_from_hf
from fusedattn_select.integrations.transformers.report import layer_ranges

BASE = dict(hidden_size=1024, num_attention_heads=16, num_hidden_layers=6)


def read(model_type: str, **keys) -> list[tuple[str, str, int, int]]:
    """(layer type, layer ranges, K/V heads, head dim) of each problem of a sparse config.json."""
    return [(name, layer_ranges(layers), cfg.num_heads_kv, cfg.head_dim_qk)
            for name, cfg, layers in configs_from_hf({"model_type": model_type, **BASE, **keys})]


@pytest.mark.parametrize("model_type,kv_heads", [
    ("mistral", 8), ("mixtral", 8), ("gemma2", 4), ("gemma3_text", 4), ("gpt_oss", 8), ("llama4_text", 8),
    ("qwen3_moe", 4),
])
def test_a_file_without_num_key_value_heads_gets_transformers_default(model_type, kv_heads):
    assert {row[2] for row in read(model_type)} == {kv_heads}


def test_llama_without_num_key_value_heads_has_one_per_query_head():
    assert {row[2] for row in read("llama")} == {16}


@pytest.mark.parametrize("model_type,head_dim", [("qwen3", 128), ("gpt_oss", 64), ("llama4_text", 128)])
def test_a_file_without_head_dim_gets_transformers_default(model_type, head_dim):
    assert {row[3] for row in read(model_type, num_key_value_heads=4, hidden_size=512)} == {head_dim}


def test_a_default_kv_head_count_that_cannot_divide_is_an_error_saying_it_is_the_default():
    with pytest.raises(ConfigError, match=r"num_key_value_heads=8: must divide num_attention_heads \(6\) "
                                          r"\(transformers' default"):
        configs_from_hf({"model_type": "mistral", "hidden_size": 48, "num_attention_heads": 6, "num_hidden_layers": 2})


def test_qwen2_moe_slides_on_every_other_layer_below_max_window_layers():
    rows = read("qwen2_moe", num_key_value_heads=4, use_sliding_window=True, sliding_window=64, max_window_layers=3)
    assert [(name, layers) for name, layers, *_ in rows] == [("sliding_attention", "0,2"), ("full_attention", "1,3-5")]


def test_qwen3_moe_slides_on_every_layer_whatever_max_window_layers_says():
    rows = read("qwen3_moe", num_key_value_heads=4, use_sliding_window=True, sliding_window=64, max_window_layers=3)
    assert [(name, layers) for name, layers, *_ in rows] == [("sliding_attention", "0-5")]


@pytest.mark.parametrize("model_type", ["qwen2_moe", "qwen3_moe", "mistral", "gemma2", "gpt_oss", "qwen3"])
def test_a_sparse_file_reads_as_the_config_transformers_builds_from_it(model_type):
    transformers = pytest.importorskip("transformers")
    sparse = {"model_type": model_type, **BASE, "use_sliding_window": True, "sliding_window": 64,
              "max_window_layers": 3}
    if model_type == "qwen3":
        sparse["num_key_value_heads"] = 4  # (transformers' default, 32, does not divide 16 heads)
    built = transformers.AutoConfig.for_model(**sparse)
    assert read(model_type, **{k: v for k, v in sparse.items() if k != "model_type"}) == [
        (name, layer_ranges(layers), cfg.num_heads_kv, cfg.head_dim_qk) for name, cfg, layers in configs_from_hf(built)]
