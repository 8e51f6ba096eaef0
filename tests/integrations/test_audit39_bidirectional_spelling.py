"""use_bidirectional_attention as Gemma 4 spells it ("all" / "vision", transformers 5.24), besides true/false."""

from __future__ import annotations

import pytest

from fusedattn_select import ConfigError
from fusedattn_select.integrations.transformers import configs_from_hf

BASE = dict(model_type="gemma4_unified_text", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, num_hidden_layers=2, max_position_embeddings=128)


@pytest.mark.parametrize("value,mask", [("vision", "causal"), ("all", "no_mask"), (False, "causal"), (True, "no_mask")])
def test_use_bidirectional_attention_reads_gemma4_strings(value, mask):
    assert {cfg.mask for _, cfg, _ in configs_from_hf({**BASE, "use_bidirectional_attention": value})} == {mask}


def test_another_string_is_an_error_naming_the_allowed_values():
    with pytest.raises(ConfigError, match=r'use_bidirectional_attention=\'text\': must be true, false, "all" or "vision"'):
        configs_from_hf({**BASE, "use_bidirectional_attention": "text"})


def test_the_config_transformers_builds_with_vision_is_read():
    transformers = pytest.importorskip("transformers")
    if "gemma4_unified_text" not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no gemma4_unified_text")
    config = transformers.CONFIG_MAPPING["gemma4_unified_text"]()
    assert config.use_bidirectional_attention == "vision"
    assert {cfg.mask for _, cfg, _ in configs_from_hf(config)} == {"causal"}
