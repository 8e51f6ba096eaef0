"""Float32 reference scaled-dot-product attention (test oracle and slow fallback).

Everything here is written with plain torch operations, so the backward pass is
whatever autograd derives from the forward; no custom kernels are involved.

Conventions (all lengths and indices are per batch element ``b``):

* Layout is logical BHSD: ``q`` is ``(B, Hq, Sq, Dqk)``, ``k`` is
  ``(B, Hkv, Skv, Dqk)``, ``v`` is ``(B, Hkv, Skv, Dv)``; strides are free.
  With ``Hq > Hkv`` (GQA/MQA) kv head ``h`` serves q heads
  ``h * (Hq // Hkv) ... (h + 1) * (Hq // Hkv) - 1``.
* Score pipeline: ``s = (q @ k^T) * attn_scale``; then ``softcap * tanh(s / softcap)``
  when ``softcap`` is set; then ``+ bias``; then ``+ alibi``; then the mask.
* ``Sq_b`` / ``Skv_b`` are the actual lengths (``seqlens_q[b]`` / ``seqlens_kv[b]``
  with padding masks, the full lengths otherwise).  With bottom-right alignment
  the diagonal offset is ``Skv_b - Sq_b``, with top-left alignment it is 0.
* Causal: query ``i`` sees key ``j`` iff ``j <= i + offset``.
* Sliding window ``(left, right)`` (``-1`` = unbounded): query ``i`` sees key ``j``
  iff ``i + offset - left <= j <= i + offset + right``.  A causal mask and a
  window combine as an intersection and share the same diagonal.
* ALiBi (signed, causal convention, as in cuDNN's ALiBi mask):
  ``alibi[b, h, i, j] = slope[b, h] * (j - (i + offset))``, which is ``<= 0`` on
  every key a causal mask leaves visible and equals ``-slope * |i + offset - j|``
  there.  Without a causal mask keys right of the diagonal get a positive bias.
* Padding: keys ``j >= Skv_b`` are masked; query rows ``i >= Sq_b`` are padding
  and produce output 0 and log-sum-exp 0.
* Rows in which every key is masked (possible with windows, bottom-right
  alignment with ``Skv_b < Sq_b``, or ``Skv_b == 0``) produce output 0 and, with
  the vanilla softmax, log-sum-exp 0 (never NaN).  With ``off_by_one`` /
  ``learnable`` such a row puts all probability on the extra logit, so the output
  is 0 and the log-sum-exp is that logit (0, or ``sink[h]``).
* Softmax variants: ``vanilla``; ``off_by_one`` adds a logit of 0 to every row
  (denominator ``+ 1`` in unscaled terms); ``learnable`` adds the logit
  ``sink[h]`` per q head (gpt-oss style attention sinks).  The extra logit has
  no value vector, i.e. contributes nothing to the output.
* Log-sum-exp is the natural log over the post-scale, post-softcap, post-bias
  scores of the visible keys plus the extra logit, if any; shape
  ``(B, Hq, Sq, 1)`` in ``compute_dtype``.
* Dropout ``p`` zeroes probabilities (after the softmax, so the log-sum-exp is
  unaffected) with probability ``p`` and rescales the rest by ``1 / (1 - p)``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Optional, Sequence, Tuple, Union

import torch

__all__ = [
    "MASK_TYPES",
    "SOFTMAX_TYPES",
    "ReferenceOptions",
    "ReferenceTensors",
    "attend",
    "reference_attention",
    "reference_attention_bshd",
]

MASK_TYPES: Tuple[str, ...] = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
)
SOFTMAX_TYPES: Tuple[str, ...] = ("vanilla", "off_by_one", "learnable")

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
    if sq == 0:
        raise ValueError("q must have a non-zero sequence length (dim 2)")
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
    compute_dtype: internal precision, ``torch.float32`` or ``torch.float64``.
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
    compute_dtype: torch.dtype = torch.float32


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
    if options.compute_dtype not in _FLOAT_COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be torch.float32 or torch.float64, got {options.compute_dtype}")
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


def _scores(q: torch.Tensor, k: torch.Tensor, scalars: _Scalars, bias: Optional[torch.Tensor],
            compute_dtype: torch.dtype) -> torch.Tensor:
    """(B, Hq, Sq, Skv) post-scale, post-softcap, post-bias scores; K repeated for GQA/MQA."""
    group = q.shape[1] // k.shape[1]
    kf = k.to(compute_dtype)
    if group > 1:
        kf = kf.repeat_interleave(group, dim=1)
    scores = torch.matmul(q.to(compute_dtype), kf.transpose(-1, -2)) * scalars.scale
    if scalars.softcap is not None:
        scores = scalars.softcap * torch.tanh(scores / scalars.softcap)
    if bias is not None:
        scores = scores + bias.to(device=q.device, dtype=compute_dtype)
    return scores


class _Rows(NamedTuple):
    """Per-row facts: the key index on each row's diagonal, which query rows are real."""

    diag: torch.Tensor       # (B, 1, Sq, 1)
    row_valid: torch.Tensor  # (B, 1, Sq, 1)
    keys: torch.Tensor       # (1, 1, 1, Skv): key indices


