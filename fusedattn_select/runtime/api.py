"""attention(): run the fused attention kernels the selector chose for these tensors, or fall back.

Tensor convention
-----------------
`layout` names the order of the dims of the tensors the caller passes:

    "bshd"  (batch, seqlen, heads, head_dim)   the default (layout=None), as flash-attn and
                                               TransformerEngine's bshd take them
    "sbhd"  (seqlen, batch, heads, head_dim)   Megatron / TransformerEngine sbhd
    "bhsd"  (batch, heads, seqlen, head_dim)   torch.nn.functional.scaled_dot_product_attention

The output comes back in the same order, with head_dim_v as its last dim. What the kernels see is
the *memory* layout, read from the strides: a (B, S, H, D) tensor that is a transposed view of a
BHSD buffer runs as `bhsd_bhsd_bhsd`, with no copy. Tensors whose strides are none of BSHD, SBHD or
BHSD (for example q/k/v slices of one interleaved QKV buffer) are copied into the caller's layout
first. K and V stored in different layouts are copied to the layout of K.

What runs
---------
The problem is turned into an AttnConfig (`config_from_tensors`) and selected (`select`). When the
selection is F16 or FP8, the cuDNN graphs are obtained once per problem (forward, and backward when
training): loaded from the persistent store where an earlier process or warmup() stored them, else
built and stored (dispatch_plans.obtain_plan; `plan_loads` and `plan_builds` in dispatch_info()),
and found again by one dict lookup keyed on the tensors' shapes, strides and dtypes and the call's
options; the hot path never probes, loads or builds. When
the selection is NONE, or a graph that passed the fast probe fails to build (the selector's answer
is then flipped with `record_build_failure`), the call falls back: to torch's own SDPA where it
expresses the problem exactly, else to `reference.py`. Each fallback is logged once per problem,
with its reason, on the "fusedattn_select" logger.

Training is detected, not declared: grad mode is on and q, k, v, bias or sink requires grad. The
backward pass uses cuDNN's softmax stats saved by the forward pass and the caller's
`deterministic` flag.

Eager calls run through a torch.autograd.Function; under torch.compile the same work runs inside
the custom ops `fusedattn_select::attention_fwd` / `attention_bwd` (with fake implementations and
registered autograd), so `torch.compile(fullgraph=True)` traces a model without graph breaks.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple, Optional

import torch

from fusedattn_select.config import BIAS_SHAPES, MASKS, SOFTMAXES, AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.runtime import fp8 as fp8q
from fusedattn_select.runtime import reference as _reference
from fusedattn_select.runtime.fp8 import FP8Scales
from fusedattn_select.selection.single_flight import OncePerKey
from fusedattn_select.types import Phase, Selection

__all__ = [
    "FP8Scales",
    "LAYOUTS",
    "attention",
    "clear_plans",
    "config_from_tensors",
    "dispatch_info",
]

log = logging.getLogger("fusedattn_select")

LAYOUTS = ("bshd", "sbhd", "bhsd")
DEFAULT_LAYOUT = "bshd"
# Permutation from the caller's dim order to logical (B, H, S, D), and back.
_TO_BHSD = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}
_FROM_BHSD = {"bshd": (0, 2, 1, 3), "sbhd": (2, 0, 1, 3), "bhsd": (0, 1, 2, 3)}
_DTYPE_NAMES = {
    torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2",
}
_TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# torch's SDPA, never a patched torch.nn.functional attribute (fusedattn_select.integrations.sdpa.install()
# routes that attribute here, and the fallback must not route back).
_torch_sdpa = torch._C._nn.scaled_dot_product_attention


# ----- arguments ---------------------------------------------------------------------------------
class _Options(NamedTuple):
    """The non-tensor arguments of one call; hashable, and cheap to build on every call (the
    hot-path key starts with it)."""

    layout: str
    mask: str
    window_size: tuple[int, int]
    attn_scale: Optional[float]
    dropout: float
    softmax: str
    deterministic: bool
    fp8: bool                 # run FP8 kernels (quantizing fp16/bf16 inputs, or float8 inputs)
    o_dtype: str              # output precision name for float8 inputs ("" otherwise)
    training: bool
    bias_grad: bool           # training and the bias requires grad (dBias wanted)
    sink_grad: bool           # training and the sink requires grad (dSink wanted)
    return_lse: bool


def _tensor_or_none(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, torch.Tensor):
        raise ConfigError(name, type(value).__name__, "must be a torch.Tensor or None")


def _check_args(q: Any, k: Any, v: Any, layout: Any, mask: Any, window_size: Any, attn_scale: Any,
                dropout: Any, bias: Any, alibi_slopes: Any, softmax: Any, sink: Any, seqlens_q: Any,
                seqlens_kv: Any, deterministic: Any, fp8: Any, return_lse: Any) -> None:
    """Raise ConfigError naming the first bad argument (its value and what is allowed)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ConfigError(name, type(t).__name__, "must be a torch.Tensor")
        if t.dim() != 4:
            raise ConfigError(name, tuple(t.shape), "must be 4-D, in the order named by `layout`")
        if not t.is_floating_point():
            raise ConfigError(name, t.dtype, "must be a floating-point tensor (fp16, bf16, fp32 or float8)")
        if t.device != q.device:
            raise ConfigError(name, str(t.device), f"must be on q's device ({q.device})")
    if layout is not None and layout not in LAYOUTS:
        raise ConfigError("layout", layout, "must be None (= 'bshd') or one of " + ", ".join(map(repr, LAYOUTS)))
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ConfigError("k", (k.dtype, v.dtype), f"k and v must have q's dtype ({q.dtype})")
    perm = _TO_BHSD[layout or DEFAULT_LAYOUT]
    bq, hq, sq, dq = (q.shape[i] for i in perm)
    bk, hk, sk, dk = (k.shape[i] for i in perm)
    bv, hv, sv, dv = (v.shape[i] for i in perm)
    if bk != bq or bv != bq:
        raise ConfigError("k", tuple(k.shape), f"batch size must match q's ({bq}); v has {bv}")
    if hv != hk:
        raise ConfigError("v", tuple(v.shape), f"must have k's number of heads ({hk})")
    if sv != sk:
        raise ConfigError("v", tuple(v.shape), f"must have k's sequence length ({sk})")
    if dk != dq:
        raise ConfigError("k", tuple(k.shape), f"head dim must match q's ({dq})")
    if hk == 0 or hq % hk:
        raise ConfigError("k", tuple(k.shape), f"number of heads ({hk}) must divide q's ({hq}) for GQA/MQA")
    if min(bq, hq, sq, dq, sk, dv) <= 0:
        raise ConfigError("q", tuple(q.shape), "every dim of q, k and v must be positive")
    if mask not in MASKS:
        raise ConfigError("mask", mask, "must be one of " + ", ".join(map(repr, MASKS)))
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or any(isinstance(w, bool) or not isinstance(w, int) or w < -1 for w in window_size)):
        raise ConfigError("window_size", window_size, "must be (left, right) integers >= -1; -1 = unbounded")
    if "causal" in mask and window_size[1] not in (-1, 0):
        raise ConfigError("window_size", tuple(window_size), f"mask={mask!r} is causal: the right bound must be 0 or -1")
    if attn_scale is not None and (isinstance(attn_scale, bool) or not isinstance(attn_scale, (int, float))
                                   or not math.isfinite(attn_scale) or attn_scale <= 0):
        raise ConfigError("attn_scale", attn_scale, "must be None (1/sqrt(head_dim)) or a positive finite number")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ConfigError("dropout", dropout, "must be a number in [0, 1)")
    if softmax not in SOFTMAXES:
        raise ConfigError("softmax", softmax, "must be one of " + ", ".join(map(repr, SOFTMAXES)))
    for name, value in (("bias", bias), ("alibi_slopes", alibi_slopes), ("sink", sink),
                        ("seqlens_q", seqlens_q), ("seqlens_kv", seqlens_kv)):
        _tensor_or_none(name, value)
    if bias is not None:
        target = (bq, hq, sq, sk)
        if bias.dim() != 4 or any(n not in (1, t) for n, t in zip(bias.shape, target)):
            raise ConfigError("bias", tuple(bias.shape), f"must be 4-D and broadcastable to (B, Hq, Sq, Skv)={target}")
        if not bias.is_floating_point():
            raise ConfigError("bias", bias.dtype, "must be a floating-point tensor")
    if alibi_slopes is not None and tuple(alibi_slopes.shape) not in ((hq,), (bq, hq)):
        raise ConfigError("alibi_slopes", tuple(alibi_slopes.shape), f"must have shape ({hq},) or ({bq}, {hq})")
    if softmax == "learnable":
        if sink is None or tuple(sink.shape) != (hq,) or not sink.is_floating_point():
            raise ConfigError("sink", None if sink is None else tuple(sink.shape),
                              f"softmax='learnable' needs a floating-point sink of shape ({hq},)")
    elif sink is not None:
        raise ConfigError("sink", tuple(sink.shape), f"only allowed with softmax='learnable' (softmax={softmax!r})")
    padded = mask.startswith("padding")
    for name, lens in (("seqlens_q", seqlens_q), ("seqlens_kv", seqlens_kv)):
        if padded and lens is None:
            raise ConfigError(name, None, f"required with mask={mask!r}")
        if not padded and lens is not None:
            raise ConfigError(name, "tensor", f"only allowed with a padding mask (mask={mask!r})")
        if lens is not None and (tuple(lens.shape) != (bq,) or lens.is_floating_point() or lens.dtype == torch.bool):
            raise ConfigError(name, (tuple(lens.shape), lens.dtype), f"must be an integer tensor of shape ({bq},)")
    for name, value in (("deterministic", deterministic), ("return_lse", return_lse)):
        if not isinstance(value, bool):
            raise ConfigError(name, value, "must be True or False")
    if fp8p := fp8q.is_fp8_dtype(q.dtype):
        if not isinstance(fp8, FP8Scales):
            raise ConfigError("fp8", fp8, "float8 q/k/v need fp8=FP8Scales(descale_q, descale_k, descale_v)")
        if fp8.o_dtype not in _DTYPE_NAMES or fp8q.is_fp8_dtype(fp8.o_dtype):
            raise ConfigError("fp8.o_dtype", fp8.o_dtype, "must be torch.float16 or torch.bfloat16")
    elif isinstance(fp8, FP8Scales):
        raise ConfigError("fp8", "FP8Scales", f"descale factors are for float8 inputs; q is {q.dtype} (use fp8=True)")
    elif not isinstance(fp8, bool):
        raise ConfigError("fp8", fp8, "must be True, False, or FP8Scales for float8 inputs")
    elif fp8 and q.dtype not in (torch.float16, torch.bfloat16):
        raise ConfigError("fp8", True, f"quantizes fp16/bf16 inputs; q is {q.dtype}")
    if fp8p and any(t.requires_grad for t in (q, k, v)) and torch.is_grad_enabled():
        raise ConfigError("q", q.dtype, "float8 inputs are for inference; they cannot require grad")


