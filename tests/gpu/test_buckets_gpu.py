"""Bucket plans on a real GPU: every shape of a known problem class runs fused without a plan build,
forward and backward agree with the float64 reference, and the plan that runs is the one selected.
"""

from __future__ import annotations

import pytest
from gpu_setup import CUDA, GPU_MARKS, assert_close, torch

from fusedattn_select.buckets import Bucket, bucket_form  # noqa: E402
from fusedattn_select.reference.autograd_reference import reference_attention, reference_attention_bshd  # noqa: E402
from fusedattn_select.runtime import entries  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.api import attention, config_from_tensors, dispatch_info  # noqa: E402
from fusedattn_select.runtime.options import CallOptions, OptionalInputs  # noqa: E402
from fusedattn_select.selection.selector import default_selector  # noqa: E402

pytestmark = GPU_MARKS
TOL_OUT, TOL_GRAD = 2e-2, 4e-2  # relative to the largest reference magnitude (bf16 kernels)


def _tensors(b, sq, skv, hq=8, hkv=2, d=64, seed=0):
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    make = lambda s, h: torch.randn(b, s, h, d, generator=gen, device=CUDA).to(torch.bfloat16).requires_grad_(True)  # noqa: E731
    return make(sq, hq), make(skv, hkv), make(skv, hkv)


def _check(b, sq, skv, *, lse=False, **kwargs):
    q, k, v = _tensors(b, sq, skv)
    result = attention(q, k, v, return_lse=lse, **kwargs)
    out, got_lse = result if lse else (result, None)
    entry = list(dispatcher.entries.values())[-1]
    if sq == skv == 1:
        # cuDNN 9.19 (H100) refuses this training backward: "s_q = s_kv = 1 is not supported".
        assert not entry.fused and "s_q = s_kv = 1" in entry.reason
    else:
        assert entry.fused and entry.bucketed, entry.reason or "ran a dense plan"
    grad = torch.randn_like(out)
    out.backward(grad)
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref = reference_attention_bshd(qd, kd, vd, return_lse=lse, **kwargs)
    ref_out, ref_lse = ref if lse else (ref, None)
    ref_out.backward(grad.double())
    assert_close(out, ref_out, TOL_OUT, "out")
    for name, got, want in (("dq", q.grad, qd.grad), ("dk", k.grad, kd.grad), ("dv", v.grad, vd.grad)):
        assert_close(got, want, TOL_GRAD, name)
    if lse:
        assert got_lse.shape == (b, q.shape[2], sq, 1)
        valid = torch.isfinite(ref_lse)
        assert_close(got_lse[valid], ref_lse[valid], 1e-2, "lse")
    return entry


SWEEP_S = [1, 2, 63, 64, 65, 127, 128, 129, 255, 256]


@pytest.mark.parametrize("s", SWEEP_S)
@pytest.mark.parametrize("b", [3, 4])
def test_causal_gqa_sweep_matches_the_reference(b, s):
    _check(b, s, s, mask="causal")


@pytest.mark.parametrize("mask", ["no_mask", "causal"])
@pytest.mark.parametrize("s", [1, 65, 129])
def test_masks_with_lse(mask, s):
    _check(2, s, s, mask=mask, lse=True)


@pytest.mark.parametrize("sq, skv", [(1, 200), (64, 300), (100, 129)])
def test_bottom_right_causal_with_unequal_lengths(sq, skv):
    _check(2, sq, skv, mask="causal_bottom_right")


def test_sliding_window():
    _check(3, 200, 200, mask="causal", window_size=(32, 0))


def test_padding_with_given_lengths():
    seqlens = torch.tensor([200, 77, 1], dtype=torch.int32, device=CUDA)
    _check(3, 200, 200, mask="padding_causal", seqlens_q=seqlens, seqlens_kv=seqlens)


def test_new_shapes_inside_a_bucket_build_nothing_and_select_without_probing():
    q, k, v = _tensors(4, 1000, 1000)
    attention(q, k, v, mask="causal").sum().backward()  # the bucket's plans exist from here on
    selector = default_selector()
    builds = dispatch_info()["plan_builds"]
    probes = selector.cache_info()["probes"]
    for b, s in [(3, 1000), (1, 513), (4, 777), (2, 1024)]:
        q, k, v = _tensors(b, s, s, seed=b + s)
        attention(q, k, v, mask="causal").sum().backward()
        torch.cuda.synchronize()
    assert dispatch_info()["plan_builds"] == builds
    assert selector.cache_info()["probes"] == probes


