"""Hugging Face transformers integration: `attn_implementation="fusedattn"`, and per-layer reports.

Use::

    from fusedattn_select.integrations.transformers import register
    register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fusedattn")

`register()` adds two functions to transformers under the name "fusedattn":

- a mask function (`AttentionMaskInterface`) that describes the model's mask the way cuDNN does, as
  a `CudnnMask` (mask kind, window, per-sequence lengths), instead of materialising a dense
  (B, 1, Sq, Skv) tensor, whenever it can show that description is exact; otherwise it returns
  what transformers' "sdpa" mask function returns, and logs why once;
- an attention function (`AttentionInterface`) that runs `fusedattn_select.runtime.api.attention` for
  a `CudnnMask` (the fused backend `select()` picks, or dispatch's own fallback) and, for a dense
  mask, does what attn_implementation="sdpa" does.

Mapping rules. transformers' mask functions index absolute positions: query row i is position
q_offset + i, key row j is kv_offset + j, so the diagonal sits at d = q_offset - kv_offset.

- causal, d == 0 -> "causal" (top-left); d == Skv - Sq (KV cache: decode, prefill after a cache)
  -> "causal_bottom_right"; 0 < d < Skv - Sq (a static cache not yet full) ->
  "padding_causal_bottom_right" with seqlens_kv = d + Sq, the keys no query can see.
- bidirectional (`config.is_causal=False`, encoders) -> "no_mask" / "padding".
- a 2D padding mask -> "padding_causal" or "padding_causal_bottom_right" (or "padding") with
  seqlens_q / seqlens_kv counted from it, when every sequence's valid tokens are one contiguous
  run (left or right padding) and the runs line up with one of the two diagonals. Left padding
  is rolled to row 0 before the kernel and back after it (cuDNN's padding masks mean "the
  first seqlens[b] rows are valid"). Query rows that see no key (left padding) come out as
  zeros, as with "sdpa"; right-padding query rows see every key before them, as with "sdpa".
- sliding window w (transformers: key visible iff kv > q - w, so w keys including the query's
  own) -> window_size=(w - 1, 0) on the same diagonal; dropped when it cannot cut anything
  (Sq <= w top-left, Skv <= w bottom-right).
- attention sinks (gpt-oss `s_aux`) -> softmax="learnable", sink=s_aux.
- logit soft-capping (Gemma 2 `attn_logit_softcapping`): cuDNN has none -> the float32
  reference (`reference.py`), with the same mask mapping, logged once.
- anything else (packed sequences, chunked attention, image-token overlays, holes in the 2D
  mask, a 2D mask under torch.compile, a model asking for a materialised mask) -> the dense
  "sdpa" mask and torch SDPA, logged once with the reason.

`report()` and `configs_from_hf()` need neither torch nor transformers for a dict, a JSON string
or a config.json path.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Sequence

from fusedattn_select.config import AttnConfig
from fusedattn_select.dtypes import DTYPES
from fusedattn_select.errors import ConfigError, FusedAttnSelectError
from fusedattn_select.types import Backend

if TYPE_CHECKING:
    from torch import Tensor

    from fusedattn_select.selection.selector import Selector
    from fusedattn_select.types import Selection

log = logging.getLogger("fusedattn_select")

ATTN_IMPLEMENTATION = "fusedattn"

__all__ = [
    "ATTN_IMPLEMENTATION",
    "CudnnMask",
    "LayerReport",
    "MaskNotExpressible",
    "configs_from_hf",
    "cudnn_mask",
    "fusedattn_attention",
    "fusedattn_mask",
    "format_report",
    "register",
    "report",
]


class MaskNotExpressible(FusedAttnSelectError):
    """A model's mask has no exact cuDNN description; the message says why."""


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


# ----- registration ------------------------------------------------------------------------------
class _Runtime(NamedTuple):
    """What the mask and attention functions call, imported once before any tracing: torch.compile
    cannot trace an import from transformers' lazy modules (a graph break, an error with fullgraph)."""

    masking_utils: Any
    sdpa_attention_forward: Callable
    dispatch_attention: Callable
    reference_attention: Callable


_runtime: _Runtime | None = None


