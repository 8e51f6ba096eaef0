"""The compiled lean path on a real GPU: `native build` compiles and tests the module, and then every
lean call (dense and bucket plans, inference and training, decode steps run with their heads as
batch) runs through it with the Python path's results, under CUDA-graph capture, from several
threads, and not at all where FUSEDATTN_SELECT_NATIVE=0. The module's table of call signatures runs
a repeated call with the Python path's results, and tells apart (or refuses) every call the Python
key tells apart (or refuses)."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest
from gpu_setup import CUDA, GPU_MARKS, assert_close, torch
from test_buckets_gpu import _decode_reference, _decode_tensors, _entry_of
from test_hot_path import _entry_of_last_call, _reference, _tensors, capture

from fusedattn_select.cli.main import main  # noqa: E402
from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime import native  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.api import attention, clear_plans, dispatch_info  # noqa: E402
from fusedattn_select.runtime.fp8 import FP8History  # noqa: E402

pytestmark = GPU_MARKS
TOL_OUT, TOL_GRAD = 2e-2, 4e-2


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The module for this torch and frontend: the one in $FUSEDATTN_SELECT_NATIVE_DIR where that
    holds it, else built here by `native build` (a minute: compiled, then tested in a child process)."""
    with pytest.MonkeyPatch.context() as patch:
        # One directory for the whole module, set before the first lookup (the default one lives in
        # the cache directory, which every test changes), and no background build.
        patch.setenv(native.ENV_VAR, "1")
        patch.setenv(native.DIR_ENV, os.environ.get(native.DIR_ENV) or str(tmp_path_factory.mktemp("native")))
        patch.setattr(dispatcher, "native_loaded", {})
        if native.load() is None:
            from torch.utils import cpp_extension

            if cpp_extension.CUDA_HOME is None:
                pytest.skip("no CUDA toolkit to compile the module with")
            assert main(["native", "build"]) == 0
        yield native.load()


@pytest.fixture
def fresh(built, use_settings):
    use_settings(dense_builds="inline", dense_after=1)
    clear_plans()
    yield built
    clear_plans()


def _python_path(run):
    """What `run()` returns with every lean entry made so far on the Python path."""
    for found in list(dispatcher.by_call.values()) + list(dispatcher.entries.values()):
        if found.lean is not None:
            found.lean = dataclasses.replace(found.lean, native=None)
    native.forget_calls()  # the table holds the compiled plans
    before = native.table_calls()
    got = run()
    assert native.table_calls() == before, "the compiled table ran a call of the Python path"
    return got


def test_status_reports_the_built_module(built, capsys):
    assert built is not None
    assert main(["native", "status", "--json"]) == 0
    assert '"built": true' in capsys.readouterr().out


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
def test_dense_calls_run_compiled_and_match_the_python_path_and_reference(fresh, layout, mask):
    q, k, v = _tensors(layout, s=80)
    grad = torch.randn_like(q)
    attention(q, k, v, layout=layout, mask=mask)  # promoted to its own plans at its first call

    def run():
        q.grad = k.grad = v.grad = None
        out = attention(q, k, v, layout=layout, mask=mask)
        out.backward(grad)
        with torch.no_grad():
            inference = attention(q, k, v, layout=layout, mask=mask)
        return out, q.grad, k.grad, v.grad, inference

    got = run()
    entry = _entry_of_last_call()
    assert not entry.bucketed and entry.lean.native is not None
    want = _python_path(run)
    ref_out, ref_grads = _reference(q, k, v, layout, grad, mask=mask)
    for name, a, b in zip(("out", "dq", "dk", "dv", "inference"), got, want):
        assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype, name
        assert_close(a, b, TOL_OUT, name + " vs the Python path")
    assert_close(got[0], ref_out, TOL_OUT, "out")
    assert_close(got[4], ref_out, TOL_OUT, "inference out")
    for name, g, expected in zip(("dq", "dk", "dv"), got[1:4], ref_grads):
        assert_close(g, expected, TOL_GRAD, name)


def test_a_compiled_training_call_keeps_autograds_rules(fresh):
    """The compiled path's backward node: named, freed after one backward unless retained, catching
    an output changed in place, holding no memory once its graph is gone, refusing dual tensors."""
    q, k, v = _tensors("bshd", s=64)
    grad = torch.randn_like(q)
    attention(q, k, v)  # promoted to its own plans
    out = attention(q, k, v)
    assert _entry_of_last_call().lean.native is not None
    assert out.grad_fn.name() == "LeanAttentionBackward"
    first = torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
    again = torch.autograd.grad(out, (q, k, v), grad)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(out, (q,), grad)
    out = attention(q, k, v)
    out.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, (q,), grad)
    del out
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(200):
        torch.autograd.grad(attention(q, k, v), (q, k, v), grad)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level(), pytest.raises(RuntimeError, match="forward-mode AD"):
        attention(fwAD.make_dual(q.detach(), torch.randn_like(q)), k, v)


