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


# ----- K and V read as rows of longer buffers (a slice of a preallocated BSHD cache) -------------
def _cache_slice(b=3, capacity=16, length=5, h=2, d=4):
    """k_cache[:, :length] of a (b, capacity, h, d) cache, as the logical BHSD view dispatch reads."""
    return torch.zeros(b, capacity, h, d)[:, :length].transpose(1, 2)


def test_a_cache_slice_steps_by_its_batch_stride():
    k, v = _cache_slice(), _cache_slice()
    assert ragged.kv_steps(k, v) == (16 * 2 * 4, 16 * 2 * 4)
    # head dims differ: K and V have their own offsets, so their steps may differ
    assert ragged.kv_steps(k, _cache_slice(capacity=32, d=8)) == (128, 32 * 2 * 8)


def test_contiguous_or_other_memory_takes_no_steps():
    contiguous = torch.zeros(3, 5, 2, 4).transpose(1, 2)
    assert ragged.kv_steps(contiguous, contiguous) == (0, 0)
    one = _cache_slice(b=1)
    assert ragged.kv_steps(one, one) == (0, 0)  # one sequence: contiguous as far as the kernels read
    bhsd_slice = torch.zeros(3, 2, 16, 4)[:, :, :5]  # heads are not rows of one token
    assert ragged.kv_steps(bhsd_slice, bhsd_slice) == (0, 0)
    # one head dim shares one offset tensor: unequal batch strides cannot both be met
    assert ragged.kv_steps(_cache_slice(), _cache_slice(capacity=32)) == (0, 0)
    assert ragged.kv_steps(_cache_slice(), contiguous) == (0, 0)


def test_offsets_of_k_and_v_step_over_the_rest_of_the_cache():
    forward = _plan(["ragged_offset_q", "ragged_offset_kv"])
    (feeds,) = ragged.bindings([forward], ragged.Shape(3, 5, 6, 100, 100), torch.device("cpu"))
    assert feeds["ragged_offset_kv"].flatten().tolist() == [0, 100, 200, 300, 300]
    assert feeds["ragged_offset_q"].flatten().tolist() == [0, 40, 80, 120, 120]  # q stays contiguous
    assert feeds["seq_len_kv"].flatten().tolist() == [6, 6, 6, 0]


def test_steps_bind_forward_plans_only():
    backward = _plan(["ragged_offset_q", "ragged_offset_kv"])
    backward.specs["dK"] = backward.specs["k"]
    with pytest.raises(ValueError, match="forward plans only"):
        ragged.bindings([backward], ragged.Shape(3, 5, 6, 100, 100), torch.device("cpu"))


def test_offsets_fit_counts_the_rows_the_steps_reach():
    def meta(*shape):
        return torch.empty(shape, device="meta")

    q, kv = meta(4, 1, 8, 128), meta(4, 1000, 1, 128)
    assert ragged.offsets_fit(q, kv, kv, 2 ** 28, 2 ** 28)
    assert not ragged.offsets_fit(q, kv, kv, 2 ** 29, 2 ** 28)  # 4 x 2**29 elements is past int32


def test_bshd_memory_reads_rows_in_place_only_at_their_step():
    k = _cache_slice()
    assert ragged.bshd_memory(k, 128).data_ptr() == k.data_ptr()  # no copy
    copied = ragged.bshd_memory(k)
    assert copied.is_contiguous() and torch.equal(copied, k.transpose(1, 2))
    assert ragged.bshd_memory(k, 64).is_contiguous()  # not its step: a copy