def test_the_selection_dispatch_relies_on_is_the_bucket_graphs():
    q, k, v = _tensors(3, 700, 700)
    attention(q, k, v, mask="causal")
    entry = list(dispatcher.entries.values())[-1]
    call = config_from_tensors(q, k, v, mask="causal", is_training=True)
    form = bucket_form(call)
    assert entry.cfg == form and entry.call_cfg == call
    assert (form.batch_size, form.seqlen_q) == (Bucket.of(3, 700, 700).batch, Bucket.of(3, 700, 700).seqlen_q)
    assert entry.selection.plan_form.startswith("bucket B=4 S_q=1024 S_kv=1024")
    assert entry.forward.specs["q"].dims == (4, 8, 1024, 64)


# ----- decode steps with BHSD keys and values (a DynamicCache): KV heads as batch --------------------
def _decode_tensors(b, skv, hq, hkv, d=64, seed=0):
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, generator=gen, device=CUDA).to(torch.bfloat16)
               for h, s in ((hq, 1), (hkv, skv), (hkv, skv)))
    return q, k, v


def _decode_reference(q, k, v, **kwargs):
    as_bshd = [t.transpose(1, 2).double() for t in (q, k, v)]
    return reference_attention_bshd(*as_bshd, **kwargs).transpose(1, 2)


def _entry_of(q, k, v, layout, mask):
    options = CallOptions(layout, mask, (-1, -1), None, 0.0, "vanilla", False, False, "", False, False, False, False)
    return dispatcher.entries.get(entries.key(q, k, v, options, OptionalInputs(None, None, None, None,
                                                                                              None)))