def _load_runtime() -> _Runtime:
    global _runtime
    if _runtime is None:
        from transformers import masking_utils
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        from fusedattn_select.runtime.api import attention
        from fusedattn_select.runtime.reference import reference_attention

        _runtime = _Runtime(masking_utils, sdpa_attention_forward, attention, reference_attention)
    return _runtime


def register(name: str = ATTN_IMPLEMENTATION) -> str:
    """Register the "fusedattn" attention and mask functions with transformers; returns the name.

    Idempotent. Afterwards `attn_implementation=name` works in `from_pretrained` / `from_config` /
    `model.set_attn_implementation`.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    _load_runtime()
    AttentionInterface.register(name, fusedattn_attention)
    AttentionMaskInterface.register(name, fusedattn_mask)
    return name


# ----- mask mapping (pure: no transformers needed) -------------------------------------------------
def _window(sliding_window: int | None, visible_span: int) -> tuple[int, int]:
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
        return CudnnMask("causal", _window(sliding_window, q_length), q_length, kv_length)
    if diagonal == kv_length - q_length:
        return CudnnMask("causal_bottom_right", _window(sliding_window, kv_length), q_length, kv_length)
    if 0 < diagonal < kv_length - q_length:
        # A static cache not yet full: keys past the last query's position are empty slots no query
        # sees, i.e. padding, and the diagonal is bottom-right of the keys that remain.
        return CudnnMask(
            "padding_causal_bottom_right", _window(sliding_window, diagonal + q_length), q_length, kv_length,
            seqlens_q=_full_lengths(batch_size, q_length, device),
            seqlens_kv=_full_lengths(batch_size, diagonal + q_length, device),
        )
    raise MaskNotExpressible(
        f"the causal diagonal (query offset - key offset = {diagonal}) is neither top-left (0) nor "
        f"within the keys (Sq={q_length}, Skv={kv_length})"
    )


def _runs(valid: "Tensor") -> tuple["Tensor", "Tensor", "Tensor"]:
    """Per row of a (B, S) bool tensor: start and length of its valid tokens, and whether they are
    one contiguous run."""
    import torch

    count = valid.sum(-1)
    start = torch.where(count > 0, valid.to(torch.int32).argmax(-1), torch.zeros_like(count))
    positions = torch.arange(valid.shape[-1], device=valid.device)
    run = (positions >= start[:, None]) & (positions < (start + count)[:, None])
    return start, count, (valid == run).all(-1)


def cudnn_mask(
    *,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    causal: bool = True,
    sliding_window: int | None = None,
    padding_mask: "Tensor | None" = None,
    batch_size: int = 1,
    device: Any = "cpu",
) -> CudnnMask:
    """Map a transformers mask description to cuDNN's, or raise MaskNotExpressible.

    `q_offset` / `kv_offset` are the absolute positions of query row 0 and key row 0 (transformers'
    mask arguments); `sliding_window` is transformers' (key visible iff kv > q - w);
    `padding_mask` is the 2D (B, positions) mask over absolute positions, True for real tokens.
    With a padding mask this reads one small tensor back to the host (as transformers' own "sdpa"
    mask function does to decide whether it may skip the mask).
    """
    import torch

    diagonal = q_offset - kv_offset
    if not causal and sliding_window is not None:
        raise MaskNotExpressible("a bidirectional sliding window is not mapped to cuDNN")
    if padding_mask is None:
        return _unpadded(q_length, kv_length, diagonal, causal, sliding_window, batch_size, device)

    mask = padding_mask.to(torch.bool)
    needed = kv_offset + kv_length
    if mask.shape[-1] < needed:
        # Positions past the 2D mask are padding (transformers pads it with False the same way).
        mask = torch.nn.functional.pad(mask, (0, needed - mask.shape[-1]))
    batch_size = mask.shape[0]
    kv_valid = mask[:, kv_offset:needed]
    kv_start, kv_count, kv_contiguous = _runs(kv_valid)
    if causal and q_offset + q_length <= mask.shape[-1]:
        q_start, q_count, q_contiguous = _runs(mask[:, q_offset:q_offset + q_length])
    else:
        # Queries are not positions of this mask (cross-attention) or the mask is bidirectional:
        # every query row is computed, which is always exact.
        q_start = torch.zeros_like(kv_start)
        q_count = torch.full_like(kv_count, q_length)
        q_contiguous = torch.ones_like(kv_contiguous)
    offset = q_start + diagonal - kv_start
    facts = torch.stack([
        (kv_contiguous & q_contiguous).all(),
        ((kv_count > 0) & (q_count > 0)).all(),
        ((kv_count == kv_length) & (q_count == q_length)).all(),
        (offset == 0).all(),
        (offset == kv_count - q_count).all(),
        (q_start != 0).any(),
        (kv_start != 0).any(),
    ]).tolist()
    contiguous, nonempty, unpadded, top_left, bottom_right, q_shifted, kv_shifted = facts
    if unpadded:
        return _unpadded(q_length, kv_length, diagonal, causal, sliding_window, batch_size, mask.device)
    if not contiguous:
        raise MaskNotExpressible("the 2D attention mask has holes (a sequence's tokens are not one contiguous run)")
    if not nonempty:
        raise MaskNotExpressible("a sequence of the batch has no unmasked token")
    if not causal:
        kind, window = "padding", (-1, -1)
    elif top_left:
        kind, window = "padding_causal", _window(sliding_window, q_length)
        # Query rows after a sequence's tokens (right padding) see every key before them, as with
        # "sdpa" and "eager"; only rows before them (left padding) see no key and come out zero.
        q_count = q_length - q_start
    elif bottom_right:
        kind, window = "padding_causal_bottom_right", _window(sliding_window, kv_length)
    else:
        raise MaskNotExpressible(
            "the padded sequences do not share one diagonal (top-left or bottom-right) with the cache offsets"
        )
    return CudnnMask(
        kind, window, q_length, kv_length,
        seqlens_q=q_count.to(torch.int32),
        seqlens_kv=kv_count.to(torch.int32),
        q_start=q_start if q_shifted else None,
        kv_start=kv_start if kv_shifted else None,
    )


# ----- the mask function registered with transformers --------------------------------------------
class _Pattern(NamedTuple):
    causal: bool
    sliding_window: int | None


def _is_tracing(tensor: Any = None) -> bool:
    """Whether tensors are symbolic here (torch.compile, jit, fx, CUDA graph capture): no host reads."""
    import torch

    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True  # decided before any import: a failing import cannot be traced
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return True
    try:
        from transformers.utils.import_utils import (
            is_tracing,  # also fx proxies and fake tensors
        )
    except ImportError:  # transformers 4.x
        return False
    return is_tracing(tensor)


def _recognise(mask_function: Callable, local_size: int | None, use_vmap: bool, config: Any,
               tracing: bool) -> _Pattern:
    """Which mask transformers asked for, from its mask function; checked by `_confirm` after."""
    masking_utils = (_runtime or _load_runtime()).masking_utils
    if use_vmap:
        raise MaskNotExpressible("the model adds its own mask function (or_mask_function / and_mask_function)")
    if mask_function is masking_utils.causal_mask_function:
        return _Pattern(True, None)
    if mask_function is getattr(masking_utils, "bidirectional_mask_function", None):  # transformers >= 5
        return _Pattern(False, None)
    # create_sliding_window_causal_mask passes and_masks(sliding_window_overlay(w), causal) with
    # local_size=w. Under torch.compile neither the closure's cells nor string methods on its name
    # can be traced (torch 2.11), so there the guess rests on local_size == config.sliding_window
    # alone; `_confirm` then evaluates the function to check it.
    sliding_window = getattr(config, "sliding_window", local_size) if config is not None else local_size
    name = "a traced function" if tracing else getattr(mask_function, "__qualname__", type(mask_function).__name__)
    and_mask = tracing or name.endswith("and_masks.<locals>.and_mask")
    if and_mask and local_size is not None and sliding_window == local_size:
        return _Pattern(True, int(local_size))
    raise MaskNotExpressible(
        f"mask function {name} (local_size={local_size}) is not causal, bidirectional or sliding-window causal"
    )


_SAMPLES: dict[tuple[bool, int | None], tuple[list[int], list[int], list[bool]]] = {}
_CONFIRMED: set[tuple[Callable, _Pattern]] = set()
_lock = threading.Lock()


def _samples(pattern: _Pattern) -> tuple[list[int], list[int], list[bool]]:
    """(query, key, expected) positions around every boundary of the pattern."""
    cached = _SAMPLES.get(pattern)
    if cached is not None:
        return cached
    w = pattern.sliding_window or 4
    queries = sorted({0, 1, 2, w - 1, w, w + 1, 2 * w, 2 * w + 1, 3 * w + 2})
    pairs = [(q, q + o) for q in queries for o in (-w - 1, -w, -w + 1, -1, 0, 1, 2) if q + o >= 0]
    expected = [
        (not pattern.causal or kv <= q) and (pattern.sliding_window is None or kv > q - pattern.sliding_window)
        for q, kv in pairs
    ]
    result = ([q for q, _ in pairs], [kv for _, kv in pairs], expected)
    _SAMPLES[pattern] = result
    return result


def _confirm(pattern: _Pattern, mask_function: Callable, device: Any, tracing: bool) -> None:
    """Evaluate the model's mask function where `pattern` has boundaries; raise if they differ.

    Under tracing the check cannot branch without a graph break: it becomes an asynchronous device
    assertion, so a wrong guess stops the program instead of computing a different mask.
    """
    import torch

    if not tracing and (mask_function, pattern) in _CONFIRMED:
        return
    queries, keys, expected = _samples(pattern)
    where = device if tracing else "cpu"
    q_idx = torch.tensor(queries, device=where)
    kv_idx = torch.tensor(keys, device=where)
    zeros = torch.zeros_like(q_idx)
    got = torch.as_tensor(mask_function(zeros, zeros, q_idx, kv_idx), device=where).expand(q_idx.shape)
    want = torch.tensor(expected, device=where)
    if tracing:
        torch._assert_async(
            (got == want).all(),
            f"fusedattn: the model's mask function is not the {pattern} mask it was taken for",
        )
        return
    if not torch.equal(got.to(torch.bool), want):
        raise MaskNotExpressible(f"the model's mask function differs from {pattern} at sampled positions")
    if getattr(mask_function, "__closure__", None) is None:
        with _lock:
            _CONFIRMED.add((mask_function, pattern))


_LOGGED: set[Any] = set()


def _log_once(key: Any, message: str, *args: Any) -> None:
    if _is_tracing():
        return
    with _lock:
        if key in _LOGGED:
            return
        _LOGGED.add(key)
    log.warning(message, *args)


def _query_positions(cache_position: "Tensor", tracing: bool) -> tuple[int, int]:
    """(q_length, q_offset) from transformers 4.x's `cache_position`, if it is one run of positions."""
    import torch

    if tracing:
        raise MaskNotExpressible("cache_position (transformers 4.x) cannot be read under tracing")
    first = int(cache_position[0])
    length = cache_position.shape[0]
    if not torch.equal(cache_position, torch.arange(first, first + length, device=cache_position.device)):
        raise MaskNotExpressible("the query positions (cache_position) are not one contiguous run")
    return length, first