def _is_training(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor],
                 sink: Optional[torch.Tensor]) -> bool:
    if not torch.is_grad_enabled():
        return False
    return (q.requires_grad or k.requires_grad or v.requires_grad
            or (bias is not None and bias.requires_grad) or (sink is not None and sink.requires_grad))


# ----- layouts -----------------------------------------------------------------------------------
def _canonical_strides(fmt: str, b: int, h: int, s: int, d: int) -> tuple[int, int, int, int]:
    """Element strides of the logical BHSD view of a dense tensor stored as `fmt`."""
    if fmt == "bshd":
        return (s * h * d, d, h * d, 1)
    if fmt == "sbhd":
        return (h * d, d, b * h * d, 1)
    return (h * s * d, s * d, d, 1)


def physical_format(t_bhsd: torch.Tensor, prefer: str = DEFAULT_LAYOUT) -> Optional[str]:
    """The memory layout ("bshd", "sbhd", "bhsd") of a logical-BHSD view, or None if none fits.

    Strides of size-1 dims address nothing, so they are ignored; where that leaves several
    layouts possible, `prefer` (the caller's layout) wins.
    """
    shape = tuple(t_bhsd.shape)
    strides = t_bhsd.stride()
    for fmt in (prefer,) + tuple(f for f in LAYOUTS if f != prefer):
        canon = _canonical_strides(fmt, *shape)
        if all(n == 1 or s == c for n, s, c in zip(shape, strides, canon)):
            return fmt
    return None


def _bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.permute(_TO_BHSD[layout])


def _to_format(t_bhsd: torch.Tensor, fmt: str) -> torch.Tensor:
    """A copy of a logical-BHSD tensor stored densely as `fmt` (still a logical-BHSD view)."""
    out = torch.empty_strided(tuple(t_bhsd.shape), _canonical_strides(fmt, *t_bhsd.shape),
                              dtype=t_bhsd.dtype, device=t_bhsd.device)
    return out.copy_(t_bhsd)


@dataclass(frozen=True)
class _Formats:
    """Memory layouts the kernels run with, and which inputs must be copied to get there."""

    q: str
    kv: str
    copy_q: bool
    copy_k: bool
    copy_v: bool

    @property
    def qkv_layout(self) -> str:
        return f"{self.q}_{self.kv}_{self.kv}"


# TransformerEngine layout names for separate Q, K, V tensors (config.LAYOUTS has these).
_SEPARATE_LAYOUTS = frozenset({
    "bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd", "sbhd_bshd_bshd", "bshd_sbhd_sbhd",
})


def _formats(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, layout: str) -> _Formats:
    fq, fk, fv = (physical_format(t, layout) for t in (qb, kb, vb))
    q_fmt = fq or layout
    kv_fmt = fk or fv or q_fmt
    if f"{q_fmt}_{kv_fmt}_{kv_fmt}" not in _SEPARATE_LAYOUTS:
        kv_fmt = q_fmt
    return _Formats(q_fmt, kv_fmt, fq != q_fmt, fk != kv_fmt, fv != kv_fmt)


# ----- AttnConfig from tensors -------------------------------------------------------------------
def _bias_shape(bias: torch.Tensor, batch: int, heads: int) -> str:
    """The cuDNN bias shape name of a bias broadcastable to (B, H, Sq, Skv)."""
    b = "b" if bias.shape[0] == batch and batch > 1 else "1"
    h = "h" if bias.shape[1] == heads and heads > 1 else "1"
    name = f"{b}{h}ss"
    assert name in BIAS_SHAPES
    return name