def _rows(lens_q: torch.Tensor, lens_kv: torch.Tensor, sq: int, skv: int, bottom_right: bool) -> _Rows:
    batch, device = lens_q.shape[0], lens_q.device
    i = torch.arange(sq, device=device).view(1, 1, sq, 1)
    j = torch.arange(skv, device=device).view(1, 1, 1, skv)
    if bottom_right:
        offset = (lens_kv - lens_q).view(batch, 1, 1, 1)
    else:
        offset = torch.zeros((batch, 1, 1, 1), dtype=torch.long, device=device)
    return _Rows(i + offset, i < lens_q.view(batch, 1, 1, 1), j)


def _allowed(rows: _Rows, lens_kv: torch.Tensor, mask: str, scalars: _Scalars) -> torch.Tensor:
    """(B, 1, Sq, Skv) which keys each query sees."""
    j, diag = rows.keys, rows.diag
    allowed = (j < lens_kv.view(-1, 1, 1, 1)) & rows.row_valid
    if "causal" in mask:
        allowed = allowed & (j <= diag)
    if scalars.left >= 0:
        allowed = allowed & (j >= diag - scalars.left)
    if scalars.right >= 0:
        allowed = allowed & (j <= diag + scalars.right)
    return allowed


def _with_extra_logit(logits: torch.Tensor, softmax: str, sink: Optional[torch.Tensor]) -> torch.Tensor:
    """The logits with the off-by-one (0) or learnable (sink[h]) extra logit appended to each row."""
    batch, hq, sq, _ = logits.shape
    if softmax == "off_by_one":
        extra = torch.zeros((batch, hq, sq, 1), dtype=logits.dtype, device=logits.device)
    elif softmax == "learnable":
        extra = sink.to(device=logits.device, dtype=logits.dtype).view(1, hq, 1, 1).expand(batch, hq, sq, 1)
    else:
        return logits
    return torch.cat([logits, extra], dim=-1)


def _softmax(logits: torch.Tensor, skv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probabilities of the Skv keys, row max, safe denominator, nonempty rows); NaN-free for
    fully masked rows."""
    row_max = logits.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    expd = torch.exp(logits - row_max)  # exp(-inf) = 0 on masked keys
    denom = expd.sum(dim=-1, keepdim=True)
    nonempty = denom > 0
    safe_denom = torch.where(nonempty, denom, torch.ones_like(denom))
    return (expd / safe_denom)[..., :skv], row_max, safe_denom, nonempty


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: ReferenceOptions = ReferenceOptions(),
    tensors: ReferenceTensors = ReferenceTensors(),
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Scaled-dot-product attention computed in ``options.compute_dtype`` (float32 by default).

    q: queries (B, Hq, Sq, Dqk); k: keys (B, Hkv, Skv, Dqk) with ``Hq % Hkv == 0``; v: values
    (B, Hkv, Skv, Dv). Returns the output (B, Hq, Sq, Dv) in ``q.dtype``; with ``return_lse``
    also the log-sum-exp (B, Hq, Sq, 1) in ``compute_dtype``. See the module docstring for the
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

    scores = _scores(q, k, scalars, tensors.bias, compute_dtype)
    rows = _rows(lens_q, lens_kv, sq, skv, scalars.bottom_right)
    if tensors.alibi_slopes is not None:
        slopes = tensors.alibi_slopes.to(device=q.device, dtype=compute_dtype)
        slopes = slopes.view(1, hq, 1, 1) if slopes.dim() == 1 else slopes.view(batch, hq, 1, 1)
        scores = scores + slopes * (rows.keys - rows.diag).to(compute_dtype)
    logits = scores.masked_fill(~_allowed(rows, lens_kv, options.mask, scalars), float("-inf"))
    probs, row_max, safe_denom, nonempty = _softmax(_with_extra_logit(logits, options.softmax, tensors.sink), skv)
    if scalars.dropout > 0.0:
        keep = torch.rand(probs.shape, generator=options.generator, device=q.device, dtype=compute_dtype)
        probs = probs * (keep >= scalars.dropout).to(compute_dtype) / (1.0 - scalars.dropout)

    vf = v.to(compute_dtype)
    if hq // k.shape[1] > 1:
        vf = vf.repeat_interleave(hq // k.shape[1], dim=1)
    out = torch.matmul(probs, vf)
    out = torch.where(rows.row_valid, out, torch.zeros_like(out)).to(q.dtype)
    if not options.return_lse:
        return out
    lse = row_max + torch.log(safe_denom)
    return out, torch.where(nonempty & rows.row_valid, lse, torch.zeros_like(lse))


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