def fusedattn_mask(
    batch_size: int,
    q_length: int | None = None,
    kv_length: int | None = None,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function: Callable | None = None,
    attention_mask: "Tensor | None" = None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    use_vmap: bool = False,
    device: Any = None,
    config: Any = None,
    cache_position: "Tensor | None" = None,
    **kwargs: Any,
) -> "CudnnMask | Tensor | None":
    """transformers' mask-function protocol: a CudnnMask when exact, else the "sdpa" mask.

    transformers 5 passes q_length / q_offset; 4.x passes `cache_position` (the query positions).
    """
    masking_utils = (_runtime or _load_runtime()).masking_utils

    if mask_function is None:
        mask_function = masking_utils.causal_mask_function
    received = dict(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
        kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
        local_size=local_size, allow_is_causal_skip=allow_is_causal_skip,
        allow_is_bidirectional_skip=allow_is_bidirectional_skip, use_vmap=use_vmap, device=device,
        config=config, cache_position=cache_position, **kwargs,
    )
    if device is None:
        device = cache_position.device if cache_position is not None else "cpu"
    try:
        tracing = _is_tracing(attention_mask)
        pattern = _recognise(mask_function, local_size, use_vmap, config, tracing)
        if pattern.causal and not allow_is_causal_skip:
            raise MaskNotExpressible(
                "the model asks for a materialised causal mask (packed sequences, block masks, or a "
                "compiled decode step with a static cache)"
            )
        if not pattern.causal and not allow_is_bidirectional_skip:
            raise MaskNotExpressible("the model asks for a materialised bidirectional mask")
        if q_length is None:
            q_length, q_offset = _query_positions(cache_position, tracing)
        offsets = []
        for name, value in (("query offset", q_offset), ("key offset", kv_offset)):
            if not isinstance(value, int):
                if tracing:
                    raise MaskNotExpressible(f"the cache's {name} is a tensor, which tracing cannot read")
                value = int(value)
            offsets.append(value)
        if attention_mask is not None and tracing:
            raise MaskNotExpressible(
                "a 2D padding mask cannot be inspected under torch.compile / CUDA graph capture "
                "without a graph break"
            )
        _confirm(pattern, mask_function, device, tracing)
        return cudnn_mask(
            q_length=q_length, kv_length=kv_length, q_offset=offsets[0], kv_offset=offsets[1],
            causal=pattern.causal, sliding_window=pattern.sliding_window, padding_mask=attention_mask,
            batch_size=batch_size, device=device,
        )
    except MaskNotExpressible as why:
        _log_once(
            ("mask", str(why)),
            "fusedattn: %s; this mask is materialised densely and its layers run on torch SDPA", why,
        )
        # Only what the caller passed: the two transformers generations take different arguments.
        return masking_utils.sdpa_mask(**{k: v for k, v in received.items() if v is not None})


