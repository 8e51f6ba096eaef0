"""Running a call through its bucket plan: the ragged (THD) padding-mask graph built at the bucket's
batch size and lengths, bound to the caller's tensors held in contiguous BSHD memory (offsets and
lengths, K and V read in place as rows of longer buffers (`kv_steps`), and why training binds
contiguous memory: docs/shape-buckets.md, its opening section)."""

from __future__ import annotations

import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import torch

from fusedattn_select.buckets import RAGGED_OFFSET_LIMIT
from fusedattn_select.runtime.plans import Plan
from fusedattn_select.runtime.streams import persistent

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
    # Elements between the starts of consecutive sequences of K (V) where they are rows of longer
    # BSHD buffers (kv_steps); 0: contiguous BSHD memory.
    k_step: int = 0
    v_step: int = 0




def offsets_fit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_step: int = 0, v_step: int = 0) -> bool:
    """Whether every ragged offset of a call fits the graphs' int32 offsets: at most the element count of
    q, k, v and the output (q's shape, v's head dim), or batch x step for K and V read as rows of longer buffers."""
    o_numel = q.numel() // max(q.shape[-1], 1) * v.shape[-1]
    batch = q.shape[0]
    return max(q.numel(), k.numel(), v.numel(), o_numel, batch * k_step, batch * v_step) < RAGGED_OFFSET_LIMIT


def _row_step(t_bhsd: torch.Tensor) -> int:
    """The batch stride of a logical-BHSD tensor whose sequences are BSHD rows (heads d apart,
    tokens h * d apart) of a longer buffer; 0 where it is contiguous BSHD or not such rows."""
    b, h, s, d = t_bhsd.shape
    batch, head, token, element = t_bhsd.stride()
    rows = (element == 1 or d == 1) and (head == d or h == 1) and (token == h * d or s == 1)
    return batch if b > 1 and rows and batch > s * h * d else 0


def kv_steps(k_bhsd: torch.Tensor, v_bhsd: torch.Tensor) -> tuple[int, int]:
    """(k_step, v_step) of a forward call whose K and V are rows of longer BSHD buffers (a slice of
    a cache), read where they are; (0, 0) where either is contiguous BSHD or not such rows, or
    where K and V share their offsets (one head dim) but not their batch stride."""
    k_step, v_step = _row_step(k_bhsd), _row_step(v_bhsd)
    if not (k_step and v_step) or (k_bhsd.shape[3] == v_bhsd.shape[3] and k_step != v_step):
        return 0, 0
    return k_step, v_step


def _offsets(plan: Plan, offset_name: str, shape: Shape) -> tuple[tuple, list[int]]:
    """(sharing key, the (B+1) element offsets) of the sequences of one tensor of `plan`."""
    suffix = offset_name[len(_OFFSET_PREFIX):]
    tensor = _AXIS_TENSOR.get(suffix, suffix)
    token_stride = plan.specs[tensor].strides[2]  # logical (B, H, S, D): the sequence stride
    seqlen = shape.seqlen_q if tensor in _QUERY_AXIS else shape.seqlen_kv
    slots = plan.specs[offset_name].dims[0]
    step = (shape.k_step if tensor == "k" else shape.v_step if tensor == "v" else 0) or seqlen * token_stride
    batch = shape.batch
    return ("offsets", slots, step, batch), [i * step for i in range(batch)] + [batch * step] * (slots - batch)


def bindings(plans: Sequence[Plan], shape: Shape, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """For each plan, the offset and length tensors that run `shape` through it (equal tensors shared between the
    plans, all made in one transfer; plans never write them). ValueError where an offset does not fit int32."""
    keys: list[dict[str, tuple]] = []
    new: dict[tuple, list[int]] = {}
    for plan in plans:
        if (shape.k_step or shape.v_step) and "dK" in plan.specs:
            raise ValueError("K and V read as rows of longer buffers bind forward plans only (dK and dV "
                             "share their offsets)")
        slots = plan.specs["seq_len_q"].dims[0]
        named: dict[str, tuple] = {}
        for name in plan.inputs:
            if name.startswith(_OFFSET_PREFIX):
                named[name], values = _offsets(plan, name, shape)
                new[named[name]] = values
        for name, length in (("seq_len_q", shape.seqlen_q), ("seq_len_kv", shape.seqlen_kv)):
            named[name] = ("lengths", slots, shape.batch, length)
            new[named[name]] = [length] * shape.batch + [0] * (slots - shape.batch)
        keys.append(named)
    made = _upload(new, device)
    return [{name: made[key] for name, key in named.items()} for named in keys]


def _upload(new: dict[tuple, list[int]], device: torch.device) -> dict[tuple, torch.Tensor]:
    """`new` as (n, 1, 1, 1) int32 tensors on `device`, each 16-byte aligned, from one host-to-device
    copy (a new shape costs one transfer, not a few kernels per tensor)."""
    flat = array.array("i")  # int32: an offset that does not fit raises OverflowError here
    spans = []
    for key, values in new.items():
        spans.append((key, len(flat), len(values)))
        try:
            flat.extend(values)
        except OverflowError:  # callers check offsets_fit first
            raise ValueError(f"a ragged offset of {max(values)} elements does not fit the graph's int32 "
                             "offsets") from None
        flat.extend([0] * (-len(flat) % 4))
    # From pageable memory without waiting: CUDA stages the host values before the call returns and
    # does not wait for queued work, where a blocking copy waits for the whole queue (docs/shape-buckets.md).
    whole = persistent(lambda: torch.frombuffer(flat, dtype=torch.int32).to(device, non_blocking=True), device)
    return {key: whole.as_strided((count, 1, 1, 1), (1, 1, 1, 1), start) for key, start, count in spans}


def caller_lengths(plan: Plan, seqlens: Optional[torch.Tensor], name: str) -> Optional[torch.Tensor]:
    """The caller's (b,) padding-mask lengths as the plan's (B, 1, 1, 1) int32, unused slots 0."""
    if seqlens is None:
        return None
    slots = plan.specs[name].dims[0]
    lengths = seqlens.reshape(-1).to(torch.int32)
    return torch.nn.functional.pad(lengths, (0, slots - lengths.numel())).view(slots, 1, 1, 1)


def bshd_memory(t_bhsd: torch.Tensor, step: int = 0) -> torch.Tensor:
    """A logical-BHSD tensor as (B, S, H, D) memory: itself where it is contiguous, or rows `step`
    elements apart (a call's k_step / v_step); else a contiguous copy."""
    t = t_bhsd.transpose(1, 2)
    return t if t.is_contiguous() or (step and _row_step(t_bhsd) == step) else t.contiguous()


def empty_like_bshd(t_bshd: torch.Tensor, head_dim: int, heads: int, zeroed: bool) -> torch.Tensor:
    """An output (B, S, H, head_dim) in BSHD memory, zeroed where padding leaves rows unwritten."""
    b, s = t_bshd.shape[:2]
    make = torch.zeros if zeroed else torch.empty
    return make(b, s, heads, head_dim, dtype=t_bshd.dtype, device=t_bshd.device)
