"""The hot path on a real GPU: a call signature seen `dense_after` times leaves its bucket plans for
its own (dense) plans, once; the lean path (q, k, v bound as they come) matches the float64
reference forward and backward in every layout, under CUDA-graph capture too."""

from __future__ import annotations

import time

import pytest
from gpu_setup import CUDA, GPU_MARKS, assert_close, torch

from fusedattn_select.reference.autograd_reference import reference_attention  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.api import attention, clear_plans, dispatch_info  # noqa: E402
from fusedattn_select.runtime.tensor_layouts import FROM_BHSD, TO_BHSD  # noqa: E402

pytestmark = GPU_MARKS
TOL_OUT, TOL_GRAD = 2e-2, 4e-2


def _tensors(layout, b=2, s=96, hq=8, hkv=2, d=64, seed=0, grad=True):
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    order = FROM_BHSD[layout]

    def make(h):
        dims = (b, h, s, d)
        t = torch.randn(*(dims[i] for i in order), generator=gen, device=CUDA).to(torch.bfloat16)
        return t.requires_grad_(grad)
    return make(hq), make(hkv), make(hkv)


def _reference(q, k, v, layout, grad_out=None, **kwargs):
    to, back = TO_BHSD[layout], FROM_BHSD[layout]
    qd, kd, vd = (t.detach().permute(to).double().requires_grad_(True) for t in (q, k, v))
    out = reference_attention(qd, kd, vd, **kwargs)
    if grad_out is not None:
        out.backward(grad_out.permute(to).double())
    return out.permute(back), tuple(t.grad.permute(back) if t.grad is not None else None for t in (qd, kd, vd))


