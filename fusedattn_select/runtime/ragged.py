"""Running a call through its bucket plan: the ragged (THD) padding-mask graph built at the bucket's
batch size and lengths, bound to the caller's tensors held in contiguous BSHD memory.

Each sequence i of a (b, s, h, d) tensor starts at element i * s * h * d (its ragged offset); the
bucket's unused batch slots start at the end and have length 0, so the kernels skip them. The
offsets and lengths of one shape are made once, on the device, when the shape is first seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from fusedattn_select.runtime.plans import Plan

# Graph tensors on the query axis; every other ragged tensor is on the key/value axis.
_QUERY_AXIS = frozenset({"q", "o", "dO", "dQ"})
_OFFSET_PREFIX = "ragged_offset_"
# Offset tensors name an axis ("q", "kv", "o") or, where a tensor's token stride differs from its
# axis's first tensor, the tensor itself ("v", "dQ", ...): the tensor whose token stride they use.
_AXIS_TENSOR = {"q": "q", "kv": "k", "o": "o"}


@dataclass(frozen=True)
class Shape:
    """The caller's dimensions a bucket plan runs: batch and query / key-value lengths."""

    batch: int
    seqlen_q: int
    seqlen_kv: int


def _offset_tensor_name(offset_name: str) -> str:
    suffix = offset_name[len(_OFFSET_PREFIX):]
    return _AXIS_TENSOR.get(suffix, suffix)


def _offsets(plan: Plan, offset_name: str, shape: Shape, device: torch.device, made: dict) -> torch.Tensor:
    """(B+1, 1, 1, 1) int32 element offsets of the sequences of one tensor of `plan`."""
    tensor = _offset_tensor_name(offset_name)
    token_stride = plan.specs[tensor].strides[2]  # logical (B, H, S, D): the sequence stride
    seqlen = shape.seqlen_q if tensor in _QUERY_AXIS else shape.seqlen_kv
    slots = plan.specs[offset_name].dims[0]
    step = seqlen * token_stride
    key = ("offsets", slots, step, shape.batch)
    if key not in made:  # tensors of equal token strides (q and dQ, o and dO, ...) share one
        if slots * step < 2 ** 31:  # two kernels: made for every new shape
            offsets = torch.arange(0, slots * step, step, device=device, dtype=torch.int32)
            made[key] = offsets.clamp_(max=shape.batch * step).view(slots, 1, 1, 1)
        else:
            index = torch.arange(slots, device=device, dtype=torch.int64).clamp_(max=shape.batch)
            made[key] = (index * step).to(torch.int32).view(slots, 1, 1, 1)
    return made[key]


def _lengths(slots: int, used: int, length: int, device: torch.device, made: dict) -> torch.Tensor:
    key = ("lengths", slots, used, length)
    if key not in made:
        lengths = torch.zeros(slots, 1, 1, 1, dtype=torch.int32, device=device)
        lengths[:used] = length
        made[key] = lengths
    return made[key]


def binding(plan: Plan, shape: Shape, device: torch.device, made: Optional[dict] = None) -> dict[str, torch.Tensor]:
    """The offset and length tensors that run `shape` through `plan` (made once per shape; `made`
    shares equal tensors between the plans of one shape, forward and backward). Read only: plans
    never write them."""
    made = {} if made is None else made
    feeds = {name: _offsets(plan, name, shape, device, made) for name in plan.inputs
             if name.startswith(_OFFSET_PREFIX)}
    slots = plan.specs["seq_len_q"].dims[0]
    feeds["seq_len_q"] = _lengths(slots, shape.batch, shape.seqlen_q, device, made)
    feeds["seq_len_kv"] = _lengths(slots, shape.batch, shape.seqlen_kv, device, made)
    return feeds


def caller_lengths(plan: Plan, seqlens: Optional[torch.Tensor], name: str) -> Optional[torch.Tensor]:
    """The caller's (b,) padding-mask lengths as the plan's (B, 1, 1, 1) int32, unused slots 0."""
    if seqlens is None:
        return None
    slots = plan.specs[name].dims[0]
    lengths = seqlens.reshape(-1).to(torch.int32)
    return torch.nn.functional.pad(lengths, (0, slots - lengths.numel())).view(slots, 1, 1, 1)


def bshd_memory(t_bhsd: torch.Tensor) -> torch.Tensor:
    """A logical-BHSD tensor as contiguous (B, S, H, D) memory: itself when it already is, else a copy."""
    t = t_bhsd.transpose(1, 2)
    return t if t.is_contiguous() else t.contiguous()


def empty_like_bshd(t_bshd: torch.Tensor, head_dim: int, heads: int, zeroed: bool) -> torch.Tensor:
    """An output (B, S, H, head_dim) in BSHD memory, zeroed where padding leaves rows unwritten."""
    b, s = t_bshd.shape[:2]
    make = torch.zeros if zeroed else torch.empty
    return make(b, s, heads, head_dim, dtype=t_bshd.dtype, device=t_bshd.device)
