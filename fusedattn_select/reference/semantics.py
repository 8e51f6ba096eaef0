"""What the float32 reference computes, written once for the autograd and the chunked reference.

Conventions (all lengths and indices are per batch element ``b``):

* Layout is logical BHSD: ``q`` is ``(B, Hq, Sq, Dqk)``, ``k`` is ``(B, Hkv, Skv, Dqk)``, ``v`` is
  ``(B, Hkv, Skv, Dv)``; strides are free. With ``Hq > Hkv`` (GQA/MQA) kv head ``h`` serves q heads
  ``h * (Hq // Hkv) ... (h + 1) * (Hq // Hkv) - 1``.
* Score pipeline (``logits``): ``s = (q @ k^T) * attn_scale``; then ``softcap * tanh(s / softcap)``
  when ``softcap`` is set; then ``+ bias``; then ``+ alibi``; then the mask.
* ``Sq_b`` / ``Skv_b`` are the actual lengths (``seqlens_q[b]`` / ``seqlens_kv[b]`` with padding
  masks, the full lengths otherwise). The diagonal of query row ``i`` is key ``i + offset``: with
  bottom-right alignment ``offset = Skv_b - Sq_b``, with top-left alignment 0 (``positions``).
* Causal: query ``i`` sees key ``j`` iff ``j <= i + offset``.
* Sliding window ``(left, right)`` (``-1`` = unbounded): query ``i`` sees key ``j`` iff
  ``i + offset - left <= j <= i + offset + right``. A causal mask and a window combine as an
  intersection and share the same diagonal (``visible``).
* ALiBi (signed, causal convention, as in cuDNN's ALiBi mask):
  ``alibi[b, h, i, j] = slope[b, h] * (j - (i + offset))``, which is ``<= 0`` on every key a causal
  mask leaves visible and equals ``-slope * |i + offset - j|`` there. Without a causal mask keys right
  of the diagonal get a positive bias. ``alibi_slopes`` gives cuDNN's slopes for a head count.
* Padding: keys ``j >= Skv_b`` are masked; query rows ``i >= Sq_b`` are padding: the autograd
  reference gives them output 0 and log-sum-exp 0; the chunked reference leaves them unspecified
  (verify compares real rows only).
* Rows in which every key is masked (possible with windows, bottom-right alignment with
  ``Skv_b < Sq_b``, or ``Skv_b == 0``) produce output 0 and, with the vanilla softmax, log-sum-exp 0
  (never NaN). With ``off_by_one`` / ``learnable`` such a row puts all probability on the extra
  logit, so the output is 0 and the log-sum-exp is that logit (0, or ``sink[h]``).
* Softmax variants (``softmax``): ``vanilla``; ``off_by_one`` adds a logit of 0 to every row
  (denominator ``+ 1`` in unscaled terms); ``learnable`` adds the logit ``sink[h]`` per q head
  (gpt-oss style attention sinks). The extra logit has no value vector, i.e. contributes nothing to
  the output.
* Log-sum-exp is the natural log over the post-scale, post-softcap, post-bias scores of the visible
  keys plus the extra logit, if any.
* Dropout ``p`` zeroes probabilities (after the softmax, so the log-sum-exp is unaffected) with
  probability ``p`` and rescales the rest by ``1 / (1 - p)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch

# config.MASKS and config.SOFTMAXES, copied: the reference imports nothing else of the package
# (tests/reference/test_autograd_reference.py keeps the copies equal).
MASK_TYPES: Tuple[str, ...] = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
)
SOFTMAX_TYPES: Tuple[str, ...] = ("vanilla", "off_by_one", "learnable")


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's geometric slopes for `heads` heads (Press et al.; the interleaved extension past the
    largest power of two), as cuDNN's ALiBi mask uses them."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(heads - n)]
    return slopes


class Positions(NamedTuple):
    """Where query rows and keys sit: indices, each row's diagonal, which rows are real."""

    rows: torch.Tensor       # (1, 1, R, 1): query row indices
    keys: torch.Tensor       # (1, 1, 1, Skv): key indices
    diagonal: torch.Tensor   # (B, 1, R, 1): the key on each row's diagonal
    rows_real: torch.Tensor  # (B, 1, R, 1): the row lies within its batch element's length


