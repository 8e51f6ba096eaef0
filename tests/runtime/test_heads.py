"""runtime/heads.py on CPU: which decode calls can be viewed with their KV heads as batch, and the
views both ways (the kernels run on the GPU: tests/gpu/test_buckets_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime import heads
from fusedattn_select.runtime.tensor_layouts import LAYOUTS, TO_BHSD

B, HQ, HKV, S, D, DV = 2, 8, 2, 7, 4, 6


def _decode(layout: str):
    """q (B, HQ, 1, D), k (B, HKV, S, D), v (B, HKV, S, DV) in contiguous BHSD memory, in `layout`'s order."""
    q, k, v = torch.randn(B, HQ, 1, D), torch.randn(B, HKV, S, D), torch.randn(B, HKV, S, DV)
    back = tuple(TO_BHSD[layout].index(i) for i in range(4))
    return tuple(t.permute(back) for t in (q, k, v)), (q, k, v)


def test_a_decode_step_in_bhsd_memory_is_one_sequence_per_kv_head():
    _, (q, k, v) = _decode("bhsd")
    assert heads.views(q, k, v) == ((B * HKV, HQ // HKV, 1, D), (B * HKV, S, 1, D), (B * HKV, S, 1, DV),
                                    (B, HQ, 1, DV))


def test_a_slice_of_a_longer_bhsd_cache_is_one_run_of_tokens_per_kv_head():
    _, (q, k, v) = _decode("bhsd")
    ks, vs = k[:, :, :5], v[:, :, :5]  # k_cache[:, :, :L]: each (sequence, head) a run a cache row apart
    assert heads.views(q, ks, vs) == ((B * HKV, HQ // HKV, 1, D), (B * HKV, 5, 1, D), (B * HKV, 5, 1, DV),
                                      (B, HQ, 1, DV))
    kh = ks.view(B * HKV, 5, 1, D)  # the view the decode step runs: no copy, the cache's rows
    assert kh.data_ptr() == k.data_ptr() and torch.equal(kh[1 * HKV + 1, 3, 0], k[1, 1, 3])


def test_memory_that_cannot_be_viewed_so_is_refused():
    _, (q, k, v) = _decode("bhsd")
    assert heads.views(q, k[:1].expand(B, -1, -1, -1), v) is None      # sequences sharing memory
    assert heads.views(q, k[:, :1].expand(-1, HKV, -1, -1), v) is None  # heads sharing memory
    assert heads.views(q, k.transpose(1, 2).contiguous().transpose(1, 2), v) is None  # BSHD: heads interleaved
    assert heads.views(q.transpose(1, 3).contiguous().transpose(1, 3), k, v) is None  # D not innermost
    assert heads.views(torch.randn(B, HQ, 2, D), k, v) is None           # two query rows


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_views_share_the_callers_memory_and_the_output_comes_back_in_its_layout(layout):
    (q, k, v), (qb, kb, vb) = _decode(layout)
    q_dims, k_dims, v_dims, out_dims = heads.views(qb, kb, vb)
    h = heads.HeadsAsBatch(None, q_dims, k_dims, v_dims, out_dims, layout)
    qh, kh, vh = heads.as_heads(h, q, k, v)
    assert qh.data_ptr() == q.data_ptr() and kh.data_ptr() == k.data_ptr() and vh.data_ptr() == v.data_ptr()
    # Row j of sequence (b, g) is query head g * group + j of sequence b.
    group = HQ // HKV
    assert torch.equal(qh[1 * HKV + 1, 2, 0], qb[1, 1 * group + 2, 0])
    assert torch.equal(kh[1 * HKV + 0, 3, 0], kb[1, 0, 3])
    inner_out = torch.randn(B * HKV, group, 1, DV)  # what the heads-as-batch call writes ("bshd")
    out = heads.back(h, inner_out)
    assert (tuple(out.shape), out.stride()) == heads.caller_out(h)
    assert torch.equal(out.permute(TO_BHSD[layout])[1, 1 * group + 2, 0], inner_out[1 * HKV + 1, 2, 0])