def test_a_double_backward_through_the_compiled_node_raises(fresh):
    """create_graph=True gives the same gradients, and differentiating them again raises, not returns
    gradients without attention's terms."""
    q, k, v = _tensors("bshd", s=64)
    attention(q, k, v, mask="causal")  # promoted to its own plans
    out = attention(q, k, v, mask="causal")
    assert out.grad_fn.name() == "LeanAttentionBackward"
    loss = out.float().square().mean()
    plain = torch.autograd.grad(loss, (q, k, v), retain_graph=True)
    grads = torch.autograd.grad(loss, (q, k, v), create_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(plain, grads))
    assert all(g.requires_grad for g in grads)
    penalty = sum(g.float().square().sum() for g in grads)
    # autograd.grad and backward(inputs=...) run only the nodes on a path to their inputs: the raising node
    # must lead back to q, k and v, or they return the first-order terms alone
    for again in (lambda: (loss + penalty).backward(retain_graph=True),
                  lambda: torch.autograd.grad(loss + penalty, (q,), retain_graph=True),
                  lambda: torch.autograd.grad(penalty, (k,), retain_graph=True)):
        with pytest.raises(RuntimeError, match="double backward is not supported"):
            again()


def test_bucket_plans_run_compiled_at_new_shapes(fresh, use_settings):
    use_settings(dense_after=10**9)  # stay on the bucket plans
    for b, s in ((2, 96), (3, 77), (1, 129)):
        q, k, v = _tensors("bshd", b=b, s=s, seed=s)
        grad = torch.randn_like(q)
        out = attention(q, k, v, mask="causal")
        entry = _entry_of_last_call()
        assert entry.bucketed and entry.lean.native is not None, entry.reason
        out.backward(grad)
        ref_out, ref_grads = _reference(q, k, v, "bshd", grad, mask="causal")
        assert_close(out, ref_out, TOL_OUT, f"out b{b} s{s}")
        for name, g, expected in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref_grads):
            assert_close(g, expected, TOL_GRAD, f"{name} b{b} s{s}")


@pytest.mark.parametrize("skv", [1, 65, 300])
def test_decode_steps_run_their_heads_as_batch_compiled(fresh, skv):
    q, k, v = _decode_tensors(3, skv, 8, 2, seed=skv)
    with torch.no_grad():
        out = attention(q, k, v, layout="bhsd")
        entry = _entry_of(q, k, v, "bhsd", "no_mask")
        assert entry.heads is not None and entry.lean.native is not None
        again = attention(q, k, v, layout="bhsd")
    assert_close(out, _decode_reference(q, k, v), TOL_OUT, "out")
    assert torch.equal(out, again)


def test_compiled_calls_replay_under_cuda_graph_capture(fresh):
    q, k, v = _tensors("bshd", grad=False)
    with torch.no_grad():
        attention(q, k, v, mask="causal")
        assert _entry_of_last_call().lean.native is not None
        graph, captured = capture(lambda: attention(q, k, v, mask="causal"))
        for seed in (1, 2):
            for t in (q, k, v):
                t.copy_(torch.randn(t.shape, generator=torch.Generator(device=CUDA).manual_seed(seed), device=CUDA))
            graph.replay()
            assert_close(captured, _reference(q, k, v, "bshd", mask="causal")[0], TOL_OUT, f"replay {seed}")


def test_threads_each_run_forward_and_backward(fresh):
    q, k, v = _tensors("bshd")
    grad = torch.randn_like(q)
    attention(q, k, v, mask="causal")
    ref_out, ref_grads = _reference(q, k, v, "bshd", grad, mask="causal")
    errors: list[BaseException] = []

    def work():
        try:
            for _ in range(5):
                qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
                out = attention(qq, kk, vv, mask="causal")
                out.backward(grad)
                torch.cuda.synchronize()
                assert_close(out, ref_out, TOL_OUT, "out")
                for name, g, expected in zip(("dq", "dk", "dv"), (qq.grad, kk.grad, vv.grad), ref_grads):
                    assert_close(g, expected, TOL_GRAD, name)
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert _entry_of_last_call().lean.native is not None


def test_threads_racing_on_a_new_signature_get_the_reference(fresh):
    # Their first calls reach a graph's first run (binding by uid, then learning its slot order) at once.
    q, k, v = _tensors("bshd", s=72, grad=False)
    barrier = threading.Barrier(4)
    outs: list = [None] * 4
    errors: list[BaseException] = []

    def work(i):
        try:
            barrier.wait()
            with torch.no_grad():
                outs[i] = attention(q, k, v, mask="causal")
            torch.cuda.synchronize()
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    want = _reference(q, k, v, "bshd", mask="causal")[0]
    for out in outs:
        assert_close(out, want, TOL_OUT, "out")
    assert _entry_of_last_call().lean.native is not None


