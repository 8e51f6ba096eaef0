"""MXFP8 graphs describe the problem asked: the backward reads O (and the 16-bit dO) in the type the
forward wrote O in, and a paged KV cache's block scales are page pools like its containers.

sdpa_mxfp8_backward takes O as `o_f16` and the incoming gradient as `dO_f16` besides its
quantized copies. Both were declared bf16 whatever the config said, so a config with
`o_dtype: fp16` (the forward writes an fp16 O) was probed, cached and planned with a backward
that reads a bf16 O: another problem than the one asked ("never substitute a fixed value ...
o_dtype = q_dtype", design.md section 3).

Needs cudnn-frontend importable (the graph description only: no GPU, no libcudnn call).
"""

from __future__ import annotations

import pytest

from fusedattn_select.config import AttnConfig
from fusedattn_select.types import Backend, Phase

cudnn = pytest.importorskip("cudnn")

from fusedattn_select.probing.cudnn.graphs import describe_graph  # noqa: E402


def mxfp8(**changes) -> AttnConfig:
    base = dict(batch_size=2, num_heads_q=4, num_heads_kv=4, seqlen_q=128, seqlen_kv=128, head_dim_qk=128,
                qkv_dtype="fp8_e4m3", scaling_mode="mxfp8")
    return AttnConfig(**{**base, **changes})


@pytest.mark.parametrize("o_dtype", ["fp16", "bf16"])
def test_the_backward_reads_o_in_the_type_the_forward_wrote(o_dtype):
    cfg = mxfp8(o_dtype=o_dtype)
    forward = describe_graph(cfg, Backend.FP8, Phase.FORWARD)
    backward = describe_graph(cfg, Backend.FP8, Phase.BACKWARD)
    assert backward.operation == "sdpa_mxfp8_backward"
    written = forward.data_types["o"]
    assert written == getattr(cudnn.data_type, {"fp16": "HALF", "bf16": "BFLOAT16"}[o_dtype])
    assert backward.data_types["o_f16"] == written
    assert backward.data_types["dO_f16"] == written


def test_a_paged_cache_has_block_scales_of_its_page_pools():
    """sdpa_mxfp8 with page tables reads descale_k / descale_v as pools matching the K / V page
    containers (num_pages, H_kv, page_size, ...), not as (batch, H_kv, seqlen_kv, ...) tensors."""
    cfg = mxfp8(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", page_size=128, num_pages=8,
                seqlen_kv=256, is_training=False)
    built = describe_graph(cfg, Backend.FP8, Phase.FORWARD)
    for name in ("k", "v"):
        container = built.dims_strides[name][0]
        scales = built.dims_strides[f"descale_{name}"][0]
        assert container[:2] == scales[:2] == (8, cfg.num_heads_kv), (name, container, scales)
    assert built.dims_strides["descale_k"][0][2] == 128  # page_size rows, one scale per 32 of D
    assert built.dims_strides["descale_v"][0][2] == 4    # page_size / 32, one scale per 32 rows