@pytest.mark.parametrize("skv", [1, 2, 63, 64, 65, 129, 256, 1500])
@pytest.mark.parametrize("hq, hkv", [(8, 2), (4, 4), (8, 1)])
@pytest.mark.parametrize("mask", ["no_mask", "causal_bottom_right"])
def test_a_decode_step_runs_its_heads_as_batch_without_copies_and_matches_the_reference(skv, hq, hkv, mask):
    q, k, v = _decode_tensors(3, skv, hq, hkv)
    with torch.no_grad():
        out = attention(q, k, v, layout="bhsd", mask=mask)
    assert out.shape == (3, hq, 1, 64) and out.is_contiguous()
    assert_close(out, _decode_reference(q, k, v, mask=mask), TOL_OUT, "out")
    entry = _entry_of(q, k, v, "bhsd", mask)
    assert entry.heads is not None, entry.reason or "ran with its heads"
    inner = entry.heads.entry
    assert inner.bucketed and inner.lean is not None  # the caller's K/V memory, as it is
    assert (inner.call_cfg.batch_size, inner.call_cfg.num_heads_q, inner.call_cfg.seqlen_q) == (3 * hkv, 1, hq // hkv)
    selection = default_selector().select(config_from_tensors(q, k, v, layout="bhsd", mask=mask, is_training=False))
    assert selection.plan_form.startswith("heads as batch")
    assert (entry.selection.plan_form, entry.selection.verdicts) == (selection.plan_form, selection.verdicts)
    assert entry.lean is not None and entry.forward is inner.forward  # no views on the hot path


def test_the_next_decode_steps_build_nothing():
    q, k, v = _decode_tensors(2, 300, 8, 2, seed=1)
    with torch.no_grad():
        attention(q, k, v, layout="bhsd")
        builds = dispatch_info()["plan_builds"]
        for skv in (301, 302, 400, 512):
            q, k, v = _decode_tensors(2, skv, 8, 2, seed=skv)
            assert_close(attention(q, k, v, layout="bhsd"), _decode_reference(q, k, v), TOL_OUT, "out")
            assert _entry_of(q, k, v, "bhsd", "no_mask").heads is not None
    assert dispatch_info()["plan_builds"] == builds


def test_a_query_whose_heads_are_not_rows_of_contiguous_memory_keeps_its_heads():
    q, k, v = _decode_tensors(2, 300, 8, 2, seed=3)
    q = torch.randn(2, 1, 64, 8, device=CUDA).to(torch.bfloat16).transpose(2, 3).transpose(1, 2)  # (B, H, 1, D), D strided
    with torch.no_grad():
        out = attention(q, k, v, layout="bhsd")
    assert_close(out, _decode_reference(q, k, v), TOL_OUT, "out")
    entry = _entry_of(q, k, v, "bhsd", "no_mask")
    assert entry.heads is None and entry.bucketed  # its own bucket plans: no plan per step
    assert entry.selection.plan_form.startswith("bucket B=2 S_q=1 S_kv=512")


def test_a_decode_step_asking_for_the_lse_runs_its_own_bucket_and_the_next_step_builds_nothing():
    q, k, v = _decode_tensors(2, 300, 8, 2, seed=4)
    with torch.no_grad():
        out, lse = attention(q, k, v, layout="bhsd", return_lse=True)
        builds = dispatch_info()["plan_builds"]
        q2, k2, v2 = _decode_tensors(2, 301, 8, 2, seed=5)
        out2, lse2 = attention(q2, k2, v2, layout="bhsd", return_lse=True)
    assert dispatch_info()["plan_builds"] == builds
    for got, got_lse, (a, b, c) in ((out, lse, (q, k, v)), (out2, lse2, (q2, k2, v2))):
        ref, ref_lse = reference_attention(a.double(), b.double(), c.double(), return_lse=True)  # BHSD
        assert_close(got, ref, TOL_OUT, "out")
        assert_close(got_lse, ref_lse, 1e-2, "lse")


def _allocations():
    return torch.cuda.memory_stats()["allocation.all.allocated"]


def _assert_allocates_as_contiguous(q, k, v, **kwargs):
    """A call on the cache slices k, v allocates what one on contiguous copies of them does (no copy)."""
    k_own, v_own = k.contiguous(), v.contiguous()
    attention(q, k_own, v_own, **kwargs)  # decided before counting
    counts = []
    for pair in ((k, v), (k_own, v_own)):
        before = _allocations()
        attention(q, *pair, **kwargs)
        counts.append(_allocations() - before)
    assert counts[0] == counts[1], f"the cache slices allocated {counts[0]}, contiguous K/V {counts[1]}"


def _caches(dims, seed):
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    return gen, [torch.randn(*dims, generator=gen, device=CUDA).to(torch.bfloat16) for _ in range(2)]


@pytest.mark.parametrize("sq, mask", [(1, "no_mask"), (3, "causal_bottom_right")])
def test_k_and_v_sliced_from_a_bshd_cache_are_read_in_place(sq, mask):
    """k_cache[:, :L] of a preallocated BSHD cache: the bucket plans read the cache's rows where they
    are (no copy: a call allocates what one on contiguous K/V does), the output is the reference's,
    the next lengths build nothing, and no dense plan (which would copy K and V) is asked for."""
    b, hq, hkv, d, capacity = 3, 8, 2, 64, 1024
    gen, (k_cache, v_cache) = _caches((b, capacity, hkv, d), 7)
    with torch.no_grad():
        builds = None
        for length in (300, 301, 400):
            q = torch.randn(b, sq, hq, d, generator=gen, device=CUDA).to(torch.bfloat16)
            k, v = k_cache[:, :length], v_cache[:, :length]
            out = attention(q, k, v, layout="bshd", mask=mask)
            ref = reference_attention_bshd(q.double(), k.double(), v.double(), mask=mask)
            assert_close(out, ref, TOL_OUT, "out")
            entry = _entry_of(q, k, v, "bshd", mask)
            assert entry.fused and entry.bucketed and entry.heads is None, entry.reason
            assert entry.kv_steps == (capacity * hkv * d,) * 2 and entry.lean is not None
            assert entry.promotion.startswith("K and V are read in place")
            builds = dispatch_info()["plan_builds"] if builds is None else builds
        assert dispatch_info()["plan_builds"] == builds
        _assert_allocates_as_contiguous(q, k, v, layout="bshd", mask=mask)


def test_a_decode_step_on_a_slice_of_a_bhsd_cache_runs_its_heads_as_batch_in_place():
    """k_cache[:, :, :L] of a preallocated BHSD cache: one run of tokens per (sequence, KV head), which
    the heads-as-batch bucket plans read where it is (a call allocates what one on a contiguous
    cache does), with the reference's output and no plan build for the next lengths."""
    b, hq, hkv, d, capacity = 3, 8, 2, 64, 1024
    gen, (k_cache, v_cache) = _caches((b, hkv, capacity, d), 8)
    with torch.no_grad():
        builds = None
        for length in (300, 301, 400):
            q = torch.randn(b, hq, 1, d, generator=gen, device=CUDA).to(torch.bfloat16)
            k, v = k_cache[:, :, :length], v_cache[:, :, :length]
            assert_close(attention(q, k, v, layout="bhsd"), _decode_reference(q, k, v), TOL_OUT, "out")
            entry = _entry_of(q, k, v, "bhsd", "no_mask")
            assert entry.heads is not None, entry.reason or "kept its heads"
            inner = entry.heads.entry
            assert inner.bucketed and inner.kv_steps == (capacity * d,) * 2 and entry.lean is not None
            builds = dispatch_info()["plan_builds"] if builds is None else builds
        assert dispatch_info()["plan_builds"] == builds
        _assert_allocates_as_contiguous(q, k, v, layout="bhsd")


def test_a_compiled_decode_step_matches_eager_mode():
    q, k, v = _decode_tensors(2, 333, 8, 2, seed=2)
    step = torch.compile(lambda q, k, v: attention(q, k, v, layout="bhsd"), fullgraph=True)
    with torch.no_grad():
        eager = attention(q, k, v, layout="bhsd")
        compiled = step(q, k, v)
    assert torch.equal(compiled, eager)