def test_general_path_plans_run_compiled_with_the_python_paths_results(fresh):
    """Calls the lean path does not take (a bias; FP8, current and delayed scaling) run their plans
    through the compiled module once one run has bound them in order."""
    q, k, v = _tensors("bshd", grad=False)
    bias = torch.randn(1, q.shape[2], q.shape[1], k.shape[1], device=CUDA, dtype=q.dtype)
    history = FP8History()
    calls = {"bias": lambda: attention(q, k, v, bias=bias, mask="causal"),
             "fp8": lambda: attention(q, k, v, mask="causal", fp8=True),
             "fp8 delayed": lambda: attention(q, k, v, mask="causal", fp8=history)}
    with torch.no_grad():
        for name, call in calls.items():
            call()  # the plan's first run binds in order (Python); both FP8 calls share one entry
            found = [e for e in dispatcher.entries.values() if e.opts.fp8 == name.startswith("fp8")]
            assert len(found) == 1, name
            entry = found[0]
            assert entry.fused and entry.lean is None, (name, entry.reason)
            assert entry.forward._native is not None, name
            before = native.executes()
            got = call()
            assert native.executes() == before + 1, name
            runner, entry.forward._native = entry.forward._native, None  # the Python path, the same plan
            want = call()
            entry.forward._native = runner
            assert torch.equal(got, want), name


def test_switched_off_calls_run_the_python_path(fresh, use_settings):
    use_settings(native="0")
    q, k, v = _tensors("bshd", grad=False)
    with torch.no_grad():
        attention(q, k, v, mask="causal")
        out = attention(q, k, v, mask="causal")
    entry = _entry_of_last_call()
    assert entry.lean is not None and entry.lean.native is None
    assert_close(out, _reference(q, k, v, "bshd", mask="causal")[0], TOL_OUT, "out")


def test_compiled_graphs_under_torch_compile_are_unchanged(fresh):
    q, k, v = _tensors("bshd", grad=False)
    with torch.no_grad():
        eager = attention(q, k, v, mask="causal")
        compiled = torch.compile(lambda a, b, c: attention(a, b, c, mask="causal"), fullgraph=True)(q, k, v)
    assert_close(compiled, eager, TOL_OUT, "compiled vs eager")


# ----- the table of call signatures -------------------------------------------------------------

def _filed(call, limit=8):
    """Make `call`'s signature a compiled lean entry on its own plans, filed in the table: called until
    promoted (two calls, or more where its problem class already ran another shape: entries.count_call),
    then once more, since a call is filed by the entry it was found under (the promoting call's was
    the bucketed one)."""
    for _ in range(limit):
        call()
        entry = _entry_of_last_call()
        if not entry.bucketed and entry.lean.native is not None:
            call()
            return
    raise AssertionError(f"not promoted to its own compiled plans in {limit} calls: {entry}")


@pytest.mark.parametrize("training", [False, True])
def test_a_repeated_call_runs_from_the_table_with_the_python_paths_results(fresh, training):
    q, k, v = _tensors("bshd", s=80, grad=training)
    grad = torch.randn_like(q)

    def run():
        with torch.set_grad_enabled(training):
            out = attention(q, k, v, mask="causal")
            return (out, *torch.autograd.grad(out, (q, k, v), grad)) if training else (out,)

    _filed(run)
    before, info = native.table_calls(), dispatch_info()
    got = run()
    assert native.table_calls() == before + 1
    after = dispatch_info()
    assert after["calls"] == info["calls"] + 1 and after["fused_calls"] == info["fused_calls"] + 1
    assert (got[0].grad_fn is not None) == training
    want = _python_path(run)
    assert torch.equal(got[0], want[0])
    for name, a, b in zip(("dq", "dk", "dv"), got[1:], want[1:]):
        assert_close(a, b, TOL_GRAD, name + " vs the Python path")
    ref_out, ref_grads = _reference(q, k, v, "bshd", grad, mask="causal")
    assert_close(got[0], ref_out, TOL_OUT, "out")
    for name, g, expected in zip(("dq", "dk", "dv"), got[1:], ref_grads):
        assert_close(g, expected, TOL_GRAD, name)


