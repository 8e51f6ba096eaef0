"""A model's attention mask as cuDNN describes it (`CudnnMask`), mapped from transformers' terms.

transformers' mask functions index absolute positions: query row i is position q_offset + i, key
row j is kv_offset + j, so the diagonal sits at d = q_offset - kv_offset.

- causal, d == 0 -> "causal" (top-left); d == Skv - Sq (KV cache: decode, prefill after a cache)
  -> "causal_bottom_right"; 0 < d < Skv - Sq (a static cache not yet full) ->
  "padding_causal_bottom_right" with seqlens_kv = d + Sq, the keys no query can see.
- bidirectional (`config.is_causal=False`, encoders) -> "no_mask" / "padding".
- a 2D padding mask -> "padding_causal" or "padding_causal_bottom_right" (or "padding") with
  seqlens_q / seqlens_kv counted from it, when every sequence's valid tokens are one contiguous
  run (left or right padding) and the runs line up with one of the two diagonals. Left padding
  is rolled to row 0 before the kernel and back after it (cuDNN's padding masks mean "the
  first seqlens[b] rows are valid"). Query rows that see no key (left padding) come out as
  zeros, as with "sdpa"; right-padding query rows see every key before them, as with "sdpa", on
  the top-left diagonal; on the bottom-right one (a prefill after a cache) cuDNN cannot give them
  those keys, so such a mask is not expressible.
- sliding window w (transformers: key visible iff kv > q - w, so w keys including the query's
  own) -> window_size=(w - 1, 0) on the same diagonal; dropped when it cannot cut anything
  (Sq <= w top-left, Skv <= w bottom-right).

Anything else raises `MaskNotExpressible`, whose message says why. torch is imported inside the
functions that build tensors: `report()` imports this module without torch.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple

from fusedattn_select.errors import FusedAttnSelectError

if TYPE_CHECKING:
    from torch import Tensor


class MaskNotExpressible(FusedAttnSelectError):
    """A model's mask has no exact cuDNN description; the message says why."""


class MaskUsedAsTensor(FusedAttnSelectError):
    """A model's own code used the "fusedattn" mask (a CudnnMask) as a tensor: it computes attention itself
    or edits its mask without asking for a tensor, which a description cannot serve."""


def _used_as_tensor(what: str) -> str:
    return (f"fusedattn: this model used the 'fusedattn' mask as a tensor ({what}): its own code reads the mask "
            "(its attention code, not transformers' attention interface, runs its layers, as BLOOM's and "
            "Falcon's in transformers 5; or it edits its mask without asking for a tensor); "
            "attn_implementation='fusedattn' cannot run it: use 'eager' or 'sdpa'")


class CudnnMask(NamedTuple):
    """A model's attention mask as cuDNN expresses it: what the "fusedattn" mask function returns.

    Rows are local: query row i and key row j of the tensors the attention function receives.
    `q_start` / `kv_start` (per sequence; None when all zero) say where the valid rows begin under
    left padding: the attention function rolls them to row 0, so the valid rows are
    [0, seqlens_q[b]) and [0, seqlens_kv[b]), which is what cuDNN's padding masks mean.
    """

    mask: str
    window_size: tuple[int, int]
    q_length: int
    kv_length: int
    seqlens_q: "Tensor | None" = None
    seqlens_kv: "Tensor | None" = None
    q_start: "Tensor | None" = None
    kv_start: "Tensor | None" = None

    # generate() with a compileable (static) cache makes the step's mask before the forward pass,
    # calls .contiguous() on it and hands it back to the model as `attention_mask`, whose mask
    # creation reads .ndim (2 = a padding mask to apply). A CudnnMask stands for a prepared 4-D
    # mask there, and the "fusedattn" mask function returns it unchanged.
    @property
    def ndim(self) -> int:
        return 4

    def contiguous(self) -> "CudnnMask":
        return self

    # A model whose own code uses the mask as a tensor gets an error saying so, instead of a TypeError or
    # AttributeError from deep inside its layers: torch functions and tensor methods given a CudnnMask
    # (`scores + mask`, `scores.masked_fill(mask, ...)`) come here, and so do tensor attributes. Not a
    # TypeError: torch turns one raised here into NotImplemented, and Python into its own message.
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise MaskUsedAsTensor(_used_as_tensor(getattr(func, "__name__", str(func))))

    def __add__(self, other: Any) -> Any:  # (a tuple's would concatenate, or fail saying so)
        raise MaskUsedAsTensor(_used_as_tensor("mask + ..."))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and the like ask for dunders: a plain miss
            raise AttributeError(name)
        raise AttributeError(_used_as_tensor(f"its .{name}"))


class _Runs(NamedTuple):
    """Per sequence of a (B, S) validity mask: first valid row, number of valid rows, and whether
    they are one contiguous run."""

    start: "Tensor"
    count: "Tensor"
    contiguous: "Tensor"