def config_from_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout: Optional[str] = None,
                        mask: str = "no_mask", window_size: tuple[int, int] = (-1, -1),
                        attn_scale: Optional[float] = None, dropout: float = 0.0,
                        bias: Optional[torch.Tensor] = None, alibi_slopes: Optional[torch.Tensor] = None,
                        softmax: str = "vanilla", sink: Optional[torch.Tensor] = None,
                        seqlens_q: Optional[torch.Tensor] = None, seqlens_kv: Optional[torch.Tensor] = None,
                        deterministic: bool = False, fp8: Any = False, is_training: Optional[bool] = None
                        ) -> AttnConfig:
    """The AttnConfig attention() selects for these tensors and options (arguments as attention()).

    `is_training` None means detected (grad mode on and an input requires grad). Raises ConfigError
    for bad arguments, and for problems AttnConfig cannot describe (float32 inputs, bias together
    with ALiBi slopes).
    """
    _check_args(q, k, v, layout, mask, window_size, attn_scale, dropout, bias, alibi_slopes, softmax,
                sink, seqlens_q, seqlens_kv, deterministic, fp8, False)
    layout = layout or DEFAULT_LAYOUT
    qb, kb, vb = _bhsd(q, layout), _bhsd(k, layout), _bhsd(v, layout)
    training = _is_training(q, k, v, bias, sink) if is_training is None else bool(is_training)
    return _config(qb, kb, vb, _formats(qb, kb, vb, layout), mask=mask, window_size=tuple(window_size),
                   attn_scale=attn_scale, dropout=float(dropout), bias=bias, alibi=alibi_slopes is not None,
                   softmax=softmax, deterministic=deterministic, fp8=fp8, training=training)


def _config(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, formats: _Formats, *, mask: str,
            window_size: tuple[int, int], attn_scale: Optional[float], dropout: float,
            bias: Optional[torch.Tensor], alibi: bool, softmax: str, deterministic: bool, fp8: Any,
            training: bool) -> AttnConfig:
    batch, heads_q, seqlen_q, head_dim = qb.shape
    if qb.dtype not in _DTYPE_NAMES:
        raise ConfigError("q", qb.dtype, "fused kernels take fp16, bf16 or float8 (" + ", ".join(map(str, _DTYPE_NAMES)) + ")")
    if bias is not None and alibi:
        raise ConfigError("alibi_slopes", "tensor", "cannot be combined with bias in one fused graph")
    fields: dict[str, Any] = {}
    if isinstance(fp8, FP8Scales):
        fields.update(qkv_dtype=_DTYPE_NAMES[qb.dtype], o_dtype=_DTYPE_NAMES[fp8.o_dtype], scaling_mode="current")
    elif fp8:
        # Quantized from fp16/bf16 with current (per-call) scaling; results in the input precision.
        fields.update(qkv_dtype="fp8_e4m3", o_dtype=_DTYPE_NAMES[qb.dtype], scaling_mode="current")
    else:
        fields.update(qkv_dtype=_DTYPE_NAMES[qb.dtype])
    if bias is not None:
        fields.update(bias="post_scale_bias", bias_shape=_bias_shape(bias, batch, heads_q))
    elif alibi:
        fields.update(bias="alibi")
    return AttnConfig(
        batch_size=batch, num_heads_q=heads_q, num_heads_kv=kb.shape[1], seqlen_q=seqlen_q,
        seqlen_kv=kb.shape[2], head_dim_qk=head_dim,
        head_dim_v=vb.shape[3] if vb.shape[3] != head_dim else None,
        qkv_layout=formats.qkv_layout, mask=mask, softmax=softmax, window_size=window_size,
        dropout=dropout, attn_scale=None if attn_scale is None else float(attn_scale),
        is_training=training, deterministic=deterministic, **fields,
    )


# ----- fallback ----------------------------------------------------------------------------------
FALLBACK_TORCH = "torch_sdpa"
FALLBACK_REFERENCE = "reference"


def _torch_sdpa_blocker(opts: _Options, qb: torch.Tensor, kb: torch.Tensor, has_alibi: bool,
                        has_bias: bool) -> str:
    """Why torch's SDPA cannot compute this problem exactly ("" when it can)."""
    if opts.softmax != "vanilla":
        return f"softmax={opts.softmax!r}"
    if opts.window_size != (-1, -1):
        return f"window_size={opts.window_size}"
    if has_alibi:
        return "alibi_slopes"
    if opts.mask.startswith("padding"):
        return f"mask={opts.mask!r}"
    if opts.return_lse:
        return "return_lse=True"
    if opts.mask == "causal_bottom_right" and qb.shape[2] > kb.shape[2]:
        return "bottom-right causal mask with seqlen_q > seqlen_kv (fully masked rows)"
    return ""


def _fallback_kind(opts: _Options, qb: torch.Tensor, kb: torch.Tensor, has_alibi: bool, has_bias: bool) -> str:
    return FALLBACK_REFERENCE if _torch_sdpa_blocker(opts, qb, kb, has_alibi, has_bias) else FALLBACK_TORCH


