"""The mask function registered with transformers' `AttentionMaskInterface` as "fusedattn".

It recognises which mask transformers asked for from its mask function, confirms the guess by
evaluating that function at the pattern's boundaries, and returns a `CudnnMask` when the cuDNN
description is exact; otherwise it returns what transformers' "sdpa" mask function returns, and
logs why once. transformers calls it with keyword arguments only. torch is imported inside the
functions: the package imports without torch (for `report()`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.integrations.transformers.dependencies import loaded
from fusedattn_select.integrations.transformers.masks import (
    CudnnMask,
    MaskNotExpressible,
    cudnn_mask,
    tag,
    trackable,
)
from fusedattn_select.integrations.transformers.tracing import is_tracing, log_once

if TYPE_CHECKING:
    from torch import Tensor

# The keyword arguments read here besides the named parameters, and their values when absent
# (those of transformers' "sdpa" mask function; device None: cache_position's, else "cpu").
_MASK_DEFAULTS: dict[str, Any] = dict(
    local_size=None, allow_is_causal_skip=True, allow_is_bidirectional_skip=False, use_vmap=False, device=None,
    config=None, cache_position=None,
)


class _Pattern(NamedTuple):
    causal: bool
    sliding_window: int | None


_SAMPLES: dict[_Pattern, tuple[list[int], list[int], list[bool]]] = {}


class _Confirmed:
    """The (mask function, pattern) pairs `_confirm` has checked eagerly (`pairs`), added under `lock`."""

    def __init__(self) -> None:
        self.pairs: set[tuple[Callable, _Pattern]] = set()
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        self.lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there


_confirmed = _Confirmed()


def _recognise(mask_function: Callable, local_size: int | None, use_vmap: bool, config: Any,
               tracing: bool) -> _Pattern:
    """Which mask transformers asked for, from its mask function; checked by `_confirm` after."""
    masking_utils = loaded().masking_utils
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
    # Under tracing the window must be the config's own (a chunked-attention config, Llama 4's, has
    # no sliding_window but passes local_size); eagerly `_confirm` samples the function anyway.
    default = None if tracing else local_size
    sliding_window = getattr(config, "sliding_window", default) if config is not None else local_size
    name = "a traced function" if tracing else getattr(mask_function, "__qualname__", type(mask_function).__name__)
    # Eagerly the function must be exactly and_masks(sliding_window_overlay(local_size), causal): packed
    # sequences wrap it in another and_mask with the same local_size, whose restarts `_confirm`'s samples
    # near position 0 do not reach. (Under tracing transformers takes every call with position_ids as
    # packed and asks for a tensor, which is refused in fusedattn_mask.)
    and_mask = tracing or _is_sliding_causal(mask_function, local_size, masking_utils.causal_mask_function)
    if and_mask and local_size is not None and sliding_window == local_size:
        return _Pattern(True, int(local_size))
    raise MaskNotExpressible(
        f"mask function {name} (local_size={local_size}) is not causal, bidirectional or sliding-window causal"
    )


def _closure(function: Callable) -> dict[str, Any]:
    """The variables a Python function closes over, by name ({} for anything else)."""
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None)
    if code is None or cells is None:
        return {}
    try:
        return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}
    except ValueError:  # an empty cell
        return {}


def _is_sliding_causal(mask_function: Callable, local_size: int | None, causal: Callable) -> bool:
    """Whether `mask_function` is transformers' and_masks(sliding_window_overlay(local_size), causal)."""
    if not getattr(mask_function, "__qualname__", "").endswith("and_masks.<locals>.and_mask"):
        return False
    parts = _closure(mask_function).get("mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2 or causal not in parts:
        return False
    overlay = parts[0] if parts[1] is causal else parts[1]
    return (getattr(overlay, "__qualname__", "").endswith("sliding_window_overlay.<locals>.inner_mask")
            and _closure(overlay).get("sliding_window") == local_size)


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

    if not tracing and (mask_function, pattern) in _confirmed.pairs:
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
        with _confirmed.lock:
            _confirmed.pairs.add((mask_function, pattern))


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


def _host_offsets(q_offset: Any, kv_offset: Any, tracing: bool) -> tuple[int, int]:
    offsets = []
    for name, value in (("query offset", q_offset), ("key offset", kv_offset)):
        if not isinstance(value, int):
            if tracing:
                raise MaskNotExpressible(f"the cache's {name} is a tensor, which tracing cannot read")
            value = int(value)
        offsets.append(value)
    return offsets[0], offsets[1]


def fusedattn_mask(
    batch_size: int,
    q_length: int | None = None,
    kv_length: int | None = None,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function: Callable | None = None,
    attention_mask: "Tensor | None" = None,
    **kwargs: Any,
) -> "CudnnMask | Tensor | None":
    """transformers' mask-function protocol: a CudnnMask when exact, else the "sdpa" mask.

    transformers 5 passes q_length / q_offset; 4.x passes `cache_position` (the query positions).
    `kwargs` are the other keyword arguments of transformers' "sdpa" mask function (local_size,
    allow_is_causal_skip, allow_is_bidirectional_skip, use_vmap, device, config, cache_position,
    dtype, ...).
    """
    if isinstance(attention_mask, CudnnMask):  # prepared by generate() for this very step
        return attention_mask
    masking_utils = loaded().masking_utils
    if mask_function is None:
        mask_function = masking_utils.causal_mask_function
    received = dict(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
        kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
        **{**_MASK_DEFAULTS, **kwargs},
    )
    cache_position = received["cache_position"]
    device = received["device"]
    if device is None:
        device = cache_position.device if cache_position is not None else "cpu"
    tracing = is_tracing(attention_mask)
    try:
        pattern = _recognise(mask_function, received["local_size"], received["use_vmap"], received["config"], tracing)
        # transformers asks for the tensor where it may not skip the mask: a static cache's decode
        # step, packed sequences and block overlays (whose mask functions are refused above), and
        # models that edit their mask. The tensor is made as "sdpa" makes it; with more than one
        # query row it is tagged with the description (masks.tag), which the attention function
        # takes while the tensor is unchanged.
        wants_tensor = not received["allow_is_causal_skip" if pattern.causal else "allow_is_bidirectional_skip"]
        if wants_tensor and tracing:
            raise MaskNotExpressible("the model asks for a materialised mask, which cannot be described under tracing")
        if q_length is None:
            q_length, q_offset = _query_positions(cache_position, tracing)
        if wants_tensor and q_length == 1:
            # A decode step (a static cache's): the attention function runs the tensor's one row as
            # a bias, with no read back; describing it would read the 2D mask back every step. (Made
            # trackable, the bias is made once for the step's layers under torch.inference_mode too.)
            return trackable(_sdpa_mask(masking_utils, received))
        q_offset, kv_offset = _host_offsets(q_offset, kv_offset, tracing)
        if attention_mask is not None and tracing:
            raise MaskNotExpressible(
                "a 2D padding mask cannot be inspected under torch.compile / CUDA graph capture "
                "without a graph break"
            )
        _confirm(pattern, mask_function, device, tracing)
        description = cudnn_mask(
            q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
            causal=pattern.causal, sliding_window=pattern.sliding_window, padding_mask=attention_mask,
            batch_size=batch_size, device=device,
        )
        return tag(_sdpa_mask(masking_utils, received), description) if wants_tensor else description
    except MaskNotExpressible as why:
        dense = _sdpa_mask(masking_utils, received)
        if dense is None:
            # "sdpa" skips this mask as plain causal (or none): e.g. Llama 4's chunked mask while every key is
            # in one chunk. The attention function runs such a layer fused, so no fallback is logged.
            return None
        log_once(
            ("mask", str(why)),
            "fusedattn: %s; this mask is materialised densely and its layers run on torch SDPA (a decode "
            "step's single query row runs fused, its mask row as a bias)", why,
        )
        return dense if tracing else tag(dense, None)


def _sdpa_mask(masking_utils: Any, received: dict[str, Any]) -> "Tensor | None":
    """What transformers' "sdpa" mask function returns for the arguments the caller passed (the two
    transformers generations take different ones). Under torch.inference_mode it is made outside it, so that
    it has a version counter to show an edit by (masks.trackable would copy a dense mask of B x Sq x Skv)."""
    given = {k: v for k, v in received.items() if v is not None}
    import torch

    # (tracing first: dynamo refuses is_inference_mode_enabled)
    tracing = is_tracing(received.get("attention_mask")) or torch.compiler.is_compiling()
    if tracing or not torch.is_inference_mode_enabled():
        return masking_utils.sdpa_mask(**given)
    with torch.inference_mode(False), torch.no_grad():
        return masking_utils.sdpa_mask(**given)