# ----- the attention function registered with transformers ---------------------------------------
def _roll_rows(x: "Tensor", start: "Tensor") -> "Tensor":
    """Row i of sequence b becomes row (i + start[b]) mod S of (B, H, S, D) `x`: a per-sequence roll."""
    import torch

    length = x.shape[2]
    rows = (torch.arange(length, device=x.device)[None, :] + start.to(x.device)[:, None]) % length
    return torch.gather(x, 2, rows[:, None, :, None].expand(x.shape[0], x.shape[1], length, x.shape[3]))


def _mask_without_tensor(query: "Tensor", key: "Tensor", is_causal: bool | None, module: Any) -> CudnnMask:
    # No mask from the model: what attn_implementation="sdpa" does with attention_mask=None, i.e.
    # causal (top-left) unless there is a single query row or the module is not causal.
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q_length, kv_length = query.shape[2], key.shape[2]
    kind = "causal" if causal and q_length > 1 else "no_mask"
    return CudnnMask(kind, (-1, -1), q_length, kv_length)


def _dense_attention(module: Any, query: "Tensor", key: "Tensor", value: "Tensor", mask: "Tensor",
                     dropout: float, scaling: float | None, softcap: float | None, sinks: "Tensor | None",
                     is_causal: bool | None, **kwargs: Any) -> tuple["Tensor", None]:
    import torch

    runtime = _runtime or _load_runtime()
    if not softcap and sinks is None:
        return runtime.sdpa_attention_forward(
            module, query, key, value, mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )

    bias = mask
    if mask.dtype == torch.bool:
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(~mask, float("-inf"))
    out = runtime.reference_attention(
        query, key, value, bias=bias, attn_scale=scaling, dropout=dropout, softcap=softcap or None,
        softmax="learnable" if sinks is not None else "vanilla", sink=sinks,
    )
    return out.transpose(1, 2).contiguous(), None