def _dequantized(t: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (t.float() * descale.float().reshape(1)).to(dtype)


def _fallback_forward(kind: str, opts: _Options, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      bias: Optional[torch.Tensor], alibi: Optional[torch.Tensor], sink: Optional[torch.Tensor],
                      seqlens_q: Optional[torch.Tensor], seqlens_kv: Optional[torch.Tensor],
                      scales: Optional[FP8Scales]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(out in the caller's layout, lse or None), differentiable with plain autograd."""
    qb, kb, vb = _bhsd(q, opts.layout), _bhsd(k, opts.layout), _bhsd(v, opts.layout)
    if scales is not None:  # float8 inputs: compute in the requested output precision
        qb = _dequantized(qb, scales.descale_q, scales.o_dtype)
        kb = _dequantized(kb, scales.descale_k, scales.o_dtype)
        vb = _dequantized(vb, scales.descale_v, scales.o_dtype)
    lse = None
    if kind == FALLBACK_TORCH:
        attn_mask = bias
        is_causal = False
        if opts.mask == "causal" and bias is None:
            is_causal = True
        elif opts.mask in ("causal", "causal_bottom_right"):
            sq, skv = qb.shape[2], kb.shape[2]
            offset = skv - sq if opts.mask == "causal_bottom_right" else 0
            rows = torch.arange(sq, device=qb.device).view(sq, 1)
            cols = torch.arange(skv, device=qb.device).view(1, skv)
            allowed = cols <= rows + offset
            attn_mask = allowed if bias is None else bias.masked_fill(~allowed, float("-inf"))
        if isinstance(attn_mask, torch.Tensor) and attn_mask.is_floating_point() and attn_mask.dtype != qb.dtype:
            attn_mask = attn_mask.to(qb.dtype)
        out = _torch_sdpa(qb, kb, vb, attn_mask=attn_mask, dropout_p=opts.dropout, is_causal=is_causal,
                          scale=opts.attn_scale, enable_gqa=qb.shape[1] != kb.shape[1])
    else:
        result = _reference.reference_attention(
            qb, kb, vb, mask=opts.mask, window_size=opts.window_size, attn_scale=opts.attn_scale,
            dropout=opts.dropout, bias=bias, alibi_slopes=alibi, softmax=opts.softmax, sink=sink,
            seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, return_lse=opts.return_lse,
        )
        out, lse = result if opts.return_lse else (result, None)
    return out.permute(_FROM_BHSD[opts.layout]), lse


# ----- the hot-path cache ------------------------------------------------------------------------
@dataclass(eq=False)
class _Entry:
    """Everything one call signature needs, decided once: the config, the selection, the plans."""

    opts: _Options
    reason: str = ""                     # "" = fused; else why this signature falls back
    fallback: str = FALLBACK_TORCH
    cfg: Optional[AttnConfig] = None
    selection: Optional[Selection] = None
    formats: Optional[_Formats] = None
    forward: Any = None                  # dispatch_plans.Plan
    backward: Any = None
    rng: Optional[torch.Tensor] = None   # per-entry [seed, offset] counter for dropout
    rng_step: int = 0
    logged: bool = False

    @property
    def fused(self) -> bool:
        return not self.reason


_entries: OncePerKey[_Entry] = OncePerKey()
_counters = {"calls": 0, "fused_calls": 0, "fallback_calls": 0, "entries_built": 0}


def _signature(t: Optional[torch.Tensor]) -> Any:
    if t is None:
        return None
    return (tuple(t.shape), t.stride(), t.dtype)


_capturing = torch._C._cuda_isCurrentStreamCapturing if hasattr(torch._C, "_cuda_isCurrentStreamCapturing") \
    else torch.cuda.is_current_stream_capturing


def _key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: _Options, bias: Any, alibi: Any,
         sink: Any, seqlens_q: Any, seqlens_kv: Any) -> tuple:
    capturing = q.is_cuda and _capturing()
    return (
        opts, q.device, q.dtype, tuple(q.shape), q.stride(), tuple(k.shape), k.stride(), tuple(v.shape), v.stride(),
        _signature(bias), None if alibi is None else tuple(alibi.shape), _signature(sink),
        None if seqlens_q is None else (seqlens_q.dtype, seqlens_q.device),
        None if seqlens_kv is None else (seqlens_kv.dtype, seqlens_kv.device),
        capturing,
    )


def _entry(key: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: _Options,
           bias: Optional[torch.Tensor], alibi: Optional[torch.Tensor], sink: Optional[torch.Tensor],
           scales: Optional[FP8Scales]) -> _Entry:
    # One decision per key: concurrent first calls of one signature wait for a single build, while
    # different signatures build at the same time.
    entry, built = _entries.get_or_build(key, lambda: _new_entry(key, q, k, v, opts, bias, alibi, sink, scales))
    if built:
        _counters["entries_built"] += 1
    return entry


def _new_entry(key: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: _Options,
               bias: Optional[torch.Tensor], alibi: Optional[torch.Tensor], sink: Optional[torch.Tensor],
               scales: Optional[FP8Scales]) -> _Entry:
    """Decide a new call signature: derive the config, select, build the plans (slow, once)."""
    qb, kb, vb = _bhsd(q, opts.layout), _bhsd(k, opts.layout), _bhsd(v, opts.layout)
    entry = _Entry(opts, fallback=_fallback_kind(opts, qb, kb, alibi is not None, bias is not None))
    formats = _formats(qb, kb, vb, opts.layout)
    entry.formats = formats
    try:
        cfg = _config(qb, kb, vb, formats, mask=opts.mask, window_size=opts.window_size,
                      attn_scale=opts.attn_scale, dropout=opts.dropout, bias=bias, alibi=alibi is not None,
                      softmax=opts.softmax, deterministic=opts.deterministic,
                      fp8=scales if scales is not None else opts.fp8, training=opts.training)
    except ConfigError as err:
        entry.reason = f"no fused config: {err}"
        return entry
    entry.cfg = cfg
    capturing = key[-1]
    if capturing:
        return _captured_entry(key, entry, q, k, v, opts, bias, alibi, sink, scales)
    from fusedattn_select.selection.selector import default_selector

    selector = default_selector()
    selection = selector.select(cfg)
    if cfg.is_fp8 and not selection.selected:
        # FP8 outputs in fp16/bf16 need a newer GPU (cuDNN: Blackwell); try FP8 outputs before
        # giving up, and report every recipe's reasons if none is supported.
        messages = [f"{_recipe(cfg)}: {selection.message}"]
        for changes in fp8q.output_recipes(cfg, opts.training)[1:]:
            candidate = cfg.replace(**changes)
            selection = selector.select(candidate)
            if selection.selected:
                cfg = entry.cfg = candidate
                break
            messages.append(f"{_recipe(candidate)}: {selection.message}")
        else:
            entry.selection = selection
            entry.reason = "; ".join(messages)
            return entry
    entry.selection = selection
    if not selection.selected:
        entry.reason = selection.message
        return entry
    if not q.is_cuda:
        entry.reason = f"{selection.backend.value} was selected ({selection.engine}) but the tensors are on {q.device}"
        return entry
    if alibi is not None and not _standard_alibi(alibi, cfg.num_heads_q):
        entry.reason = "alibi_slopes differ from the fixed ALiBi slopes cuDNN computes (2^(-8i/H))"
        return entry
    _build_plans(entry, selector, q.device)
    if entry.fused and opts.bias_grad and not entry.backward.has("dBias"):
        entry.reason = f"cuDNN's backward graph for bias_shape={cfg.bias_shape!r} has no dBias output"
    if entry.fused and opts.dropout > 0:
        entry.rng = torch.tensor([int(torch.randint(2 ** 62, (1,))), 0], dtype=torch.int64, device=q.device)
        entry.rng_step = math.prod(qb.shape[:3]) * kb.shape[2]
    return entry


def _recipe(cfg: AttnConfig) -> str:
    """The output precisions of an FP8 config, for reasons ("O bf16" / "O fp8_e4m3, dQKV fp8_e5m2")."""
    text = f"O {cfg.resolved_o_dtype}"
    if cfg.is_training:
        text += f", dO {cfg.resolved_do_dtype}, dQKV {cfg.resolved_dqkv_dtype}"
    return text


def _build_plans(entry: _Entry, selector: Any, device: torch.device) -> None:
    from fusedattn_select.runtime import plans as dispatch_plans
    cfg = entry.cfg
    backend = entry.selection.backend
    phases = (Phase.FORWARD, Phase.BACKWARD) if cfg.is_training else (Phase.FORWARD,)
    # An inference call that wants the log-sum-exp needs the forward graph that writes the softmax
    # stats, which is the training forward graph.
    forward_cfg = cfg.replace(is_training=True) if entry.opts.return_lse and not cfg.is_training else cfg
    try:
        plans = [dispatch_plans.obtain_plan(forward_cfg if phase is Phase.FORWARD else cfg, backend, phase, device,
                                            selector=selector)
                 for phase in phases]
    except dispatch_plans.PlanBuildError as err:
        selector.record_build_failure(cfg, err.verdict)
        entry.reason = err.verdict.reason()
        return
    except ImportError as err:  # cudnn-frontend missing while a snapshot engine selected a backend
        entry.reason = f"{backend.value} was selected but cuDNN cannot run here: {err}"
        return
    entry.forward = plans[0]
    entry.backward = plans[1] if len(plans) > 1 else None


def _captured_entry(key: tuple, entry: _Entry, q, k, v, opts, bias, alibi, sink, scales) -> _Entry:
    """A call under CUDA-graph capture: reuse the eager twin's plans (building while capturing is
    unsafe), unless a known-bug rule rejects the problem for cuda_graph=True."""
    from fusedattn_select.selection.rules import apply_rules, phases_for
    from fusedattn_select.selection.selector import default_selector

    cfg = entry.cfg.replace(cuda_graph=True)
    selector = default_selector()
    for phase in phases_for(cfg):
        verdict = apply_rules(cfg, selector.fingerprint, phase)
        if verdict is not None:
            entry.reason = verdict.reason()
            return entry
    twin = _entries.get(key[:-1] + (False,))
    if twin is None:
        entry.reason = ("not warmed up: the first call of a problem builds cuDNN graphs, which cannot "
                        "happen during CUDA-graph capture; run it once before capturing")
        return entry
    return twin


def _cudnn_alibi_slopes(heads: int) -> list[float]:
    """The slopes cuDNN's ALiBi mask uses: the geometric sequence of Press et al. (2022)."""
    closest = 2 ** math.floor(math.log2(heads))
    base = 2.0 ** (-8.0 / closest)
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest < heads:
        extra = 2.0 ** (-4.0 / closest)
        slopes += [extra ** (2 * i + 1) for i in range(heads - closest)]
    return slopes


def _standard_alibi(alibi: torch.Tensor, heads: int) -> bool:
    # Reading the slopes syncs with the device: done once per signature (entry creation only).
    expected = torch.tensor(_cudnn_alibi_slopes(heads), dtype=torch.float32)
    values = alibi.detach().float().cpu().reshape(-1, heads)
    return bool(torch.allclose(values, expected.expand_as(values), rtol=1e-5, atol=0.0))


def _log_fallback(entry: _Entry) -> None:
    if entry.logged:
        return
    entry.logged = True
    where = "torch SDPA" if entry.fallback == FALLBACK_TORCH else "reference.py"
    problem = entry.cfg.cache_key() if entry.cfg is not None else "unconfigurable problem"
    log.warning("fusedattn_select: attention() falls back to %s for %s: %s", where, problem, entry.reason)


# ----- the fused path ----------------------------------------------------------------------------
def _common_feeds(plan: Any, feeds: dict, entry: _Entry, bias: Optional[torch.Tensor],
                  alibi: Optional[torch.Tensor], sink: Optional[torch.Tensor],
                  seqlens_q: Optional[torch.Tensor], seqlens_kv: Optional[torch.Tensor],
                  rng: Optional[torch.Tensor]) -> None:
    if bias is not None:
        feeds["bias"] = plan.conform("bias", bias.detach())
    if alibi is not None and plan.has("alibi_slopes"):
        feeds["alibi_slopes"] = plan.conform("alibi_slopes", alibi.detach().float())
    if plan.has("sink_token"):
        if sink is not None:
            feeds["sink_token"] = plan.conform("sink_token", sink.detach().float())
        else:  # off_by_one: an extra logit of 0 in every row
            feeds["sink_token"] = plan.constant("sink_token", 0.0)
    if seqlens_q is not None:
        feeds["seq_len_q"] = plan.conform("seq_len_q", seqlens_q)
        feeds["seq_len_kv"] = plan.conform("seq_len_kv", seqlens_kv)
    if rng is not None and plan.has("seed"):
        feeds["seed"] = plan.conform("seed", rng[0:1])
        feeds["offset"] = plan.conform("offset", rng[1:2])


def _empty(device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=device)


def _fused_forward(entry: _Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   bias: Optional[torch.Tensor], alibi: Optional[torch.Tensor], sink: Optional[torch.Tensor],
                   seqlens_q: Optional[torch.Tensor], seqlens_kv: Optional[torch.Tensor],
                   scales: Optional[FP8Scales]) -> tuple:
    """(out in the caller's layout, stats or None, rng or None, fp8 saved (q8, k8, v8, state) or None)."""
    opts, plan = entry.opts, entry.forward
    # No detach: this runs without grad mode (inference, or inside the autograd Function / op).
    qb, kb, vb = _bhsd(q, opts.layout), _bhsd(k, opts.layout), _bhsd(v, opts.layout)
    saved_fp8 = None
    if opts.fp8:
        if scales is not None:
            q8, k8, v8, state = qb, kb, vb, fp8q.explicit_state(scales, vb)
        else:
            q8, k8, v8, state = fp8q.quantize_qkv(qb, kb, vb, plan.specs["q"].dtype)
        feeds = fp8q.forward_feeds(plan, q8, k8, v8, state)
        saved_fp8 = (q8, k8, v8, state)
    else:
        feeds = {"q": plan.conform("q", qb), "k": plan.conform("k", kb), "v": plan.conform("v", vb)}
    rng = None
    if entry.rng is not None:
        rng = entry.rng.clone()
        entry.rng[1:].add_(entry.rng_step)  # on the device: capture-safe, a fresh mask per replay
    _common_feeds(plan, feeds, entry, bias, alibi, sink, seqlens_q, seqlens_kv, rng)
    outs = plan.execute(feeds)
    o = outs["o"]
    if saved_fp8 is not None and fp8q.is_fp8_dtype(o.dtype):
        o = fp8q.dequantize(o, fp8q.at(saved_fp8[3], "descale_o"), scales.o_dtype if scales is not None else q.dtype)
    return o.permute(_FROM_BHSD[opts.layout]), outs.get("stats"), rng, saved_fp8


def _fused_backward(entry: _Entry, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    out: torch.Tensor, stats: torch.Tensor, bias: Optional[torch.Tensor],
                    alibi: Optional[torch.Tensor], sink: Optional[torch.Tensor],
                    seqlens_q: Optional[torch.Tensor], seqlens_kv: Optional[torch.Tensor],
                    rng: Optional[torch.Tensor], saved_fp8: Optional[tuple]) -> tuple:
    """(dq, dk, dv, dbias or None, dsink or None), gradients in the shapes of the inputs."""
    opts, plan = entry.opts, entry.backward
    layout = opts.layout
    gb = _bhsd(grad_out, layout)
    ob = _bhsd(out, layout)
    descales: dict = {}
    if saved_fp8 is not None:
        q8, k8, v8, state = saved_fp8
        feeds, descales = fp8q.backward_feeds(plan, entry.cfg, q8, k8, v8, state, ob, gb, stats)
    else:
        feeds = {
            "q": plan.conform("q", _bhsd(q, layout).detach()), "k": plan.conform("k", _bhsd(k, layout).detach()),
            "v": plan.conform("v", _bhsd(v, layout).detach()), "o": plan.conform("o", ob),
            "dO": plan.conform("dO", gb), "stats": plan.conform("stats", stats),
        }
    _common_feeds(plan, feeds, entry, bias, alibi, sink, seqlens_q, seqlens_kv, rng)
    outs = plan.execute(feeds)
    back = _FROM_BHSD[layout]
    grads = []
    for name, like in (("dQ", q), ("dK", k), ("dV", v)):
        grad = outs[name]
        if name in descales:  # FP8 gradients (Hopper): dequantized to the input precision
            grad = fp8q.dequantize(grad, descales[name], like.dtype)
        elif grad.dtype != like.dtype:
            grad = grad.to(like.dtype)
        grads.append(grad.permute(back))
    dq, dk, dv = grads
    dbias = dsink = None
    if opts.bias_grad and "dBias" in outs:
        dbias = outs["dBias"].sum_to_size(bias.shape).to(bias.dtype)
    if opts.sink_grad and "dSink_token" in outs:
        dsink = outs["dSink_token"].reshape(sink.shape).to(sink.dtype)
    return dq, dk, dv, dbias, dsink


class _FusedAttention(torch.autograd.Function):
    """Eager autograd for the fused path: cuDNN forward (saving its softmax stats) and backward."""

    @staticmethod
    def forward(ctx, entry, scales, q, k, v, bias, alibi, sink, seqlens_q, seqlens_kv):
        out, stats, rng, saved_fp8 = _fused_forward(entry, q, k, v, bias, alibi, sink, seqlens_q, seqlens_kv, scales)
        ctx.entry = entry
        ctx.saved_fp8 = saved_fp8
        ctx.save_for_backward(q, k, v, out, stats, bias, alibi, sink, seqlens_q, seqlens_kv, rng)
        lse = stats if stats is not None else _empty(q.device)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, stats, bias, alibi, sink, seqlens_q, seqlens_kv, rng = ctx.saved_tensors
        dq, dk, dv, dbias, dsink = _fused_backward(ctx.entry, grad_out, q, k, v, out, stats, bias, alibi, sink,
                                                   seqlens_q, seqlens_kv, rng, ctx.saved_fp8)
        return None, None, dq, dk, dv, dbias, None, dsink, None, None


# ----- attention() -------------------------------------------------------------------------------
def _options_and_key(q, k, v, layout, mask, window_size, attn_scale, dropout, bias, alibi_slopes, softmax, sink,
                     seqlens_q, seqlens_kv, deterministic, scales, fp8, return_lse) -> tuple[_Options, tuple]:
    training = _is_training(q, k, v, bias, sink)
    opts = _Options(
        layout or DEFAULT_LAYOUT, mask, tuple(window_size), attn_scale, float(dropout), softmax, deterministic,
        scales is not None or fp8 is True, "" if scales is None else str(scales.o_dtype), training,
        training and bias is not None and bias.requires_grad, training and sink is not None and sink.requires_grad,
        return_lse,
    )
    return opts, _key(q, k, v, opts, bias, alibi_slopes, sink, seqlens_q, seqlens_kv)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout: Optional[str] = None,
              mask: str = "no_mask", window_size: tuple[int, int] = (-1, -1), attn_scale: Optional[float] = None,
              dropout: float = 0.0, bias: Optional[torch.Tensor] = None, alibi_slopes: Optional[torch.Tensor] = None,
              softmax: str = "vanilla", sink: Optional[torch.Tensor] = None,
              seqlens_q: Optional[torch.Tensor] = None, seqlens_kv: Optional[torch.Tensor] = None,
              deterministic: bool = False, fp8: Any = False, return_lse: bool = False) -> Any:
    """Scaled-dot-product attention on the fused backend the selector picks, or a logged fallback.

    Args:
        q, k, v: 4-D tensors in the dim order named by `layout` (default "bshd": (B, S, H, D)).
            fp16/bf16 run fused; float32 always falls back; float8 needs `fp8=FP8Scales(...)`.
            K/V may have fewer heads than Q (GQA/MQA) and another head dim for V.
        layout: "bshd", "sbhd" or "bhsd" (dim order of q, k, v and of the output); None = "bshd".
        mask: "no_mask", "causal", "causal_bottom_right", "padding", "padding_causal",
            "padding_causal_bottom_right" (TransformerEngine names; see reference.py for meaning).
        window_size: sliding window (left, right), -1 = unbounded.
        attn_scale: score scale; None = 1/sqrt(head_dim).
        dropout: probability of dropping an attention weight (applied whenever > 0).
        bias: additive post-scale bias broadcastable to (B, Hq, Sq, Skv); trainable if it requires grad.
        alibi_slopes: ALiBi slopes (Hq,) or (B, Hq); fused only with cuDNN's standard slopes.
        softmax: "vanilla", "off_by_one" or "learnable" (with `sink`, one logit per q head).
        seqlens_q, seqlens_kv: actual lengths (B,) for the padding masks.
        deterministic: ask cuDNN for a deterministic backward pass.
        fp8: True quantizes fp16/bf16 inputs per tensor (current scaling) and runs cuDNN's FP8
            kernels, returning the input precision; `FP8Scales(...)` for float8 inputs.
        return_lse: also return the softmax log-sum-exp (B, Hq, Sq, 1) float32 (not differentiable).

    Returns:
        The output in the caller's layout (..., head_dim_v), and the lse if `return_lse`.
    """
    if torch.compiler.is_compiling():
        return _compiled_attention(q, k, v, layout, mask, window_size, attn_scale, dropout, bias, alibi_slopes,
                                   softmax, sink, seqlens_q, seqlens_kv, deterministic, fp8, return_lse)
    scales = fp8 if isinstance(fp8, FP8Scales) else None
    entry = None
    # The hot-path key holds every value validation looks at, so validation runs once per call
    # signature; arguments whose type alone is wrong never make a key.
    if type(deterministic) is bool and type(return_lse) is bool and (type(fp8) is bool or scales is not None):
        try:
            opts, key = _options_and_key(q, k, v, layout, mask, window_size, attn_scale, dropout, bias,
                                         alibi_slopes, softmax, sink, seqlens_q, seqlens_kv, deterministic,
                                         scales, fp8, return_lse)
            entry = _entries.get(key)
        except (TypeError, AttributeError, ValueError):
            entry = None
    if entry is None:
        _check_args(q, k, v, layout, mask, window_size, attn_scale, dropout, bias, alibi_slopes, softmax,
                    sink, seqlens_q, seqlens_kv, deterministic, fp8, return_lse)
        opts, key = _options_and_key(q, k, v, layout, mask, window_size, attn_scale, dropout, bias, alibi_slopes,
                                     softmax, sink, seqlens_q, seqlens_kv, deterministic, scales, fp8, return_lse)
        entry = _entry(key, q, k, v, opts, bias, alibi_slopes, sink, scales)
    _counters["calls"] += 1
    if not entry.fused:
        _counters["fallback_calls"] += 1
        _log_fallback(entry)
        out, lse = _fallback_forward(entry.fallback, entry.opts, q, k, v, bias, alibi_slopes, sink,
                                     seqlens_q, seqlens_kv, scales)
        return (out, lse) if return_lse else out
    _counters["fused_calls"] += 1
    if entry.opts.training:
        out, lse = _FusedAttention.apply(entry, scales, q, k, v, bias, alibi_slopes, sink, seqlens_q, seqlens_kv)
    else:
        out, lse, _, _ = _fused_forward(entry, q, k, v, bias, alibi_slopes, sink, seqlens_q, seqlens_kv, scales)
    return (out, lse) if return_lse else out


# ----- torch.compile: custom ops -----------------------------------------------------------------
def _compiled_attention(q, k, v, layout, mask, window_size, attn_scale, dropout, bias, alibi_slopes, softmax,
                        sink, seqlens_q, seqlens_kv, deterministic, fp8, return_lse):
    _check_args(q, k, v, layout, mask, window_size, attn_scale, dropout, bias, alibi_slopes, softmax,
                sink, seqlens_q, seqlens_kv, deterministic, fp8, return_lse)
    scales = fp8 if isinstance(fp8, FP8Scales) else None
    training = _is_training(q, k, v, bias, sink)
    outputs = torch.ops.fusedattn_select.attention_fwd(
        q, k, v, bias, alibi_slopes, sink, seqlens_q, seqlens_kv,
        None if scales is None else scales.descale_q, None if scales is None else scales.descale_k,
        None if scales is None else scales.descale_v,
        layout or DEFAULT_LAYOUT, mask, int(window_size[0]), int(window_size[1]),
        None if attn_scale is None else float(attn_scale), float(dropout), softmax, deterministic,
        bool(fp8 is True or scales is not None), "" if scales is None else _DTYPE_NAMES[scales.o_dtype],
        training, training and bias is not None and bias.requires_grad,
        training and sink is not None and sink.requires_grad, return_lse,
    )
    return (outputs[0], outputs[1]) if return_lse else outputs[0]


def _op_options(layout: str, mask: str, window_left: int, window_right: int, attn_scale: Optional[float],
                dropout: float, softmax: str, deterministic: bool, fp8: bool, o_dtype: str, training: bool,
                bias_grad: bool, sink_grad: bool, return_lse: bool) -> _Options:
    o_dtype_name = str(_TORCH_DTYPES[o_dtype]) if o_dtype else ""
    return _Options(layout, mask, (window_left, window_right), attn_scale, dropout, softmax, deterministic, fp8,
                    o_dtype_name, training, bias_grad, sink_grad, return_lse)


def _op_scales(descale_q, descale_k, descale_v, o_dtype: str) -> Optional[FP8Scales]:
    if descale_q is None:
        return None
    return FP8Scales(descale_q, descale_k, descale_v, _TORCH_DTYPES[o_dtype])


def _meta(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if t is None:
        return None
    return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="meta")


def _matching(t: Optional[torch.Tensor], spec: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` with exactly the shape, strides and dtype of `spec` (what the fake implementation promised
    the compiler): `t` itself when it already has them, else a copy; an empty tensor when t is None."""
    if t is None:  # a placeholder (e.g. stats of a fallback): zeros, so outputs are deterministic
        return torch.empty_strided(tuple(spec.shape), spec.stride(), dtype=spec.dtype, device=device).zero_()
    if t.stride() == spec.stride() and t.dtype == spec.dtype and tuple(t.shape) == tuple(spec.shape):
        return t
    out = torch.empty_strided(tuple(spec.shape), spec.stride(), dtype=spec.dtype, device=device)
    return out.copy_(t)


@torch.library.custom_op("fusedattn_select::attention_fwd", mutates_args=())
def _attention_fwd_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor],
    alibi_slopes: Optional[torch.Tensor], sink: Optional[torch.Tensor], seqlens_q: Optional[torch.Tensor],
    seqlens_kv: Optional[torch.Tensor], descale_q: Optional[torch.Tensor], descale_k: Optional[torch.Tensor],
    descale_v: Optional[torch.Tensor], layout: str, mask: str, window_left: int, window_right: int,
    attn_scale: Optional[float], dropout: float, softmax: str, deterministic: bool, fp8: bool, o_dtype: str,
    training: bool, bias_grad: bool, sink_grad: bool, return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    opts = _op_options(layout, mask, window_left, window_right, attn_scale, dropout, softmax, deterministic, fp8,
                       o_dtype, training, bias_grad, sink_grad, return_lse)
    scales = _op_scales(descale_q, descale_k, descale_v, o_dtype)
    key = _key(q, k, v, opts, bias, alibi_slopes, sink, seqlens_q, seqlens_kv)
    entry = _entry(key, q, k, v, opts, bias, alibi_slopes, sink, scales)
    specs = _attention_fwd_fake(*(_meta(t) if isinstance(t, torch.Tensor) else t for t in (
        q, k, v, bias, alibi_slopes, sink, seqlens_q, seqlens_kv, descale_q, descale_k, descale_v, layout, mask,
        window_left, window_right, attn_scale, dropout, softmax, deterministic, fp8, o_dtype, training, bias_grad,
        sink_grad, return_lse)))
    saved: tuple = (None,) * 4
    _counters["calls"] += 1
    _counters["fused_calls" if entry.fused else "fallback_calls"] += 1
    if entry.fused:
        out, stats, rng, fp8_saved = _fused_forward(entry, q, k, v, bias, alibi_slopes, sink, seqlens_q,
                                                    seqlens_kv, scales)
        if fp8_saved is not None and specs[3].numel():
            # float8 travels as its bytes: opcheck and AOT autograd treat op outputs as numbers
            # (multiplying, promoting) and float8 supports few such ops.
            saved = tuple(t.view(torch.uint8) for t in fp8_saved[:3]) + (fp8_saved[3],)
    else:
        _log_fallback(entry)
        with torch.no_grad():
            out, stats = _fallback_forward(entry.fallback, opts, q, k, v, bias, alibi_slopes, sink, seqlens_q,
                                           seqlens_kv, scales)
        rng = None
    if stats is None or not specs[1].numel():
        stats = None
    if rng is None or not specs[2].numel():
        rng = None
    values = (out, stats, rng) + tuple(saved)
    return tuple(_matching(t, spec, q.device) for t, spec in zip(values, specs))


@_attention_fwd_op.register_fake
def _attention_fwd_fake(q, k, v, bias, alibi_slopes, sink, seqlens_q, seqlens_kv, descale_q, descale_k, descale_v,
                        layout, mask, window_left, window_right, attn_scale, dropout, softmax, deterministic, fp8,
                        o_dtype, training, bias_grad, sink_grad, return_lse):
    qb, vb = _bhsd(q, layout), _bhsd(v, layout)
    b, h, s, _ = qb.shape
    dims = (b, h, s, vb.shape[3])
    fmt = physical_format(qb, layout) or layout
    out_dtype = _TORCH_DTYPES[o_dtype] if o_dtype else q.dtype
    out = torch.empty_strided(dims, _canonical_strides(fmt, *dims), dtype=out_dtype, device=q.device
                              ).permute(_FROM_BHSD[layout])
    stats_shape = (b, h, s, 1) if training or return_lse else (0,)
    stats = torch.empty(stats_shape, dtype=torch.float32, device=q.device)
    rng = torch.empty(2 if training and dropout > 0 else 0, dtype=torch.int64, device=q.device)
    if fp8 and training and descale_q is None:
        saved = tuple(torch.empty_like(_bhsd(t, layout), dtype=torch.uint8) for t in (q, k, v))
        state = torch.empty(len(fp8q.STATE), dtype=torch.float32, device=q.device)
    else:
        saved = tuple(torch.empty(0, dtype=torch.uint8, device=q.device) for _ in range(3))
        state = torch.empty(0, dtype=torch.float32, device=q.device)
    return (out, stats, rng) + saved + (state,)


@torch.library.custom_op("fusedattn_select::attention_bwd", mutates_args=())
def _attention_bwd_op(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    stats: torch.Tensor, bias: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
    sink: Optional[torch.Tensor], seqlens_q: Optional[torch.Tensor], seqlens_kv: Optional[torch.Tensor],
    rng: torch.Tensor, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, fp8_state: torch.Tensor,
    layout: str, mask: str, window_left: int, window_right: int, attn_scale: Optional[float], dropout: float,
    softmax: str, deterministic: bool, fp8: bool, o_dtype: str, bias_grad: bool, sink_grad: bool,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    opts = _op_options(layout, mask, window_left, window_right, attn_scale, dropout, softmax, deterministic, fp8,
                       o_dtype, True, bias_grad, sink_grad, return_lse)
    key = _key(q, k, v, opts, bias, alibi_slopes, sink, seqlens_q, seqlens_kv)
    entry = _entry(key, q, k, v, opts, bias, alibi_slopes, sink, None)
    specs = _attention_bwd_fake(*(_meta(t) if isinstance(t, torch.Tensor) else t for t in (
        grad_out, q, k, v, out, stats, bias, alibi_slopes, sink, seqlens_q, seqlens_kv, rng, q8, k8, v8, fp8_state,
        layout, mask, window_left, window_right, attn_scale, dropout, softmax, deterministic, fp8, o_dtype,
        bias_grad, sink_grad, return_lse)))
    if entry.fused:
        saved = None
        if fp8 and fp8_state.numel():
            fp8_dtype = entry.backward.specs["q"].dtype
            saved = (q8.view(fp8_dtype), k8.view(fp8_dtype), v8.view(fp8_dtype), fp8_state)
        grads = _fused_backward(entry, grad_out, q, k, v, out, stats, bias, alibi_slopes, sink, seqlens_q,
                                seqlens_kv, rng if rng.numel() else None, saved)
    else:
        grads = _fallback_backward(entry, grad_out, q, k, v, bias, alibi_slopes, sink, seqlens_q, seqlens_kv)
    return tuple(_matching(g, spec, q.device) for g, spec in zip(grads, specs))


@_attention_bwd_op.register_fake
def _attention_bwd_fake(grad_out, q, k, v, out, stats, bias, alibi_slopes, sink, seqlens_q, seqlens_kv, rng, q8,
                        k8, v8, fp8_state, layout, mask, window_left, window_right, attn_scale, dropout, softmax,
                        deterministic, fp8, o_dtype, bias_grad, sink_grad, return_lse):
    dbias = torch.empty_like(bias) if bias is not None and bias_grad else torch.empty(0, dtype=q.dtype, device=q.device)
    dsink = torch.empty_like(sink) if sink is not None and sink_grad else torch.empty(0, dtype=q.dtype, device=q.device)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias, dsink


@contextlib.contextmanager
def _autograd_inside_op() -> Iterator[None]:
    """Re-enable autograd inside a custom op's implementation.

    torch runs a custom op's implementation with the autograd dispatch keys excluded (thread-local,
    torch._C._AutoDispatchBelowAutograd), so a recomputation there records no graph. The fallback's
    backward differentiates its recomputed forward, so it lifts the exclusion for that block.
    """
    keys = (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.ADInplaceOrView)
    previous = [torch._C._dispatch_tls_is_dispatch_key_excluded(key) for key in keys]
    for key in keys:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    try:
        with torch.enable_grad():
            yield
    finally:
        for key, excluded in zip(keys, previous):
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, excluded)


def _fallback_backward(entry: _Entry, grad_out, q, k, v, bias, alibi, sink, seqlens_q, seqlens_kv) -> tuple:
    """Gradients of the fallback by recomputing its forward under autograd (compiled path only;
    eager fallbacks differentiate the forward they ran). With dropout > 0 the recomputation draws
    a new dropout mask, so compiled training with dropout should run fused."""
    opts = entry.opts
    leaves = [t.detach().requires_grad_(needs) if t is not None else None for t, needs in (
        (q, True), (k, True), (v, True), (bias, opts.bias_grad), (sink, opts.sink_grad))]
    with _autograd_inside_op():
        out, _ = _fallback_forward(entry.fallback, opts, leaves[0], leaves[1], leaves[2], leaves[3], alibi, leaves[4],
                                   seqlens_q, seqlens_kv, None)
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True))
    return tuple(next(grads) if t is not None and t.requires_grad else None for t in leaves)


def _setup_context(ctx, inputs, output):
    (q, k, v, bias, alibi_slopes, sink, seqlens_q, seqlens_kv, descale_q, descale_k, descale_v, layout, mask,
     window_left, window_right, attn_scale, dropout, softmax, deterministic, fp8, o_dtype, training, bias_grad,
     sink_grad, return_lse) = inputs
    out, stats, rng, q8, k8, v8, fp8_state = output
    ctx.save_for_backward(q, k, v, out, stats, bias, alibi_slopes, sink, seqlens_q, seqlens_kv, rng, q8, k8, v8,
                          fp8_state)
    ctx.options = (layout, mask, window_left, window_right, attn_scale, dropout, softmax, deterministic, fp8,
                   o_dtype, bias_grad, sink_grad, return_lse)


def _backward(ctx, grad_out, *_unused_grads):
    q, k, v, out, stats, bias, alibi_slopes, sink, seqlens_q, seqlens_kv, rng, q8, k8, v8, fp8_state = ctx.saved_tensors
    dq, dk, dv, dbias, dsink = torch.ops.fusedattn_select.attention_bwd(
        grad_out.contiguous() if grad_out.stride()[-1] != 1 else grad_out, q, k, v, out, stats, bias, alibi_slopes,
        sink, seqlens_q, seqlens_kv, rng, q8, k8, v8, fp8_state, *ctx.options,
    )
    bias_grad, sink_grad = ctx.options[-3], ctx.options[-2]
    return (dq, dk, dv, dbias if bias_grad else None, None, dsink if sink_grad else None) + (None,) * 19


torch.library.register_autograd("fusedattn_select::attention_fwd", _backward, setup_context=_setup_context)


# ----- introspection -----------------------------------------------------------------------------
def dispatch_info() -> dict[str, Any]:
    """Counters of the dispatch layer: calls, fused/fallback calls, signatures decided, plan builds
    (graph builds done by dispatch; 0 new ones after warm-up means the hot path built nothing) and
    plan loads (serialized plans deserialized from the persistent store instead of built;
    plan_load_failures counts stored plans that did not load and were rebuilt)."""
    info: dict[str, Any] = dict(_counters)
    info["signatures"] = len(_entries)
    info["fallback_signatures"] = sum(1 for e in _entries.values() if not e.fused)
    try:
        from fusedattn_select.runtime.plans import plan_stats, workspace_bytes

        stats = plan_stats()
        info.update(plan_builds=stats["builds"], plan_build_ms=stats["build_ms"],
                    plan_build_failures=stats["build_failures"], plan_loads=stats["loads"],
                    plan_load_ms=stats["load_ms"], plan_load_failures=stats["load_failures"],
                    executes=stats["executes"], workspace_bytes=workspace_bytes())
    except ImportError:  # pragma: no cover - dispatch_plans imports only torch
        pass
    return info


def clear_plans() -> None:
    """Forget every decided call signature and this process's plans (the next call of each decides
    again, loading its plans from the persistent store where they are stored)."""
    _entries.clear()
    for name in _counters:
        _counters[name] = 0
    try:
        from fusedattn_select.runtime.plans import clear_plan_cache
    except ImportError:  # pragma: no cover - dispatch_plans imports only torch
        return
    clear_plan_cache()
