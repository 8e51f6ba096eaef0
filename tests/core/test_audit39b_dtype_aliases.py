"""A dtype field given another spelling of a dtype (torch's name, 'half', a torch dtype object's text)
is refused, as the field takes the config names only, and the error suggests the config name."""

from __future__ import annotations

import pytest

from fusedattn_select import AttnConfig
from fusedattn_select.errors import ConfigError

BASE = dict(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=128, seqlen_kv=128, head_dim_qk=64)


@pytest.mark.parametrize("written, meant", [
    ("float16", "fp16"), ("half", "fp16"), ("torch.float16", "fp16"), ("bfloat16", "bf16"),
    ("torch.bfloat16", "bf16"), ("float8_e4m3fn", "fp8_e4m3"), ("torch.float8_e5m2", "fp8_e5m2"),
])
@pytest.mark.parametrize("field", ["qkv_dtype", "o_dtype"])
def test_a_dtype_alias_is_refused_suggesting_the_config_name(field, written, meant):
    extra = {"qkv_dtype": "fp8_e4m3"} if field == "o_dtype" else {}
    with pytest.raises(ConfigError) as caught:
        AttnConfig(**BASE, **{**extra, field: written})
    assert caught.value.field == field
    assert caught.value.allowed.startswith(f"did you mean {meant!r}? must be one of 'fp16', 'bf16'")


def test_an_auxiliary_dtype_gets_no_suggestion_of_itself():
    with pytest.raises(ConfigError) as caught:
        AttnConfig(**BASE, qkv_dtype="float32")
    assert "'fp32'" not in caught.value.allowed


def test_other_fields_keep_their_own_suggestions():
    with pytest.raises(ConfigError) as caught:
        AttnConfig(**BASE, mask="casual")
    assert caught.value.allowed.startswith("did you mean 'causal'?")