def fusedattn_attention(
    module: Any,
    query: "Tensor",
    key: "Tensor",
    value: "Tensor",
    attention_mask: "CudnnMask | Tensor | None",
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: "Tensor | None" = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple["Tensor", None]:
    """transformers' attention-function protocol: (B, H, S, D) inputs -> ((B, Sq, H, Dv), None).

    The mask, not `sliding_window`, says which keys a query sees (as with "sdpa"); `s_aux` are
    gpt-oss attention sinks; `softcap` runs the float32 reference (cuDNN has no soft-capping).
    """
    import torch

    if kwargs.get("output_attentions", False):
        _log_once("output_attentions", "fusedattn: output_attentions=True is not supported; attention weights are None")
    if attention_mask is None:
        plan = _mask_without_tensor(query, key, is_causal, module)
    elif isinstance(attention_mask, CudnnMask):
        plan = attention_mask
        if (query.shape[2], key.shape[2]) != (plan.q_length, plan.kv_length):
            raise ValueError(
                f"fusedattn: the mask was built for Sq={plan.q_length}, Skv={plan.kv_length} but the "
                f"layer has Sq={query.shape[2]}, Skv={key.shape[2]}"
            )
    else:
        return _dense_attention(
            module, query, key, value, attention_mask, dropout, scaling, softcap, s_aux, is_causal, **kwargs
        )

    if plan.q_start is not None:
        query = _roll_rows(query, plan.q_start)
    if plan.kv_start is not None:
        key, value = _roll_rows(key, plan.kv_start), _roll_rows(value, plan.kv_start)
    options = dict(
        mask=plan.mask, window_size=plan.window_size, attn_scale=scaling, dropout=dropout,
        softmax="learnable" if s_aux is not None else "vanilla", sink=s_aux,
        seqlens_q=plan.seqlens_q, seqlens_kv=plan.seqlens_kv,
    )
    runtime = _runtime or _load_runtime()
    if softcap:
        _log_once(
            ("softcap", softcap),
            "fusedattn: attention logit soft-capping (softcap=%s) has no cuDNN equivalent; these layers run "
            "on the float32 reference", softcap,
        )
        out = runtime.reference_attention(query, key, value, softcap=softcap, **options)
    else:
        out = runtime.dispatch_attention(
            query, key, value, layout="bhsd", deterministic=torch.are_deterministic_algorithms_enabled(), **options
        )
    if plan.q_start is not None:
        out = _roll_rows(out, -plan.q_start)
    return out.transpose(1, 2).contiguous(), None


# ----- per-layer report --------------------------------------------------------------------------
# Model types whose every attention layer has learnable sinks (transformers has no config flag).
SINK_MODEL_TYPES = frozenset({"gpt_oss"})
# Softmax-attention layer types of transformers' `config.layer_types`; others (mamba, conv,
# linear_attention, ...) are not attention problems and are left out of the report.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
_DTYPE_ALIASES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "torch.bfloat16": "bf16", "torch.float16": "fp16",
}
DEFAULT_REPORT_SEQLEN = 4096


