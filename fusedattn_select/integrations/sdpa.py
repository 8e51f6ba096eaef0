"""A drop-in for torch.nn.functional.scaled_dot_product_attention that runs the selected fused backend.

    from fusedattn_select.integrations.sdpa import scaled_dot_product_attention, install, uninstall, routed

`scaled_dot_product_attention` has torch's signature and semantics ((N, H, L, E) inputs). A call
that maps exactly onto attention() runs there (fused when the selector picks F16, else attention()'s
fallback, logged once per problem: one that attention() already logged is not logged again here):

    is_causal=True                 -> mask="causal" (top-left aligned, as torch's is_causal)
    a floating-point attn_mask     -> an additive post-scale bias (4-D after broadcasting)
    enable_gqa with fewer K/V heads -> grouped-query attention
    scale, dropout_p               -> attn_scale, dropout

Everything else goes to torch's own SDPA unchanged: boolean masks (a boolean mask's meaning depends
on its values, which cannot be read without a device sync), nested tensors (strided or jagged),
inputs that are not 4-D, masks that are not 2-D to 4-D, dtypes other than fp16/bf16, and arguments
torch itself rejects (so the error is torch's). As in torch, `scale` and `enable_gqa` are keyword-only.

`install()` makes `torch.nn.functional.scaled_dot_product_attention` this function (code that
looks the attribute up at call time, such as torch.nn.MultiheadAttention and Hugging Face's SDPA
attention, is routed; a name imported earlier with `from torch.nn.functional import ...` is not);
`uninstall()` restores what was there before; `routed()` routes inside a block. All three share one
lock-guarded state, in every thread: what was there before is saved once, when routing starts, and
put back when nothing asks for routing any more: after uninstall() (an explicit install() stays
until then, whatever routed() blocks open and close) and once the last open routed() block, in any
thread, has exited. An uninstall() while a routed() block is open takes effect when the last one
exits. Where other code has replaced the attribute since, its function is left in place.

This module is `fusedattn_select.integrations.sdpa`; with absolute imports, `import torch` here is PyTorch.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional

from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.runtime.api import attention
from fusedattn_select.runtime.fallback import torch_sdpa  # torch's own SDPA, never the patched attribute

__all__ = ["install", "is_installed", "routed", "scaled_dot_product_attention", "torch_sdpa"]

_FUSABLE_DTYPES = (torch.float16, torch.bfloat16)  # float32 has no fused kernel: straight to torch


def _maps_to_attention(query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: Any, is_causal: Any,
                       scale: Any, enable_gqa: Any) -> Optional[torch.Tensor]:
    """The bias attention() takes for this call (or a sentinel True for "no bias"); None when the
    call must go to torch's SDPA."""
    tensors = (query, key, value)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    if query.is_nested or key.is_nested or value.is_nested or (
            isinstance(attn_mask, torch.Tensor) and attn_mask.is_nested):
        return None  # nested (strided or jagged): torch's SDPA takes them, attention() does not
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return None
    if query.dtype not in _FUSABLE_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return None
    if key.device != query.device or value.device != query.device:
        return None
    (n, hq, lq, e), (nk, hk, s, ek), (nv, hv, sv, _) = query.shape, key.shape, value.shape
    if min(n, hq, lq, e, s) <= 0 or nk != n or nv != n or sv != s or hv != hk or ek != e:
        return None
    if hq != hk and not (enable_gqa is True and hq % hk == 0):
        return None
    if not isinstance(is_causal, bool) or not isinstance(enable_gqa, bool):
        return None
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        return None
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale) or scale <= 0):
        return None
    if attn_mask is None:
        return True  # type: ignore[return-value]
    if is_causal or not isinstance(attn_mask, torch.Tensor) or attn_mask.dtype != query.dtype:
        return None  # torch rejects both; bool masks are not mapped (see the module docstring)
    if not 2 <= attn_mask.dim() <= 4 or attn_mask.device != query.device:  # torch rejects 0-D, 1-D and 5-D
        return None
    bias = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    if any(m not in (1, t) for m, t in zip(bias.shape, (n, hq, lq, s))):
        return None
    return bias


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, *, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention, on the selected fused backend when the call
    maps onto attention() exactly, else torch's own SDPA (see the module docstring)."""
    bias = _maps_to_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if bias is None:
        return torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                          scale=scale, enable_gqa=enable_gqa)
    return attention(
        query, key, value, layout="bhsd", mask="causal" if is_causal else "no_mask",
        attn_scale=None if scale is None else float(scale), dropout=float(dropout_p),
        bias=None if bias is True else bias,
    )


# ----- routing torch.nn.functional.scaled_dot_product_attention ------------------------------------
@dataclass(eq=False)  # (hashed by identity: renew_locks_after_fork keeps it in a weak set)
class _Routing:
    """Who asks for the attribute to be routed, in every thread (read and changed under `lock`)."""

    original: Any = None      # what was there when routing started (saved once); None while not routing
    blocks: int = 0           # routed() blocks open, in all threads
    installed: bool = False   # install() called, and uninstall() not since

    def __post_init__(self) -> None:
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        self.lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there


_routing = _Routing()


def _route() -> None:
    """Make the attribute this module's function, saving what was there first (call under _routing.lock)."""
    current = torch.nn.functional.scaled_dot_product_attention
    if _routing.original is None:
        # Patched already though nothing here routes (the attribute assigned directly): torch's own.
        _routing.original = torch_sdpa if current is scaled_dot_product_attention else current
    torch.nn.functional.scaled_dot_product_attention = scaled_dot_product_attention


def _release() -> None:
    """Put the saved function back once neither install() nor an open routed() block asks for
    routing (call under _routing.lock); an attribute other code has replaced since is left as it is."""
    if _routing.installed or _routing.blocks:
        return
    if is_installed():  # routed by this module, or by assigning its function directly: torch's own then
        torch.nn.functional.scaled_dot_product_attention = _routing.original or torch_sdpa
    _routing.original = None


def is_installed() -> bool:
    return torch.nn.functional.scaled_dot_product_attention is scaled_dot_product_attention


def install() -> None:
    """Route torch.nn.functional.scaled_dot_product_attention through this module until uninstall()
    (idempotent; a routed() block exiting does not undo it)."""
    with _routing.lock:
        _route()
        _routing.installed = True


def uninstall() -> None:
    """Undo install(): restore the function it replaced, at once, or when the last open routed()
    block exits (a no-op when not installed)."""
    with _routing.lock:
        _routing.installed = False
        _release()


@contextlib.contextmanager
def routed() -> Iterator[None]:
    """Route torch.nn.functional.scaled_dot_product_attention through this module inside the block.
    Blocks may nest and overlap across threads: the attribute is restored when the last open block
    exits, unless install() was called (then it stays routed until uninstall())."""
    with _routing.lock:
        _route()
        _routing.blocks += 1
    try:
        yield
    finally:
        with _routing.lock:
            _routing.blocks -= 1
            _release()
