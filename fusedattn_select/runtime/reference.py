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
from typing import Optional, Sequence, Tuple, Union

import torch

__all__ = [
    "MASK_TYPES",
    "SOFTMAX_TYPES",
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


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: str = "no_mask",
    window_size: Tuple[int, int] = (-1, -1),
    attn_scale: Optional[float] = None,
    dropout: float = 0.0,
    bias: Optional[torch.Tensor] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    softmax: str = "vanilla",
    sink: Optional[torch.Tensor] = None,
    seqlens_q: Optional[torch.Tensor] = None,
    seqlens_kv: Optional[torch.Tensor] = None,
    bottom_right_diagonal: Optional[bool] = None,
    softcap: Optional[float] = None,
    generator: Optional[torch.Generator] = None,
    return_lse: bool = False,
    compute_dtype: torch.dtype = torch.float32,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Scaled-dot-product attention computed in ``compute_dtype`` (float32 by default).

    Args:
        q: queries, logical shape (B, Hq, Sq, Dqk).
        k: keys, logical shape (B, Hkv, Skv, Dqk); ``Hq % Hkv == 0``.
        v: values, logical shape (B, Hkv, Skv, Dv).
        mask: one of ``MASK_TYPES`` (TransformerEngine names).
        window_size: sliding window ``(left, right)``; ``-1`` means unbounded.
        attn_scale: score multiplier; ``None`` means ``1 / sqrt(Dqk)``.
        dropout: probability in [0, 1) of dropping an attention probability.
        bias: additive post-scale bias, 4-D and broadcastable to (B, Hq, Sq, Skv).
        alibi_slopes: ALiBi slopes of shape (Hq,) or (B, Hq).
        softmax: one of ``SOFTMAX_TYPES``.
        sink: per-head extra logit of shape (Hq,); required iff ``softmax="learnable"``.
        seqlens_q: actual query lengths (B,), required iff the mask is a padding mask.
        seqlens_kv: actual key/value lengths (B,), required iff the mask is a padding mask.
        bottom_right_diagonal: diagonal alignment for the window and ALiBi; ``None``
            derives it from ``mask`` (True for ``*_bottom_right``, else False).  With
            a causal mask it must agree with the mask.
        softcap: if set (> 0), scores become ``softcap * tanh(scores / softcap)``.
        generator: random generator for dropout.
        return_lse: also return the log-sum-exp of each row.
        compute_dtype: internal precision, ``torch.float32`` or ``torch.float64``.

    Returns:
        The output (B, Hq, Sq, Dv) in ``q.dtype``; with ``return_lse`` also the
        log-sum-exp (B, Hq, Sq, 1) in ``compute_dtype``.  See the module docstring
        for the masking, ALiBi, padding and fully-masked-row conventions.

    Raises:
        ValueError: an argument has the wrong type, shape, or value.
    """
    _check_qkv(q, k, v)
    batch, hq, sq, dqk = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    device = q.device

    if compute_dtype not in _FLOAT_COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be torch.float32 or torch.float64, got {compute_dtype}")
    if not isinstance(mask, str) or mask not in MASK_TYPES:
        raise ValueError(f"mask must be one of {MASK_TYPES}, got {mask!r}")
    if not isinstance(softmax, str) or softmax not in SOFTMAX_TYPES:
        raise ValueError(f"softmax must be one of {SOFTMAX_TYPES}, got {softmax!r}")
    left, right = _check_window(window_size)
    bottom_right = _resolve_bottom_right(mask, bottom_right_diagonal)

    if attn_scale is None:
        scale = 1.0 / math.sqrt(dqk)
    elif _is_real(attn_scale) and math.isfinite(float(attn_scale)):
        scale = float(attn_scale)
    else:
        raise ValueError(f"attn_scale must be None or a finite real number, got {attn_scale!r}")
    if not _is_real(dropout) or not (0.0 <= float(dropout) < 1.0):
        raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")
    dropout = float(dropout)
    if softcap is not None:
        if not _is_real(softcap) or not (math.isfinite(float(softcap)) and float(softcap) > 0.0):
            raise ValueError(f"softcap must be None or a positive finite number, got {softcap!r}")
        softcap = float(softcap)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be None or a torch.Generator, got {type(generator).__name__}")
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse must be a bool, got {return_lse!r}")

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

    lens_q = _check_seqlens("seqlens_q", seqlens_q, batch, sq, device, mask)
    lens_kv = _check_seqlens("seqlens_kv", seqlens_kv, batch, skv, device, mask)
    if lens_q is None:
        lens_q = torch.full((batch,), sq, dtype=torch.long, device=device)
        lens_kv = torch.full((batch,), skv, dtype=torch.long, device=device)

    # ---- scores ---------------------------------------------------------
    group = hq // hkv
    qf = q.to(compute_dtype)
    kf = k.to(compute_dtype)
    vf = v.to(compute_dtype)
    if group > 1:
        kf = kf.repeat_interleave(group, dim=1)
        vf = vf.repeat_interleave(group, dim=1)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale  # (B, Hq, Sq, Skv)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.to(device=device, dtype=compute_dtype)

    i = torch.arange(sq, device=device).view(1, 1, sq, 1)
    j = torch.arange(skv, device=device).view(1, 1, 1, skv)
    if bottom_right:
        offset = (lens_kv - lens_q).view(batch, 1, 1, 1)
    else:
        offset = torch.zeros((batch, 1, 1, 1), dtype=torch.long, device=device)
    diag = i + offset  # (B, 1, Sq, 1): key index on the diagonal of row i

    if alibi_slopes is not None:
        slopes = alibi_slopes.to(device=device, dtype=compute_dtype)
        slopes = slopes.view(1, hq, 1, 1) if slopes.dim() == 1 else slopes.view(batch, hq, 1, 1)
        scores = scores + slopes * (j - diag).to(compute_dtype)

    # ---- mask -----------------------------------------------------------
    row_valid = i < lens_q.view(batch, 1, 1, 1)  # (B, 1, Sq, 1)
    allowed = (j < lens_kv.view(batch, 1, 1, 1)) & row_valid  # (B, 1, Sq, Skv)
    if "causal" in mask:
        allowed = allowed & (j <= diag)
    if left >= 0:
        allowed = allowed & (j >= diag - left)
    if right >= 0:
        allowed = allowed & (j <= diag + right)

    logits = scores.masked_fill(~allowed, float("-inf"))
    if softmax == "off_by_one":
        extra = torch.zeros((batch, hq, sq, 1), dtype=compute_dtype, device=device)
        logits = torch.cat([logits, extra], dim=-1)
    elif softmax == "learnable":
        extra = sink.to(device=device, dtype=compute_dtype).view(1, hq, 1, 1).expand(batch, hq, sq, 1)
        logits = torch.cat([logits, extra], dim=-1)

    # ---- softmax, NaN-free for fully masked rows ------------------------
    row_max = logits.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    expd = torch.exp(logits - row_max)  # exp(-inf) = 0 on masked keys
    denom = expd.sum(dim=-1, keepdim=True)
    nonempty = denom > 0
    safe_denom = torch.where(nonempty, denom, torch.ones_like(denom))
    probs = (expd / safe_denom)[..., :skv]

    if dropout > 0.0:
        keep = torch.rand(probs.shape, generator=generator, device=device, dtype=compute_dtype) >= dropout
        probs = probs * keep.to(compute_dtype) / (1.0 - dropout)

    out = torch.matmul(probs, vf)
    out = torch.where(row_valid, out, torch.zeros_like(out)).to(q.dtype)
    if not return_lse:
        return out
    lse = row_max + torch.log(safe_denom)
    lse = torch.where(nonempty & row_valid, lse, torch.zeros_like(lse))
    return out, lse


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