class _ConfigView:
    """Attribute access over a PretrainedConfig or a plain dict, text sub-config first."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def get(self, name: str, default: Any = None) -> Any:
        if isinstance(self._source, Mapping):
            value = self._source.get(name, default)
        else:
            value = getattr(self._source, name, default)
        return default if value is None else value


def _json_source(text: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError("hf_config", text[:60], f"is neither a config.json path nor JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise ConfigError("hf_config", text[:60], "must be a JSON object")
    return data


def _as_dict_source(source: Any) -> Any:
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError("hf_config", str(source), "no such config.json file or directory")
        return _json_source(path.read_text())
    if isinstance(source, str):
        return _json_source(source)
    return source


def _hf_config(source: Any) -> _ConfigView:
    """A view of the text-model config from any accepted source."""
    source = _as_dict_source(source)
    if isinstance(source, Mapping):
        try:
            # transformers derives fields in __init__ (layer_types, per-layer sliding windows).
            from transformers import AutoConfig

            source = AutoConfig.for_model(**source)
        except (ImportError, ValueError, KeyError, TypeError):
            # No transformers, or a model type it does not know: read the dict as it is.
            source = dict(source.get("text_config") or source) if "num_attention_heads" not in source else source
    if not isinstance(source, Mapping):
        if hasattr(source, "config") and not hasattr(source, "num_attention_heads"):
            source = source.config  # a model
        if hasattr(source, "get_text_config"):
            source = source.get_text_config()
    view = _ConfigView(source)
    if view.get("num_attention_heads") is None or view.get("num_hidden_layers") is None:
        raise ConfigError(
            "hf_config", type(source).__name__,
            "has no num_attention_heads / num_hidden_layers (not a transformer language-model config)",
        )
    return view


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_ALIASES.get(str(dtype), str(dtype))
    if name not in DTYPES:
        raise ConfigError("dtype", dtype, "must be one of " + ", ".join(DTYPES))
    return name


def _layer_types(view: _ConfigView) -> list[str]:
    types = view.get("layer_types")
    layers = int(view.get("num_hidden_layers"))
    if types:
        return list(types)
    sliding = view.get("sliding_window") is not None and view.get("use_sliding_window", True) is not False
    return ["sliding_attention" if sliding else "full_attention"] * layers


@dataclass(frozen=True)
class LayerReport:
    """One distinct attention problem of a model and the layers that share it.

    `config` is the problem as "fusedattn" runs it (window dropped where it cannot cut, sinks as
    softmax="learnable"); `backend` and `reason` come from `select(config)`, unless the
    integration itself runs the layers elsewhere (soft-capping, chunked attention), in which case
    `backend` is NONE and `reason` says where they run. `reasons` has one line per rejection.
    """

    name: str
    layers: tuple[int, ...]
    layer_type: str
    config: AttnConfig
    backend: Backend
    reason: str
    reasons: tuple[str, ...] = ()
    sliding_window: int | None = None
    softcap: float | None = None
    sinks: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "layers": list(self.layers), "layer_type": self.layer_type,
            "num_heads_q": self.config.num_heads_q, "num_heads_kv": self.config.num_heads_kv,
            "head_dim_qk": self.config.head_dim_qk, "head_dim_v": self.config.resolved_head_dim_v,
            "window_size": list(self.config.window_size), "sliding_window": self.sliding_window,
            "softcap": self.softcap, "sinks": self.sinks, "backend": self.backend.value,
            "reason": self.reason, "reasons": list(self.reasons), "config": self.config.to_dict(),
        }


class _LayerProblem(NamedTuple):
    name: str
    layer_type: str
    config: AttnConfig
    layers: list[int]
    sliding_window: int | None
    softcap: float | None
    sinks: bool
    integration_reasons: tuple[str, ...]


def _layer_problems(view: _ConfigView, batch_size: int, seqlen: int | None, is_training: bool,
                    dtype: Any) -> list[_LayerProblem]:
    heads_q = int(view.get("num_attention_heads"))
    heads_kv = int(view.get("num_key_value_heads", heads_q))
    if view.get("qk_rope_head_dim") is not None and view.get("v_head_dim") is not None:
        # Multi-head latent attention (DeepSeek): Q/K carry a no-position and a rotary part.
        head_dim_qk = int(view.get("qk_nope_head_dim", 0)) + int(view.get("qk_rope_head_dim"))
        head_dim_v = int(view.get("v_head_dim"))
    else:
        head_dim_qk = int(view.get("head_dim") or int(view.get("hidden_size")) // heads_q)
        head_dim_v = head_dim_qk
    if seqlen is None:
        seqlen = min(int(view.get("max_position_embeddings", DEFAULT_REPORT_SEQLEN)), DEFAULT_REPORT_SEQLEN)
    scalar = view.get("query_pre_attn_scalar")
    attn_scale = float(scalar) ** -0.5 if scalar is not None else None
    causal = view.get("is_causal", True) is not False and not view.get("use_bidirectional_attention", False)
    sinks = view.get("model_type") in SINK_MODEL_TYPES
    softcap = view.get("attn_logit_softcapping")
    softcap = float(softcap) if softcap else None
    dropout = float(view.get("attention_dropout", 0.0)) if is_training else 0.0
    qkv_dtype = _dtype_name(dtype)

    groups: dict[tuple, _LayerProblem] = {}
    for index, layer_type in enumerate(_layer_types(view)):
        if layer_type not in ATTENTION_LAYER_TYPES:
            continue
        window = view.get("sliding_window") if layer_type == "sliding_attention" else None
        window = int(window) if window is not None else None
        reasons: list[str] = []
        if softcap:
            reasons.append(
                f"attn_logit_softcapping={softcap:g}: cuDNN has no logit soft-capping; runs on the float32 reference"
            )
        if layer_type == "chunked_attention":
            reasons.append(
                f"chunked attention (attention_chunk_size={view.get('attention_chunk_size')}) has no cuDNN "
                "mask; runs on torch SDPA with a dense mask"
            )
        config = AttnConfig(
            batch_size=batch_size, num_heads_q=heads_q, num_heads_kv=heads_kv, seqlen_q=seqlen,
            seqlen_kv=seqlen, head_dim_qk=head_dim_qk, head_dim_v=head_dim_v, qkv_dtype=qkv_dtype,
            mask="causal" if causal else "no_mask",
            window_size=_window(window, seqlen) if causal else (-1, -1),
            softmax="learnable" if sinks else "vanilla", dropout=dropout, attn_scale=attn_scale,
            is_training=is_training,
        )
        name = layer_type + ("+sinks" if sinks else "") + ("+softcap" if softcap else "")
        key = (name, config, window)
        if key not in groups:
            groups[key] = _LayerProblem(name, layer_type, config, [], window, softcap, sinks, tuple(reasons))
        groups[key].layers.append(index)
    return list(groups.values())


def layer_problems(
    config: Any, *, batch_size: int = 1, seqlen: int | None = None, is_training: bool = True, dtype: Any = "bf16",
) -> list[tuple[str, AttnConfig, list[int], tuple[str, ...]]]:
    """Like `configs_from_hf`, plus the reasons this integration cannot run a layer fused at all
    (soft-capping, chunked attention) whatever cuDNN answers for its AttnConfig."""
    view = _hf_config(config)
    return [
        (p.name, p.config, list(p.layers), tuple(p.integration_reasons))
        for p in _layer_problems(view, batch_size, seqlen, is_training, dtype)
    ]


def configs_from_hf(
    config: Any, *, batch_size: int = 1, seqlen: int | None = None, is_training: bool = True, dtype: Any = "bf16",
) -> list[tuple[str, AttnConfig, list[int]]]:
    """The distinct attention problems of a Hugging Face model config: (layer name, problem, layers).

    `config` is a PretrainedConfig, a model, a path to config.json (or its directory), a JSON
    string or a dict. `seqlen` defaults to min(max_position_embeddings, 4096). Layer names are
    the config's layer type plus "+sinks" / "+softcap" where they apply.
    """
    view = _hf_config(config)
    return [(p.name, p.config, list(p.layers)) for p in _layer_problems(view, batch_size, seqlen, is_training, dtype)]


def report(
    model_or_config: Any, batch_size: int = 1, seqlen: int | None = None, is_training: bool = True,
    dtype: Any = "bf16", *, selector: "Selector | None" = None,
) -> list[LayerReport]:
    """Which backend runs each distinct attention layer of a model, and why, before running it.

    Accepts what `configs_from_hf` accepts. `selector` defaults to the process-wide one
    (`fusedattn_select.select`); pass another to answer from a snapshot.
    """
    from fusedattn_select.selection.selector import select

    view = _hf_config(model_or_config)
    rows = []
    for problem in _layer_problems(view, batch_size, seqlen, is_training, dtype):
        if problem.integration_reasons:
            backend, reasons = Backend.NONE, problem.integration_reasons
        else:
            selection: Selection = selector.select(problem.config) if selector is not None else select(problem.config)
            backend, reasons = selection.backend, selection.reasons
        rows.append(LayerReport(
            name=problem.name, layers=tuple(problem.layers), layer_type=problem.layer_type,
            config=problem.config, backend=backend, reason="; ".join(reasons), reasons=reasons,
            sliding_window=problem.sliding_window,
            softcap=problem.softcap, sinks=problem.sinks,
        ))
    return rows


def _layer_ranges(layers: Sequence[int]) -> str:
    parts: list[str] = []
    start = previous = None
    for index in list(layers) + [None]:
        if start is not None and index == previous + 1:
            previous = index
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = index
    return ",".join(parts)


def format_report(rows: Sequence[LayerReport]) -> str:
    """A table: one line per distinct layer problem, then its reason when no backend runs it."""
    header = ["layers", "type", "heads q/kv", "head dim", "window", "seqlen", "backend"]
    table = [header]
    for row in rows:
        cfg = row.config
        dims = str(cfg.head_dim_qk)
        if cfg.resolved_head_dim_v != cfg.head_dim_qk:
            dims += f"/{cfg.resolved_head_dim_v}"
        window = "-" if row.sliding_window is None else f"{row.sliding_window} -> {list(cfg.window_size)}"
        table.append([
            _layer_ranges(row.layers), row.name, f"{cfg.num_heads_q}/{cfg.num_heads_kv}", dims, window,
            f"{cfg.seqlen_q}", row.backend.value,
        ])
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = []
    for position, line in enumerate(table):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
        if position:
            lines.extend(f"    reason: {reason}" for reason in rows[position - 1].reasons)
    return "\n".join(lines)