def cudnn_window(sliding_window: int | None, visible_span: int) -> tuple[int, int]:
    """(left, right) for a transformers sliding window, or unbounded where it cannot cut.

    `visible_span` is the most keys a causal row can see without the window: Sq for a top-left
    diagonal, Skv for a bottom-right one.
    """
    if sliding_window is None or visible_span <= sliding_window:
        return (-1, -1)
    return (sliding_window - 1, 0)


def _full_lengths(batch_size: int, length: int, device: Any) -> "Tensor":
    import torch

    return torch.full((batch_size,), length, dtype=torch.int32, device=device)


def _unpadded(q_length: int, kv_length: int, diagonal: int, causal: bool, sliding_window: int | None,
              batch_size: int, device: Any) -> CudnnMask:
    if not causal:
        return CudnnMask("no_mask", (-1, -1), q_length, kv_length)
    if diagonal == 0:
        return CudnnMask("causal", cudnn_window(sliding_window, q_length), q_length, kv_length)
    if diagonal == kv_length - q_length:
        return CudnnMask("causal_bottom_right", cudnn_window(sliding_window, kv_length), q_length, kv_length)
    if 0 < diagonal < kv_length - q_length:
        # A static cache not yet full: keys past the last query's position are empty slots no query
        # sees, i.e. padding, and the diagonal is bottom-right of the keys that remain.
        return CudnnMask(
            "padding_causal_bottom_right", cudnn_window(sliding_window, diagonal + q_length), q_length, kv_length,
            seqlens_q=_full_lengths(batch_size, q_length, device),
            seqlens_kv=_full_lengths(batch_size, diagonal + q_length, device),
        )
    raise MaskNotExpressible(
        f"the causal diagonal (query offset - key offset = {diagonal}) is neither top-left (0) nor "
        f"within the keys (Sq={q_length}, Skv={kv_length})"
    )


def _runs(valid: "Tensor") -> _Runs:
    import torch

    count = valid.sum(-1)
    start = torch.where(count > 0, valid.to(torch.int32).argmax(-1), torch.zeros_like(count))
    positions = torch.arange(valid.shape[-1], device=valid.device)
    run = (positions >= start[:, None]) & (positions < (start + count)[:, None])
    return _Runs(start, count, (valid == run).all(-1))


def _placement(batch_size: int = 1, device: Any = "cpu") -> tuple[int, Any]:
    return batch_size, device


def cudnn_mask(
    *,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    causal: bool = True,
    sliding_window: int | None = None,
    padding_mask: "Tensor | None" = None,
    **placement: Any,
) -> CudnnMask:
    """Map a transformers mask description to cuDNN's, or raise MaskNotExpressible.

    `q_offset` / `kv_offset` are the absolute positions of query row 0 and key row 0 (transformers'
    mask arguments); `sliding_window` is transformers' (key visible iff kv > q - w);
    `padding_mask` is the 2D (B, positions) mask over absolute positions, True for real tokens.
    `placement` takes `batch_size` (default 1) and `device` (default "cpu") of the per-sequence
    lengths built when there is no padding mask; a padding mask gives both.
    With a padding mask this reads one small tensor back to the host (as transformers' own "sdpa"
    mask function does to decide whether it may skip the mask).
    """
    batch_size, device = _placement(**placement)
    if not causal and sliding_window is not None:
        raise MaskNotExpressible("a bidirectional sliding window is not mapped to cuDNN")
    if padding_mask is None:
        return _unpadded(q_length, kv_length, q_offset - kv_offset, causal, sliding_window, batch_size, device)
    return _padded(padding_mask, q_length, kv_length, q_offset, kv_offset, causal, sliding_window)


