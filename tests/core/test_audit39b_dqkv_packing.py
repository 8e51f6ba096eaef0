"""An interleaved dqkv_layout (dQ, dK, dV in one tensor) needs the shapes an interleaved qkv_layout
needs: the probe lays the gradients out with its strides, which mean nothing when the lengths, head
counts or head dims of the interleaved tensors differ."""

from __future__ import annotations

import pytest

from fusedattn_select import AttnConfig
from fusedattn_select.errors import ConfigError

BASE = dict(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=256, seqlen_kv=256, head_dim_qk=64)

QKV_PACKED = ("bs3hd", "sb3hd", "bsh3d", "sbh3d")
KV_PACKED = ("bshd_bs2hd", "sbhd_sb2hd", "bshd_bsh2d", "sbhd_sbh2d")


@pytest.mark.parametrize("dqkv_layout", QKV_PACKED)
@pytest.mark.parametrize("change", [dict(seqlen_kv=512), dict(num_heads_kv=2), dict(head_dim_v=128)])
def test_interleaved_dqkv_needs_equal_lengths_heads_and_head_dims(dqkv_layout, change):
    with pytest.raises(ConfigError) as caught:
        AttnConfig(**{**BASE, **change}, dqkv_layout=dqkv_layout)
    assert caught.value.field == "dqkv_layout" and caught.value.value == dqkv_layout
    assert "interleaved QKV" in caught.value.allowed


@pytest.mark.parametrize("dqkv_layout", KV_PACKED)
def test_interleaved_dkv_needs_equal_head_dims(dqkv_layout):
    with pytest.raises(ConfigError) as caught:
        AttnConfig(**BASE, head_dim_v=128, dqkv_layout=dqkv_layout)
    assert caught.value.field == "dqkv_layout"
    # different lengths and head counts are fine for K and V interleaved apart from Q
    assert AttnConfig(**{**BASE, "seqlen_kv": 512, "num_heads_kv": 2}, dqkv_layout=dqkv_layout).dqkv_layout == dqkv_layout


def test_the_check_holds_for_a_new_shape_of_a_known_class():
    # the first config of a class is validated whole; a later shape by its shape fields only
    cfg = AttnConfig(**BASE, dqkv_layout="bs3hd")
    with pytest.raises(ConfigError) as caught:
        cfg.replace(seqlen_kv=512)
    assert caught.value.field == "dqkv_layout"


@pytest.mark.parametrize("dqkv_layout", QKV_PACKED + KV_PACKED)
def test_matching_shapes_are_accepted(dqkv_layout):
    assert AttnConfig(**BASE, dqkv_layout=dqkv_layout).resolved_dqkv_layout == dqkv_layout