def test_the_table_tells_calls_apart_as_the_python_key_does(fresh):
    q, k, v = _tensors("bshd", s=64, grad=False)
    with torch.no_grad():
        _filed(lambda: attention(q, k, v, attn_scale=0.5))
        held = fresh.size()
        before = native.table_calls()
        other = [t.clone() for t in (q, k, v)]  # other tensors of the same geometry: the same signature
        assert_close(attention(*other, attn_scale=0.5), _reference(q, k, v, "bshd", attn_scale=0.5)[0], TOL_OUT, "same")
        assert native.table_calls() == before + 1
        # A bool where a number is asked, k and v of another dtype: refused as before any table
        for wrong in (dict(attn_scale=0.5, dropout=False), dict(attn_scale=0.5, deterministic=1)):
            with pytest.raises(ConfigError):
                attention(q, k, v, **wrong)
        with pytest.raises(ConfigError, match="k and v must have q's dtype"):
            attention(q, k.half(), v.half(), attn_scale=0.5)
        # Another scale, layout named, causal: each its own signature, decided in Python, then filed
        for changed in (dict(attn_scale=0.25), dict(attn_scale=0.5, layout="bshd"), dict(attn_scale=0.5, mask="causal")):
            _filed(lambda: attention(q, k, v, **changed))
            want = _reference(q, k, v, "bshd", **{n: x for n, x in changed.items() if n != "layout"})[0]
            assert_close(attention(q, k, v, **changed), want, TOL_OUT, str(changed))
        assert fresh.size() == held + 3
        # What the table cannot hold runs the Python path: a list window, a tensor subclass
        calls = native.table_calls()
        listed = attention(q, k, v, attn_scale=0.5, window_size=[-1, -1])
        assert torch.equal(listed, attention(q, k, v, attn_scale=0.5))

        class Sub(torch.Tensor):
            pass

        sub = attention(q.as_subclass(Sub), k, v, attn_scale=0.5)
        assert torch.equal(sub.as_subclass(torch.Tensor), listed)
        assert native.table_calls() == calls + 1  # only the plain call
        clear_plans()
        assert fresh.size() == 0 and native.table_calls() == 0


def test_training_and_inference_of_one_geometry_are_two_signatures(fresh):
    q, k, v = _tensors("bshd", s=64)
    _filed(lambda: attention(q, k, v))
    with torch.no_grad():
        _filed(lambda: attention(q, k, v))
    assert fresh.size() == 2
    before = native.table_calls()
    with torch.no_grad():
        assert attention(q, k, v).grad_fn is None
    assert attention(q, k, v).grad_fn.name() == "LeanAttentionBackward"
    detached = [t.detach() for t in (q, k, v)]
    assert attention(*detached).grad_fn is None  # no input wants grads: the inference signature
    assert native.table_calls() == before + 3 and fresh.size() == 2  # each found, none filed anew


def test_captured_calls_are_their_own_signature_and_replay(fresh):
    q, k, v = _tensors("bshd", grad=False)
    with torch.no_grad():
        _filed(lambda: attention(q, k, v, mask="causal"))
        held = fresh.size()
        capture(lambda: attention(q, k, v, mask="causal"))  # the captured call: decided under capture, filed
        assert fresh.size() == held + 1
        before = native.table_calls()
        graph, captured = capture(lambda: attention(q, k, v, mask="causal"))
        assert native.table_calls() == before + 2  # its run on the side stream and its captured call
        for seed in (1, 2):
            for t in (q, k, v):
                t.copy_(torch.randn(t.shape, generator=torch.Generator(device=CUDA).manual_seed(seed), device=CUDA))
            graph.replay()
            assert_close(captured, _reference(q, k, v, "bshd", mask="causal")[0], TOL_OUT, f"replay {seed}")


def test_the_table_keys_calls_on_the_argument_kinds_python_declares(fresh):
    from fusedattn_select.runtime.args import TABLE_ARGUMENTS

    q, k, v = _tensors("bshd", s=72, grad=False)
    with torch.no_grad():
        _filed(lambda: attention(q, k, v, mask="causal"))
        calls = native.table_calls()
        try:
            fresh.set_argument_kinds([])  # no kinds declared: the table holds no call
            attention(q, k, v, mask="causal")
            assert native.table_calls() == calls
            with pytest.raises(ValueError, match="unknown argument kind 'float'"):
                fresh.set_argument_kinds(["str", "float"])
        finally:
            fresh.set_argument_kinds(list(TABLE_ARGUMENTS.values()))
        attention(q, k, v, mask="causal")
        assert native.table_calls() == calls + 1
        # Each declared kind takes what it names: attn_scale (a "number?") given as a float is held; a
        # window_size given as a list is not an "int-tuple" (the Python path runs the call).
        _filed(lambda: attention(q, k, v, mask="causal", attn_scale=0.125))
        calls = native.table_calls()
        attention(q, k, v, mask="causal", attn_scale=0.125)
        assert native.table_calls() == calls + 1
        attention(q, k, v, mask="causal", attn_scale=0.125, window_size=[-1, -1])
        assert native.table_calls() == calls + 1