def positions(start: int, stop: int, skv: int, lens_q: torch.Tensor, lens_kv: torch.Tensor,
              bottom_right: bool) -> Positions:
    """The positions of query rows [start, stop) against `skv` keys; lens_q, lens_kv: (B,) long."""
    batch, device = lens_q.shape[0], lens_q.device
    rows = torch.arange(start, stop, device=device).view(1, 1, -1, 1)
    keys = torch.arange(skv, device=device).view(1, 1, 1, skv)
    if bottom_right:
        offset = (lens_kv - lens_q).view(batch, 1, 1, 1)
    else:
        offset = torch.zeros((batch, 1, 1, 1), dtype=torch.long, device=device)
    return Positions(rows, keys, rows + offset, rows < lens_q.view(batch, 1, 1, 1))


def visible(where: Positions, lens_kv: torch.Tensor, causal: bool, left: int, right: int) -> torch.Tensor:
    """(B, 1, R, Skv) bool: which keys each query row sees (padding, causal mask and window)."""
    keys, diagonal = where.keys, where.diagonal
    seen = (keys < lens_kv.view(-1, 1, 1, 1)) & where.rows_real
    if causal:
        seen = seen & (keys <= diagonal)
    if left >= 0:
        seen = seen & (keys >= diagonal - left)
    if right >= 0:
        seen = seen & (keys <= diagonal + right)
    return seen


def logits(q: torch.Tensor, k: torch.Tensor, scale: float, where: Positions, seen: torch.Tensor, *,
           softcap: Optional[float] = None, bias: Optional[torch.Tensor] = None,
           slopes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(..., R, Skv) masked logits of q (..., R, D) against k (..., Skv, D): scaled, soft-capped, plus
    the bias and ALiBi, -inf where `seen` is False.

    q, k, bias and slopes come in the compute dtype; k broadcasts over q's heads (or is repeated per
    q head); bias broadcasts to the logits; slopes: (1 or B, H, 1, 1), one per head of q.
    """
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    if slopes is not None:
        scores = scores + slopes * (where.keys - where.diagonal).to(scores.dtype)
    return scores.masked_fill(~seen, float("-inf"))


def extra_logit(softmax: str, sink: Optional[torch.Tensor], like: torch.Tensor) -> Optional[torch.Tensor]:
    """The extra logit of each row, shaped as `like` (..., H, R, 1): 0 for off_by_one, the head's
    sink for learnable (`sink`: (H,) in like's dtype), None for vanilla."""
    if softmax == "off_by_one":
        return torch.zeros_like(like)
    if softmax == "learnable":
        return sink.view(1, -1, 1, 1).expand_as(like)
    return None


class Probabilities(NamedTuple):
    """The softmax of masked logits over their keys, with the extra logit in the denominator."""

    probs: torch.Tensor        # (..., R, Skv): 0 on masked keys and in rows with no visible logit
    row_max: torch.Tensor      # (..., R, 1): the row's largest logit (extra included), 0 if none is finite
    denominator: torch.Tensor  # (..., R, 1): sum of exp(logit - row_max), 1 where that sum is 0
    nonempty: torch.Tensor     # (..., R, 1) bool: some logit of the row (extra included) is finite

    @property
    def lse(self) -> torch.Tensor:
        """(..., R, 1) natural log-sum-exp of the row (0 for a row without a finite logit)."""
        return self.row_max + torch.log(self.denominator)


def softmax(masked: torch.Tensor, softmax_type: str, sink: Optional[torch.Tensor]) -> Probabilities:
    """The probabilities of `masked` logits (..., H, R, Skv) under `softmax_type` (one of
    SOFTMAX_TYPES; `sink`: (H,) for learnable). NaN-free for rows with every key masked."""
    # The max is a shift only: detached, so autograd differentiates the plain softmax.
    if masked.shape[-1]:
        row_max = masked.amax(dim=-1, keepdim=True).detach()
    else:  # no keys at all (seqlen_kv 0): every row is one without a visible logit
        row_max = masked.new_full((*masked.shape[:-1], 1), float("-inf"))
    extra = extra_logit(softmax_type, sink, row_max)
    if extra is not None:
        row_max = torch.maximum(row_max, extra.detach())
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    expd = torch.exp(masked - row_max)  # exp(-inf) = 0 on masked keys
    denominator = expd.sum(dim=-1, keepdim=True)
    if extra is not None:
        denominator = denominator + torch.exp(extra - row_max)  # the extra logit has no value vector
    nonempty = denominator > 0
    safe = torch.where(nonempty, denominator, torch.ones_like(denominator))
    return Probabilities(expd / safe, row_max, safe, nonempty)