def capture(call):
    """(a CUDA graph of `call()`, its output), after one run of `call` on a side stream as capture needs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    return graph, out


def _entry_of_last_call():
    return list(dispatcher.by_call.values())[-1]


@pytest.fixture
def dense_after(use_settings):
    def set_to(n):
        use_settings(dense_after=n)
    # The tests below check what a promotion does, made at the call that decides it; the worker
    # process (the default) is tested on its own at the end.
    use_settings(dense_builds="inline")
    clear_plans()
    yield set_to
    clear_plans()


def test_a_signature_seen_dense_after_times_gets_its_own_plans_once(dense_after):
    dense_after(3)
    q, k, v = _tensors("bshd", grad=False)
    before = dispatch_info()["promotions"]
    with torch.no_grad():
        outs = [attention(q, k, v, mask="causal") for _ in range(2)]
        bucket_entry = _entry_of_last_call()
        assert bucket_entry.bucketed and bucket_entry.calls == 2
        builds = dispatch_info()["plan_builds"] + dispatch_info()["plan_loads"]
        outs += [attention(q, k, v, mask="causal") for _ in range(3)]
    entry = _entry_of_last_call()
    assert not entry.bucketed and entry.lean and entry.promotion == "dense"
    assert bucket_entry.promotion == "dense"
    assert dispatch_info()["promotions"] == before + 1
    assert dispatch_info()["plan_builds"] + dispatch_info()["plan_loads"] == builds + 1  # the dense forward
    want, _ = _reference(q, k, v, "bshd", mask="causal")
    for out in outs:
        assert_close(out, want, TOL_OUT, "out")
    assert torch.equal(outs[-1], outs[-2])


def test_training_across_the_promotion_gives_reference_gradients(dense_after):
    dense_after(2)
    q, k, v = _tensors("bshd")
    grad = torch.randn(q.shape, device=CUDA, dtype=torch.bfloat16)
    want, want_grads = _reference(q, k, v, "bshd", grad, mask="causal")
    pending = [attention(q, k, v, mask="causal") for _ in range(3)]  # bucket, bucket, promoted
    assert dispatch_info()["promotions"] >= 1
    for out in pending:  # each backward runs with the plans its forward ran with
        q.grad = k.grad = v.grad = None
        out.backward(grad)
        assert_close(out, want, TOL_OUT, "out")
        for name, got, expected in zip("qkv", (q.grad, k.grad, v.grad), want_grads):
            assert_close(got, expected, TOL_GRAD, "d" + name)


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
def test_the_lean_path_matches_the_reference_in_every_layout(dense_after, layout, mask):
    dense_after(1)
    q, k, v = _tensors(layout, s=80)
    with torch.no_grad():
        attention(q, k, v, layout=layout, mask=mask)
        entry = _entry_of_last_call()
        assert entry.lean and not entry.bucketed, entry.promotion or entry.reason
        inference = attention(q, k, v, layout=layout, mask=mask)
    grad = torch.randn_like(inference)
    want, want_grads = _reference(q, k, v, layout, grad, mask=mask)
    assert_close(inference, want, TOL_OUT, "inference out")
    attention(q, k, v, layout=layout, mask=mask)  # the training signature: promoted at its first call
    out = attention(q, k, v, layout=layout, mask=mask)
    assert _entry_of_last_call().lean.grads is not None
    out.backward(grad)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_close(out, want, TOL_OUT, "out")
    for name, got, expected in zip("qkv", (q.grad, k.grad, v.grad), want_grads):
        assert got.shape == expected.shape
        assert_close(got, expected, TOL_GRAD, "d" + name)


def test_the_lean_path_takes_views_whose_memory_is_another_layout(dense_after):
    # bshd-ordered views of BHSD memory (what transposing SDPA-style tensors gives)
    dense_after(1)
    gen = torch.Generator(device=CUDA).manual_seed(5)
    q, k, v = (torch.randn(2, h, 96, 64, generator=gen, device=CUDA).to(torch.bfloat16).transpose(1, 2)
               .requires_grad_(True) for h in (8, 2, 2))
    attention(q, k, v, mask="causal")
    out = attention(q, k, v, mask="causal")
    entry = _entry_of_last_call()
    assert entry.lean is not None and not entry.bucketed, entry.promotion or entry.reason
    grad = torch.randn_like(out)
    out.backward(grad)
    want, want_grads = _reference(q, k, v, "bshd", grad, mask="causal")
    assert_close(out, want, TOL_OUT, "out")
    for name, got, expected in zip("qkv", (q.grad, k.grad, v.grad), want_grads):
        assert_close(got, expected, TOL_GRAD, "d" + name)


def test_the_lean_path_replays_under_cuda_graph_capture(dense_after):
    dense_after(1)
    q, k, v = _tensors("bshd", grad=False)
    with torch.no_grad():
        attention(q, k, v, mask="causal")
        eager = attention(q, k, v, mask="causal")
        assert _entry_of_last_call().lean
        graph, captured = capture(lambda: attention(q, k, v, mask="causal"))
        fresh = torch.randn_like(q)
        q.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, attention(q, k, v, mask="causal"))
        assert not torch.equal(captured, eager)


def test_dense_after_zero_keeps_bucket_plans(dense_after):
    dense_after(0)
    q, k, v = _tensors("bshd", grad=False)
    with torch.no_grad():
        for _ in range(20):
            attention(q, k, v, mask="causal")
    entry = _entry_of_last_call()
    assert entry.bucketed and entry.promotion == ""


def test_the_direct_launch_gives_the_public_executes_result(dense_after, use_settings):
    # The Python path's launches (not the compiled path's): a setting, as the environment is read once (an
    # environment variable set here did nothing where FUSEDATTN_SELECT_NATIVE_DIR held a built module).
    use_settings(native="0")
    dense_after(1)
    q, k, v = _tensors("bshd", grad=False)
    with torch.no_grad():
        for _ in range(3):  # promoted at the first call; the second call's public execute arms the launcher
            attention(q, k, v, mask="causal")
        plan = _entry_of_last_call().forward
        assert plan._direct is not None and plan._direct_proven
        direct = attention(q, k, v, mask="causal")
        plan._direct = None  # the public execute from here on
        public = attention(q, k, v, mask="causal")
    assert torch.equal(direct, public)


def test_a_worker_process_builds_the_dense_plans_while_the_caller_runs_its_bucket_plans(dense_after, monkeypatch,
                                                                                       use_settings):
    dense_after(3)
    use_settings(dense_builds="process")
    q, k, v = _tensors("bshd", s=112)
    grad = torch.randn(q.shape, device=CUDA, dtype=torch.bfloat16)
    want, want_grads = _reference(q, k, v, "bshd", grad, mask="causal")
    outs = [attention(q, k, v, mask="causal")]  # builds the bucket plans
    builds, loads = dispatch_info()["plan_builds"], dispatch_info()["plan_loads"]
    outs += [attention(q, k, v, mask="causal") for _ in range(2)]
    bucket_entry = _entry_of_last_call()
    assert bucket_entry.bucketed and bucket_entry.promotion == "pending" and bucket_entry.pending is not None
    deadline = time.monotonic() + 240  # the first job starts the worker: imports, CUDA context, cuDNN
    while _entry_of_last_call().bucketed and time.monotonic() < deadline:
        outs.append(attention(q, k, v, mask="causal"))  # never waits: bucket plans until the plans are stored
        time.sleep(0.05)
    entry = _entry_of_last_call()
    assert not entry.bucketed and entry.lean and entry.promotion == "dense", bucket_entry.promotion
    assert bucket_entry.pending is None and bucket_entry.promotion == "dense"
    assert dispatch_info()["plan_builds"] == builds, "the dense plans were built in this process"
    assert dispatch_info()["plan_loads"] - loads == 2  # forward and backward
    outs.append(attention(q, k, v, mask="causal"))
    for out in (outs[0], outs[-2], outs[-1]):  # bucket plans, the promoting call, the dense plans
        q.grad = k.grad = v.grad = None
        out.backward(grad)
        assert_close(out, want, TOL_OUT, "out")
        for name, got, expected in zip("qkv", (q.grad, k.grad, v.grad), want_grads):
            assert_close(got, expected, TOL_GRAD, "d" + name)


def test_a_graph_captured_on_bucket_plans_still_replays_right_after_the_promotion(dense_after, monkeypatch,
                                                                                  use_settings):
    dense_after(2)
    use_settings(dense_builds="process")
    q, k, v = _tensors("bshd", s=120, grad=False)
    with torch.no_grad():
        for _ in range(2):
            attention(q, k, v, mask="causal")
        bucket_entry = _entry_of_last_call()
        stream = torch.cuda.Stream()  # warm on a side stream, as CUDA-graph capture wants
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            attention(q, k, v, mask="causal")
        torch.cuda.current_stream().wait_stream(stream)
        assert bucket_entry.bucketed and bucket_entry.promotion == "pending"
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # on the bucket plans: nothing is promoted while capturing
            captured = attention(q, k, v, mask="causal")
        deadline = time.monotonic() + 240
        while _entry_of_last_call().bucketed and time.monotonic() < deadline:
            attention(q, k, v, mask="causal")
            time.sleep(0.05)
        assert not _entry_of_last_call().bucketed, bucket_entry.promotion
        del bucket_entry
        junk = [torch.full((1 << 16,), 7, dtype=torch.int32, device=CUDA) for _ in range(64)]  # reuse freed memory
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
    want, _ = _reference(q, k, v, "bshd", mask="causal")
    assert_close(captured, want, TOL_OUT, "replayed out")
    del junk
