"""The offsets and lengths that run a caller's shape through bucket plans (ragged.bindings).

The plans here are the declarations bindings() reads (input names and tensor specs), written out for
a bucket of B=4 sequences of 8 tokens, 2 query heads, 1 key/value head, head dim 4, in BSHD memory.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fusedattn_select.runtime import ragged
from fusedattn_select.runtime.plans import TensorSpec

I32 = torch.int32


def _spec(dims, strides, dtype=torch.bfloat16):
    return TensorSpec(tuple(dims), tuple(strides), dtype)


def _plan(names):
    # logical (B, H, S, D) over BSHD memory: token stride H * D
    specs = {"q": _spec((4, 2, 8, 4), (64, 4, 8, 1)), "k": _spec((4, 1, 8, 4), (32, 4, 4, 1)),
             "o": _spec((4, 2, 8, 4), (64, 4, 8, 1)), "dQ": _spec((4, 2, 8, 4), (64, 4, 8, 1)),
             "seq_len_q": _spec((4, 1, 1, 1), (1, 1, 1, 1), I32), "seq_len_kv": _spec((4, 1, 1, 1), (1, 1, 1, 1), I32)}
    for name in names:
        specs[name] = _spec((5, 1, 1, 1), (1, 1, 1, 1), I32)
    return SimpleNamespace(inputs=("q", "k", *names, "seq_len_q", "seq_len_kv"), specs=specs)


def test_offsets_step_by_the_callers_sequences_and_unused_slots_start_at_the_end():
    forward = _plan(["ragged_offset_q", "ragged_offset_kv"])
    (feeds,) = ragged.bindings([forward], ragged.Shape(3, 5, 6), torch.device("cpu"))
    assert feeds["ragged_offset_q"].flatten().tolist() == [0, 40, 80, 120, 120]  # 5 tokens x 8 elements
    assert feeds["ragged_offset_kv"].flatten().tolist() == [0, 24, 48, 72, 72]   # 6 tokens x 4 elements
    assert feeds["seq_len_q"].flatten().tolist() == [5, 5, 5, 0]
    assert feeds["seq_len_kv"].flatten().tolist() == [6, 6, 6, 0]
    for t in feeds.values():
        assert t.dtype == I32 and t.dim() == 4 and t.is_contiguous()
        assert t.data_ptr() % 16 == 0  # each starts on a 16-byte boundary of the one buffer


def test_forward_and_backward_share_equal_tensors():
    forward = _plan(["ragged_offset_q", "ragged_offset_kv", "ragged_offset_o"])
    backward = _plan(["ragged_offset_q", "ragged_offset_kv", "ragged_offset_o", "ragged_offset_dQ"])
    fwd, bwd = ragged.bindings([forward, backward], ragged.Shape(2, 7, 7), torch.device("cpu"))
    assert fwd["ragged_offset_q"] is fwd["ragged_offset_o"]  # q and o have one token stride
    assert bwd["ragged_offset_dQ"] is fwd["ragged_offset_q"] and bwd["seq_len_kv"] is fwd["seq_len_kv"]


def test_an_offset_beyond_int32_is_refused():
    plan = _plan(["ragged_offset_q"])
    plan.specs["q"] = _spec((4, 2, 8, 4), (2 ** 30, 4, 2 ** 28, 1))
    with pytest.raises(ValueError, match="int32"):
        ragged.bindings([plan], ragged.Shape(3, 5, 5), torch.device("cpu"))


def test_offsets_fit_counts_every_tensor_the_offsets_address():
    def meta(*shape):
        return torch.empty(shape, device="meta")

    assert ragged.offsets_fit(meta(4, 65536, 32, 128), meta(4, 65536, 8, 128), meta(4, 65536, 8, 128))
    assert not ragged.offsets_fit(meta(4, 65536, 64, 128), meta(4, 65536, 8, 128), meta(4, 65536, 8, 128))
    # o has q's heads and v's head dim: 2**31 elements here though q has half of that
    assert not ragged.offsets_fit(meta(4, 65536, 64, 64), meta(4, 65536, 1, 64), meta(4, 65536, 1, 128))
