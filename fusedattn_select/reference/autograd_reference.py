"""The float32 reference attention differentiated by autograd: the test oracle and the slow fallback.

Written with plain torch operations on the whole (B, Hq, Sq, Skv) score block, so the backward pass is
whatever autograd derives from the forward; no custom kernels are involved. What it computes (masks,
diagonal, window, ALiBi, padding, softmax variants, soft-capping) is `semantics.py`'s; this module
checks the arguments and runs that pipeline once over every row.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from fusedattn_select.reference import semantics
from fusedattn_select.reference.semantics import MASK_TYPES, SOFTMAX_TYPES

__all__ = [
    "ReferenceOptions",
    "ReferenceTensors",
    "attend",
    "reference_attention",
    "reference_attention_bshd",
]

_FLOAT_COMPUTE_DTYPES = (torch.float32, torch.float64)


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (B, H, S, D) in logical BHSD order, got shape {tuple(t.shape)}"
            )
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if t.device != q.device:
            raise ValueError(
                f"{name} is on {t.device} but q is on {q.device}; all inputs must share a device"
            )
    bq, hq, sq, dq = q.shape
    bk, hk, sk, dk = k.shape
    bv, hv, sv, dv = v.shape
    if not (bq == bk == bv):
        raise ValueError(f"batch size mismatch: q has {bq}, k has {bk}, v has {bv}")
    if hk != hv:
        raise ValueError(f"head count mismatch: k has {hk} heads, v has {hv}")
    if sk != sv:
        raise ValueError(f"sequence length mismatch: k has {sk}, v has {sv}")
    if dq != dk:
        raise ValueError(f"head dim mismatch: q has Dqk={dq}, k has {dk}")
    if hk == 0 or hq % hk != 0:
        raise ValueError(
            f"q heads ({hq}) must be a multiple of k/v heads ({hk}) for GQA/MQA"
        )
    if dq == 0 or dv == 0:
        raise ValueError("q, k and v must have non-zero head dims (dim 3)")


def _check_seqlens(
    name: str, seqlens: Optional[torch.Tensor], batch: int, max_len: int, device: torch.device, mask: str
) -> Optional[torch.Tensor]:
    padded = mask.startswith("padding")
    if seqlens is None:
        if padded:
            raise ValueError(f"{name} is required for mask={mask!r}")
        return None
    if not padded:
        raise ValueError(
            f"{name} is only accepted with padding masks "
            f"('padding', 'padding_causal', 'padding_causal_bottom_right'), got mask={mask!r}"
        )
    if not isinstance(seqlens, torch.Tensor):
        raise ValueError(f"{name} must be an integer torch.Tensor of shape ({batch},)")
    if seqlens.is_floating_point() or seqlens.is_complex() or seqlens.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype, got {seqlens.dtype}")
    if tuple(seqlens.shape) != (batch,):
        raise ValueError(f"{name} must have shape ({batch},), got {tuple(seqlens.shape)}")
    seqlens = seqlens.to(device=device, dtype=torch.long)
    if batch and (int(seqlens.min()) < 0 or int(seqlens.max()) > max_len):
        raise ValueError(f"{name} values must lie in [0, {max_len}], got {seqlens.tolist()}")
    return seqlens


def _check_window(window_size: Sequence[int]) -> Tuple[int, int]:
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or not all(_is_int(w) for w in window_size)
    ):
        raise ValueError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    left, right = int(window_size[0]), int(window_size[1])
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= 0, or -1 for unbounded, got {window_size!r}")
    return left, right


def _resolve_bottom_right(mask: str, bottom_right_diagonal: Optional[bool]) -> bool:
    from_mask = mask.endswith("bottom_right")
    if bottom_right_diagonal is None:
        return from_mask
    if not isinstance(bottom_right_diagonal, bool):
        raise ValueError(
            f"bottom_right_diagonal must be None, True or False, got {bottom_right_diagonal!r}"
        )
    if "causal" in mask and bottom_right_diagonal != from_mask:
        raise ValueError(
            f"bottom_right_diagonal={bottom_right_diagonal} conflicts with mask={mask!r}; "
            "a causal mask fixes the diagonal (use the *_bottom_right mask for bottom-right alignment)"
        )
    return bottom_right_diagonal


@dataclass(frozen=True, eq=False)
class ReferenceOptions:
    """The non-tensor arguments of the reference (checked by ``attend``).

    mask: one of ``MASK_TYPES`` (TransformerEngine names).
    window_size: sliding window ``(left, right)``; ``-1`` means unbounded.
    attn_scale: score multiplier; ``None`` means ``1 / sqrt(Dqk)``.
    dropout: probability in [0, 1) of dropping an attention probability.
    softmax: one of ``SOFTMAX_TYPES``.
    bottom_right_diagonal: diagonal alignment for the window and ALiBi; ``None`` derives it from
        ``mask`` (True for ``*_bottom_right``, else False).  With a causal mask it must agree.
    softcap: if set (> 0), scores become ``softcap * tanh(scores / softcap)``.
    generator: random generator for dropout.
    return_lse: also return the log-sum-exp of each row.
    compute_dtype: internal precision, ``torch.float32`` or ``torch.float64``; ``None`` means float64
        for float64 inputs, else float32 (a float64 caller, gradcheck say, keeps its precision).
    """

    mask: str = "no_mask"
    window_size: Tuple[int, int] = (-1, -1)
    attn_scale: Optional[float] = None
    dropout: float = 0.0
    softmax: str = "vanilla"
    bottom_right_diagonal: Optional[bool] = None
    softcap: Optional[float] = None
    generator: Optional[torch.Generator] = None
    return_lse: bool = False
    compute_dtype: Optional[torch.dtype] = None


@dataclass(frozen=True, eq=False)
class ReferenceTensors:
    """The optional tensors of the reference.

    bias: additive post-scale bias, 4-D and broadcastable to (B, Hq, Sq, Skv).
    alibi_slopes: ALiBi slopes of shape (Hq,) or (B, Hq).
    sink: per-head extra logit of shape (Hq,); required iff ``softmax="learnable"``.
    seqlens_q, seqlens_kv: actual lengths (B,), required iff the mask is a padding mask.
    """

    bias: Optional[torch.Tensor] = None
    alibi_slopes: Optional[torch.Tensor] = None
    sink: Optional[torch.Tensor] = None
    seqlens_q: Optional[torch.Tensor] = None
    seqlens_kv: Optional[torch.Tensor] = None


class _Scalars(NamedTuple):
    """Checked scalar options."""

    scale: float
    left: int
    right: int
    bottom_right: bool
    dropout: float
    softcap: Optional[float]


def _check_options(options: ReferenceOptions, head_dim: int) -> _Scalars:
    if options.compute_dtype is not None and options.compute_dtype not in _FLOAT_COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be None, torch.float32 or torch.float64, got {options.compute_dtype}")
    mask, softmax = options.mask, options.softmax
    if not isinstance(mask, str) or mask not in MASK_TYPES:
        raise ValueError(f"mask must be one of {MASK_TYPES}, got {mask!r}")
    if not isinstance(softmax, str) or softmax not in SOFTMAX_TYPES:
        raise ValueError(f"softmax must be one of {SOFTMAX_TYPES}, got {softmax!r}")
    left, right = _check_window(options.window_size)
    bottom_right = _resolve_bottom_right(mask, options.bottom_right_diagonal)
    attn_scale, dropout, softcap = options.attn_scale, options.dropout, options.softcap
    if attn_scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    elif _is_real(attn_scale) and math.isfinite(float(attn_scale)):
        scale = float(attn_scale)
    else:
        raise ValueError(f"attn_scale must be None or a finite real number, got {attn_scale!r}")
    if not _is_real(dropout) or not (0.0 <= float(dropout) < 1.0):
        raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")
    if softcap is not None:
        if not _is_real(softcap) or not (math.isfinite(float(softcap)) and float(softcap) > 0.0):
            raise ValueError(f"softcap must be None or a positive finite number, got {softcap!r}")
        softcap = float(softcap)
    if options.generator is not None and not isinstance(options.generator, torch.Generator):
        raise ValueError(f"generator must be None or a torch.Generator, got {type(options.generator).__name__}")
    if not isinstance(options.return_lse, bool):
        raise ValueError(f"return_lse must be a bool, got {options.return_lse!r}")
    return _Scalars(scale, left, right, bottom_right, float(dropout), softcap)


def _check_extras(tensors: ReferenceTensors, q: torch.Tensor, skv: int, softmax: str) -> None:
    batch, hq, sq = q.shape[0], q.shape[1], q.shape[2]
    bias, alibi_slopes, sink = tensors.bias, tensors.alibi_slopes, tensors.sink
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
            raise ValueError("bias must be a floating-point torch.Tensor")
        target = (batch, hq, sq, skv)
        if bias.dim() != 4 or any(b not in (1, t) for b, t in zip(bias.shape, target)):
            raise ValueError(
                f"bias must be 4-D and broadcastable to (B, Hq, Sq, Skv)={target} "
                f"(e.g. 1HSS, B1SS, BHSS, 11SS), got shape {tuple(bias.shape)}"
            )
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or not alibi_slopes.is_floating_point():
            raise ValueError("alibi_slopes must be a floating-point torch.Tensor of shape (Hq,) or (B, Hq)")
        if tuple(alibi_slopes.shape) not in ((hq,), (batch, hq)):
            raise ValueError(
                f"alibi_slopes must have shape ({hq},) or ({batch}, {hq}), got {tuple(alibi_slopes.shape)}"
            )
    if softmax == "learnable":
        if sink is None:
            raise ValueError("sink is required when softmax='learnable'")
        if not isinstance(sink, torch.Tensor) or not sink.is_floating_point() or tuple(sink.shape) != (hq,):
            raise ValueError(f"sink must be a floating-point torch.Tensor of shape ({hq},)")
    elif sink is not None:
        raise ValueError(f"sink is only accepted with softmax='learnable', got softmax={softmax!r}")


def _lengths(tensors: ReferenceTensors, q: torch.Tensor, skv: int, mask: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Actual (seqlens_q, seqlens_kv) as long tensors: the given ones, or the full lengths."""
    batch, sq, device = q.shape[0], q.shape[2], q.device
    lens_q = _check_seqlens("seqlens_q", tensors.seqlens_q, batch, sq, device, mask)
    lens_kv = _check_seqlens("seqlens_kv", tensors.seqlens_kv, batch, skv, device, mask)
    if lens_q is None:
        lens_q = torch.full((batch,), sq, dtype=torch.long, device=device)
        lens_kv = torch.full((batch,), skv, dtype=torch.long, device=device)
    return lens_q, lens_kv


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: ReferenceOptions = ReferenceOptions(),
    tensors: ReferenceTensors = ReferenceTensors(),
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Scaled-dot-product attention computed in ``options.compute_dtype`` (by default float64 for
    float64 inputs, else float32).

    q: queries (B, Hq, Sq, Dqk); k: keys (B, Hkv, Skv, Dqk) with ``Hq % Hkv == 0``; v: values
    (B, Hkv, Skv, Dv). Returns the output (B, Hq, Sq, Dv) in ``q.dtype``; with ``return_lse``
    also the log-sum-exp (B, Hq, Sq, 1) in ``compute_dtype``. See ``semantics.py`` for the
    masking, ALiBi, padding and fully-masked-row conventions. Raises ValueError naming an
    argument with the wrong type, shape, or value.
    """
    _check_qkv(q, k, v)
    batch, hq, sq, dqk = q.shape
    skv = k.shape[2]
    scalars = _check_options(options, dqk)
    _check_extras(tensors, q, skv, options.softmax)
    lens_q, lens_kv = _lengths(tensors, q, skv, options.mask)
    compute_dtype = options.compute_dtype
    if compute_dtype is None:
        compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32

    kf, vf = k.to(compute_dtype), v.to(compute_dtype)
    group = hq // k.shape[1]
    if group > 1:  # one K and V per q head: the whole score block in one product
        kf, vf = kf.repeat_interleave(group, dim=1), vf.repeat_interleave(group, dim=1)
    where = semantics.positions(0, sq, skv, lens_q, lens_kv, scalars.bottom_right)
    seen = semantics.visible(where, lens_kv, "causal" in options.mask, scalars.left, scalars.right)
    bias, slopes, sink = (None if t is None else t.to(device=q.device, dtype=compute_dtype)
                          for t in (tensors.bias, tensors.alibi_slopes, tensors.sink))
    if slopes is not None:
        slopes = slopes.view(1, hq, 1, 1) if slopes.dim() == 1 else slopes.view(batch, hq, 1, 1)
    masked = semantics.logits(q.to(compute_dtype), kf, scalars.scale, where, seen, softcap=scalars.softcap,
                              bias=bias, slopes=slopes)
    softmaxed = semantics.softmax(masked, options.softmax, sink)
    probs = softmaxed.probs
    if scalars.dropout > 0.0:
        keep = torch.rand(probs.shape, generator=options.generator, device=q.device, dtype=compute_dtype)
        probs = probs * (keep >= scalars.dropout).to(compute_dtype) / (1.0 - scalars.dropout)

    out = torch.matmul(probs, vf)
    out = torch.where(where.rows_real, out, torch.zeros_like(out)).to(q.dtype)
    if not options.return_lse:
        return out
    lse = softmaxed.lse
    return out, torch.where(softmaxed.nonempty & where.rows_real, lse, torch.zeros_like(lse))


_OPTION_NAMES = frozenset(f.name for f in fields(ReferenceOptions))
_TENSOR_NAMES = frozenset(f.name for f in fields(ReferenceTensors))


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **keywords: Any
                        ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """``attend`` with its options and tensors given as keywords: the fields of ReferenceOptions
    (mask, window_size, attn_scale, dropout, softmax, bottom_right_diagonal, softcap, generator,
    return_lse, compute_dtype) and of ReferenceTensors (bias, alibi_slopes, sink, seqlens_q,
    seqlens_kv). TypeError for any other keyword; ValueError for a bad value (see ``attend``).
    """
    unknown = set(keywords) - _OPTION_NAMES - _TENSOR_NAMES
    if unknown:
        raise TypeError(f"reference_attention() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    options = ReferenceOptions(**{n: value for n, value in keywords.items() if n in _OPTION_NAMES})
    tensors = ReferenceTensors(**{n: value for n, value in keywords.items() if n in _TENSOR_NAMES})
    return attend(q, k, v, options, tensors)


def reference_attention_bshd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: object
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """``reference_attention`` for logical BSHD inputs (B, S, H, D).

    The output is (B, Sq, Hq, Dv); the log-sum-exp, if requested, keeps the
    (B, Hq, Sq, 1) layout of ``reference_attention``.  Keyword arguments are
    those of ``reference_attention``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D torch.Tensor (B, S, H, D)")
    result = reference_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kwargs)
    if isinstance(result, tuple):
        return result[0].transpose(1, 2), result[1]
    return result.transpose(1, 2)
