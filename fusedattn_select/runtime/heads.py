"""A decode step with keys and values in BHSD memory, run with its KV heads as batch (see
buckets.heads_as_batch, and docs/shape-buckets.md, 'Decode steps with BHSD keys and values run with
their KV heads as batch')."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from fusedattn_select.runtime.tensor_layouts import bhsd, from_bhsd, in_caller_order

Dims = tuple[int, int, int, int]


@dataclass(frozen=True)
class HeadsAsBatch:
    """The entry running a decode call with its heads as batch, and the views between the two."""

    entry: Any         # the runtime.entries.Entry of the heads-as-batch call
    q: Dims            # (B * Hkv, group, 1, D): views of the caller's tensors in BSHD order
    k: Dims
    v: Dims
    out: Dims          # (B, Hq, 1, Dv): the output viewed back in logical BHSD
    layout: str        # the caller's dim order


def _head_runs(t: torch.Tensor) -> bool:
    """Whether a logical-BHSD tensor's (sequence, head) pairs are evenly spaced runs of contiguous
    tokens: contiguous BHSD memory, or a slice of a longer BHSD buffer along the sequence."""
    b, h, s, d = t.shape
    batch, head, token, element = t.stride()
    return ((d == 1 or element == 1) and (s == 1 or token == d) and (h == 1 or head >= s * d)
            and (b == 1 or batch == h * head))


def views(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor) -> Optional[tuple[Dims, Dims, Dims, Dims]]:
    """(q, k, v, out) dims of the heads-as-batch call of logical-BHSD q, k, v, or None when their
    memory cannot be viewed that way (q's heads not contiguous rows, or k or v not `_head_runs`)."""
    b, hq, sq, d = qb.shape
    _, hkv, skv, _ = kb.shape
    dv = vb.shape[3]
    if sq != 1 or hq % hkv or not (_head_runs(kb) and _head_runs(vb)):
        return None
    q_strides = (hq * d, d, qb.stride(2), 1)
    if not all(n == 1 or a == w for n, a, w in zip(qb.shape, qb.stride(), q_strides)):
        return None
    rows = b * hkv
    return (rows, hq // hkv, 1, d), (rows, skv, 1, d), (rows, skv, 1, dv), (b, hq, 1, dv)


def caller_out(heads: HeadsAsBatch) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, strides) in the caller's dim order of the output the heads-as-batch call writes:
    (B, Hq, 1, Dv) in contiguous memory, the query group's rows of each KV head one after another."""
    _, hq, _, dv = heads.out
    return in_caller_order(heads.out, (hq * dv, dv, dv, 1), heads.layout)


def as_heads(heads: HeadsAsBatch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The caller's q, k, v as the heads-as-batch call's ("bshd")."""
    layout = heads.layout
    return bhsd(q, layout).view(heads.q), bhsd(k, layout).view(heads.k), bhsd(v, layout).view(heads.v)


def back(heads: HeadsAsBatch, out: torch.Tensor) -> torch.Tensor:
    """The heads-as-batch call's output as the caller's (its layout, head_dim_v last)."""
    out = out.view(heads.out)
    return from_bhsd(out, heads.layout)
