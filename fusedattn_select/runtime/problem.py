"""The AttnConfig of a call: what attention() reads off its tensors, turned into a config by the
torch-free call_config that warmup uses too (so both ask for the same plans)."""

from __future__ import annotations

from typing import Optional

import torch

from fusedattn_select import dtypes
from fusedattn_select.config import BIAS_SHAPES, AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.plan_store.calls import call_config
from fusedattn_select.reference.semantics import alibi_slopes
from fusedattn_select.runtime.fp8 import FP8Scales
from fusedattn_select.runtime.options import CallOptions, OptionalInputs
from fusedattn_select.runtime.tensor_layouts import Formats

# Element types the fused kernels take, by torch dtype.
FUSED_DTYPES = {dtypes.torch_dtype(d.name, torch): d.name for d in dtypes.TABLE}


def bias_shape(bias: torch.Tensor, batch: int, heads: int) -> str:
    """The cuDNN bias shape name of a bias broadcastable to (B, H, Sq, Skv)."""
    b = "b" if bias.shape[0] == batch and batch > 1 else "1"
    h = "h" if bias.shape[1] == heads and heads > 1 else "1"
    name = f"{b}{h}ss"
    assert name in BIAS_SHAPES
    return name


def _precisions(dtype: torch.dtype, options: CallOptions, scales: Optional[FP8Scales]) -> tuple[str, Optional[str]]:
    """(qkv_dtype, o_dtype of an FP8 call) of the call."""
    if scales is not None:
        return FUSED_DTYPES[dtype], FUSED_DTYPES[scales.o_dtype]
    if options.fp8:
        # Quantized from fp16/bf16 (current or delayed scaling): results in the input precision, or
        # FP8 where an FP8History asks for it.
        return "fp8_e4m3", options.o_dtype or FUSED_DTYPES[dtype]
    return FUSED_DTYPES[dtype], None


def config(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, formats: Formats, options: CallOptions,
           inputs: OptionalInputs, scales: Optional[FP8Scales]) -> AttnConfig:
    """The AttnConfig of logical-BHSD q, k, v stored as `formats`; ConfigError where there is none."""
    batch, heads_q, seqlen_q, head_dim = qb.shape
    if qb.dtype not in FUSED_DTYPES:
        raise ConfigError("q", qb.dtype, "fused kernels take fp16, bf16 or float8 ("
                          + ", ".join(map(str, FUSED_DTYPES)) + ")")
    bias, alibi = inputs.bias, inputs.alibi_slopes is not None
    if bias is not None and alibi:
        raise ConfigError("alibi_slopes", "tensor", "cannot be combined with bias in one fused graph")
    qkv_dtype, o_dtype = _precisions(qb.dtype, options, scales)
    return call_config(dict(
        batch_size=batch, num_heads_q=heads_q, num_heads_kv=kb.shape[1], seqlen_q=seqlen_q,
        seqlen_kv=kb.shape[2], head_dim_qk=head_dim, head_dim_v=vb.shape[3], qkv_layout=formats.qkv_layout,
        qkv_dtype=qkv_dtype, o_dtype=o_dtype,
        bias="post_scale_bias" if bias is not None else "alibi" if alibi else "no_bias",
        bias_shape=bias_shape(bias, batch, heads_q) if bias is not None else None,
        mask=options.mask, softmax=options.softmax, window_size=tuple(options.window_size),
        dropout=float(options.dropout), attn_scale=options.attn_scale, is_training=options.training,
        deterministic=options.deterministic,
    ))


def standard_alibi(alibi: torch.Tensor, heads: int) -> bool:
    # Reading the slopes syncs with the device: done once per signature (entry creation only).
    expected = torch.tensor(alibi_slopes(heads), dtype=torch.float32)
    values = alibi.detach().float().cpu().reshape(-1, heads)
    return bool(torch.allclose(values, expected.expand_as(values), rtol=1e-5, atol=0.0))