def _padded(padding_mask: "Tensor", q_length: int, kv_length: int, q_offset: int, kv_offset: int, causal: bool,
            sliding_window: int | None) -> CudnnMask:
    import torch

    mask = padding_mask.to(torch.bool)
    needed = kv_offset + kv_length
    # The common case (generate() with an all-ones mask) in one reduction and one read back: every
    # key and query position valid.
    lo, hi = (min(kv_offset, q_offset), max(needed, q_offset + q_length)) if causal else (kv_offset, needed)
    if hi <= mask.shape[-1] and bool(mask[:, lo:hi].all()):
        return _unpadded(q_length, kv_length, q_offset - kv_offset, causal, sliding_window, mask.shape[0], mask.device)
    if mask.shape[-1] < needed:
        # Positions past the 2D mask are padding (transformers pads it with False the same way).
        mask = torch.nn.functional.pad(mask, (0, needed - mask.shape[-1]))
    kv = _runs(mask[:, kv_offset:needed])
    if causal and q_offset + q_length <= mask.shape[-1]:
        q = _runs(mask[:, q_offset:q_offset + q_length])
    else:
        # Queries are not positions of this mask (cross-attention) or the mask is bidirectional:
        # every query row is computed, which is always exact.
        q = _Runs(torch.zeros_like(kv.start), torch.full_like(kv.count, q_length), torch.ones_like(kv.contiguous))
    offset = q.start + (q_offset - kv_offset) - kv.start
    facts = torch.stack([
        (kv.contiguous & q.contiguous).all(),
        ((kv.count > 0) & (q.count > 0)).all(),
        ((kv.count == kv_length) & (q.count == q_length)).all(),
        (offset == 0).all(),
        (offset == kv.count - q.count).all(),
        (q.start != 0).any(),
        (kv.start != 0).any(),
        (q.start + q.count < q_length).any(),
    ]).tolist()
    contiguous, nonempty, unpadded, top_left, bottom_right, q_shifted, kv_shifted, q_right_padded = facts
    if unpadded:
        return _unpadded(q_length, kv_length, q_offset - kv_offset, causal, sliding_window, mask.shape[0], mask.device)
    if not contiguous:
        raise MaskNotExpressible("the 2D attention mask has holes (a sequence's tokens are not one contiguous run)")
    if not nonempty:
        raise MaskNotExpressible("a sequence of the batch has no unmasked token")
    q_count = q.count
    if not causal:
        kind, window_size = "padding", (-1, -1)
    elif top_left:
        kind, window_size = "padding_causal", cudnn_window(sliding_window, q_length)
        # Query rows after a sequence's tokens (right padding) see every key before them, as with
        # "sdpa" and "eager"; only rows before them (left padding) see no key and come out zero.
        q_count = q_length - q.start
    elif bottom_right:
        if q_right_padded:
            # "sdpa" gives a query row after a sequence's tokens the keys before it; on the bottom-right
            # diagonal cuDNN counts rows from the last valid one, so such rows could only come out zero.
            raise MaskNotExpressible("query rows after a sequence's tokens (right padding) in a prefill after a "
                                     "cache have no cuDNN mask that gives them their keys")
        kind, window_size = "padding_causal_bottom_right", cudnn_window(sliding_window, kv_length)
    else:
        raise MaskNotExpressible(
            "the padded sequences do not share one diagonal (top-left or bottom-right) with the cache offsets"
        )
    return CudnnMask(
        kind, window_size, q_length, kv_length,
        seqlens_q=q_count.to(torch.int32),
        seqlens_kv=kv.count.to(torch.int32),
        q_start=q.start if q_shifted else None,
        kv_start=kv.start if kv_shifted else None,
    )


# A tensor the "fusedattn" mask function returned carries (the CudnnMask it stands for, or None when
# it stands for none and the reason was logged; the tensor's version then): transformers asks for a
# tensor where it may not skip the mask (packed sequences, block masks, models that edit their mask;
# a decode step's tensor is run as a bias instead, one_row_bias), and the attention function takes
# the description while the tensor is unchanged.
_TAG = "_fusedattn_description"


def trackable(dense: "Tensor | None") -> "Tensor | None":
    """`dense`, or a copy of it made outside inference mode where it is an inference tensor (one made under
    torch.inference_mode), which has no version counter to show an edit by."""
    import torch

    if dense is None or not dense.is_inference():
        return dense
    with torch.inference_mode(False), torch.no_grad():
        return dense.clone()


def tag(dense: "Tensor", description: CudnnMask | None) -> "Tensor":
    """`dense` (the mask transformers' "sdpa" function made), or its `trackable` copy, marked as standing
    for `description`."""
    dense = trackable(dense)
    setattr(dense, _TAG, (description, dense._version))
    return dense


def tagged(mask: "Tensor", q_length: int, kv_length: int) -> tuple[bool, CudnnMask | None]:
    """(whether `mask` is a tensor the mask function returned, unchanged since; the CudnnMask it stands
    for, if any, for a layer of these lengths)."""
    found = getattr(mask, _TAG, None)
    if found is None or found[1] != mask._version:
        return False, None
    description = found[0]
    if description is not None and (description.q_length, description.kv_length) != (q_length, kv_length):
        return True, None
    return True, description


# The last one-row mask one_row_bias answered, per thread: (a weak reference to it, its version, the
# dtype asked for, the bias). Every layer of a decode step gets the same mask tensor.
_last = threading.local()


def one_row_bias(mask: "Tensor", batch_size: int, kv_length: int, dtype: Any) -> "Tensor | None":
    """A decode step's dense mask (one query row: (B or 1, 1, 1, Skv)) as the additive bias it
    stands for, in `dtype`: 0 where a key is seen and -inf where not for a bool mask; a float mask
    is one already (eager's 0 and lowest, or a model's own). None for any other mask. Nothing is
    read back, and it is made once per mask tensor (each time for an inference tensor, whose edits
    could not be seen)."""
    import torch

    if mask.dim() != 4 or mask.shape[1:] != (1, 1, kv_length) or mask.shape[0] not in (1, batch_size):
        return None
    keep = not mask.is_inference()
    cached = getattr(_last, "entry", None)
    if keep and cached is not None and cached[0]() is mask and cached[1] == mask._version and cached[2] == dtype:
        return cached[3]
    if mask.dtype == torch.bool:
        bias = torch.full(mask.shape, float("-inf"), dtype=dtype, device=mask.device).masked_fill_(mask, 0.0)
    elif mask.is_floating_point():
        bias = mask.to(dtype)
    else:
        return None
    if keep:
        _last.entry = (weakref.ref(mask), mask._version, dtype, bias)
    return bias
