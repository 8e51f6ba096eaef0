"""Tensor layouts on the torch side: the caller's dim order, logical BHSD views, and the memory
layout the kernels run with, read from the strides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from fusedattn_select.layouts import FORMATS, SEPARATE_LAYOUTS, format_strides
from fusedattn_select.runtime.options import DEFAULT_LAYOUT

# The dim orders attention() takes (THD is ragged: not a dense 4-D order).
LAYOUTS = tuple(fmt for fmt in FORMATS if fmt != "thd")
# Permutation from the caller's dim order to logical (B, H, S, D), and back.
TO_BHSD = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}
FROM_BHSD = {"bshd": (0, 2, 1, 3), "sbhd": (2, 0, 1, 3), "bhsd": (0, 1, 2, 3)}


def tensor_subclass(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """The type name of the first of q, k and v that is a tensor subclass with a dispatch of its own (a DTensor,
    whose shape is the global one and whose data pointer is 0); "" where their memory is what they show, the only
    kind cuDNN's kernels take (plain tensors, and subclasses without a dispatch of their own: nn.Parameter)."""
    for t in (q, k, v):
        # (not tensors at all: the argument checks name them)
        if type(t) is not torch.Tensor and isinstance(t, torch.Tensor) and torch._C._dispatch_keys(t).has(_PYTHON_KEY):
            return type(t).__name__
    return ""


_PYTHON_KEY = torch._C.DispatchKey.Python  # what __torch_dispatch__ subclasses carry


# transpose(1, 2) is bshd's permutation in both directions, and "bhsd" needs none: cheaper than
# permute() on every call (docs/dispatch.md).
def bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The logical (B, H, S, D) view of a tensor in the caller's dim order (no copy; `t` itself for "bhsd")."""
    if layout == "bshd":
        return t.transpose(1, 2)
    return t if layout == "bhsd" else t.permute(TO_BHSD[layout])


def from_bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A logical (B, H, S, D) tensor in the caller's dim order (no copy; `t` itself for "bhsd")."""
    if layout == "bshd":
        return t.transpose(1, 2)
    return t if layout == "bhsd" else t.permute(FROM_BHSD[layout])


def in_caller_order(dims: tuple[int, ...], strides: tuple[int, ...], layout: str
                    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, strides) in the caller's dim order of logical (B, H, S, D) `dims` and `strides`."""
    order = FROM_BHSD[layout]
    return tuple(dims[i] for i in order), tuple(strides[i] for i in order)


def physical_format(t_bhsd: torch.Tensor, prefer: str = DEFAULT_LAYOUT) -> Optional[str]:
    """The memory layout ("bshd", "sbhd", "bhsd") of a logical-BHSD view, or None if none fits. Strides
    of size-1 dims are ignored; where several layouts fit, `prefer` (the caller's layout) wins."""
    shape = tuple(t_bhsd.shape)
    strides = t_bhsd.stride()
    for fmt in (prefer,) + tuple(f for f in LAYOUTS if f != prefer):
        canon = format_strides(fmt, *shape)
        if all(n == 1 or s == c for n, s, c in zip(shape, strides, canon)):
            return fmt
    return None


def empty_bhsd(dims: tuple[int, int, int, int], fmt: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised logical-BHSD tensor stored densely as `fmt`."""
    return torch.empty_strided(dims, format_strides(fmt, *dims), dtype=dtype, device=device)


@dataclass(frozen=True)
class Formats:
    """Memory layouts the kernels run with, and which inputs must be copied to get there."""

    q: str
    kv: str
    copy_q: bool
    copy_k: bool
    copy_v: bool

    @property
    def qkv_layout(self) -> str:
        return f"{self.q}_{self.kv}_{self.kv}"


def formats(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, layout: str) -> Formats:
    """The formats of logical-BHSD q, k, v: their own where a separate-tensor layout has them,
    else the caller's layout (K and V in different layouts run in the layout of K)."""
    fq, fk, fv = (physical_format(t, layout) for t in (qb, kb, vb))
    q_fmt = fq or layout
    kv_fmt = fk or fv or q_fmt
    if f"{q_fmt}_{kv_fmt}_{kv_fmt}" not in SEPARATE_LAYOUTS:
        kv_fmt = q_fmt
    return Formats(q_fmt, kv_fmt, fq != q_fmt, fk != kv_fmt, fv != kv_fmt)
