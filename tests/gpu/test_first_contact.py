"""First contact on a real GPU (the default, FUSEDATTN_SELECT_FIRST_CALLS=torch): a new signature runs
on torch SDPA at once while its plans are prepared off the caller's path, a later call swaps in the
measured runner with outputs and gradients that still match the reference, the choice is persisted
for the next process, the next buckets are built ahead, and the waiting cases decide on the first call.

Each test uses a problem class (head counts and head dim) no other GPU test uses, so nothing of it
is in memory or in the store when it starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from gpu_setup import CUDA, GPU_MARKS, assert_close, torch

from fusedattn_select.reference.autograd_reference import reference_attention_bshd
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime import fallback, tiers
from fusedattn_select.runtime.args import Arguments, call_options
from fusedattn_select.runtime.options import OptionalInputs
from fusedattn_select.runtime.api import attention, dispatch_info

pytestmark = GPU_MARKS + [pytest.mark.first_contact]
TOL_OUT, TOL_GRAD = 2e-2, 4e-2
SWAP_WAIT_S = 180  # the worker process starts (imports, CUDA context, cuDNN) and builds: tens of seconds at most


def _tensors(b, s, hq, hkv, d, seed=0, grad=True):
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    make = lambda h: torch.randn(b, s, h, d, generator=gen, device=CUDA).to(torch.bfloat16).requires_grad_(grad)
    return make(hq), make(hkv), make(hkv)


def _entry(q, k, v):
    """The entry attention() filed for this call (its newest one)."""
    return list(dispatcher.entries.values())[-1]


def _check_against_reference(q, k, v, **kwargs):
    out = attention(q, k, v, **kwargs)
    grad = torch.randn_like(out)
    out.backward(grad)
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref = reference_attention_bshd(qd, kd, vd, **kwargs)
    ref.backward(grad.double())
    assert_close(out, ref, TOL_OUT, "out")
    for name, got, want in (("dq", q.grad, qd.grad), ("dk", k.grad, kd.grad), ("dv", v.grad, vd.grad)):
        assert_close(got, want, TOL_GRAD, name)
    for t in (q, k, v):
        t.grad = None


def test_a_new_signature_runs_torch_then_swaps_in_cudnn_with_the_same_results(monkeypatch):
    measured = []
    real_measure = tiers.measure

    def measure_then_keep_cudnn(key, *args):
        # The measurement runs for real; cuDNN is kept so that this test checks the swapped-in runner.
        measured.append(real_measure(key, *args))
        return tiers.Choice(tiers.CUDNN, measured[-1].torch_us, measured[-1].cudnn_us)

    monkeypatch.setattr(tiers, "measure", measure_then_keep_cudnn)
    q, k, v = _tensors(2, 333, 6, 3, 96)
    before = dispatch_info()
    started = time.perf_counter()
    _check_against_reference(q, k, v, mask="causal")
    first = _entry(q, k, v)
    assert first.torch_because and first.waiting is not None, "the first call did not run on torch"
    after_first = dispatch_info()
    assert after_first["torch_calls"] == before["torch_calls"] + 1
    assert after_first["plan_builds"] == before["plan_builds"], "the caller built a plan"
    while dispatch_info()["swaps"] == before["swaps"]:
        assert time.perf_counter() - started < SWAP_WAIT_S, "no swap: the plans were never prepared"
        time.sleep(0.05)
        _check_against_reference(q, k, v, mask="causal")  # on torch, or on the swapped-in runner
    _check_against_reference(q, k, v, mask="causal")
    swapped = _entry(q, k, v)
    assert swapped.fused and not swapped.torch_because and swapped.forward is not None
    assert measured and measured[0].torch_us > 0 and measured[0].cudnn_us > 0
    assert dispatch_info()["plan_builds"] == before["plan_builds"], "the caller built a plan: the worker should have"


def test_a_torch_runner_that_fails_when_timed_leaves_its_bucket_to_cudnn_untimed(monkeypatch):
    # TEST DOUBLE for torch's failure only: inside the timing, the torch runner raises an out-of-memory
    # error (one that passes); the cuDNN runner, the worker, the swap and the outputs are real.
    timing = []
    real_measure = tiers.measure

    def measure_flagged(*args):
        timing.append(True)
        try:
            return real_measure(*args)
        finally:
            timing.pop()

    monkeypatch.setattr(tiers, "measure", measure_flagged)
    q, k, v = _tensors(2, 222, 22, 11, 64, seed=5)
    before = dispatch_info()
    started = time.perf_counter()
    _check_against_reference(q, k, v, mask="causal")
    first = _entry(q, k, v)
    assert first.torch_because and first.waiting is not None, "the first call did not run on torch"
    real_torch = first.torch_call

    def out_of_memory_when_timed(*args):
        if timing:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test double: the torch runner when timed)")
        return real_torch(*args)

    first.torch_call = out_of_memory_when_timed
    while dispatch_info()["swaps"] == before["swaps"]:
        assert "failed when timed" not in first.torch_because, first.torch_because  # torch kept it: at once
        assert time.perf_counter() - started < SWAP_WAIT_S, "no swap: the plans were never prepared"
        time.sleep(0.05)
        _check_against_reference(q, k, v, mask="causal")
    _check_against_reference(q, k, v, mask="causal")
    swapped = _entry(q, k, v)
    assert swapped.fused and not swapped.torch_because, swapped.torch_because
    info = dispatch_info()
    assert info["measured"] == before["measured"], "an untimed choice was counted as measured"
    said = [why for why in info["runners"].values() if "OutOfMemoryError" in why]
    assert len(said) == 1 and said[0].startswith("cuDNN (its torch runner failed when timed") and \
        said[0].endswith("not timed)"), info["runners"]


@pytest.mark.parametrize("case,kernel", [
    ("tiny", "efficient"), ("tiny causal", "efficient"), ("decode MHA", "efficient"), ("decode GQA", "flash"),
    ("decode, many keys", "flash"), ("many scores", "flash"), ("tiny, training", "flash"), ("prefill", "flash"),
])
def test_the_torch_runner_calls_its_kernel_with_the_reference_results(case, kernel, monkeypatch):
    # Small inference calls without grouped KV heads run on the memory-efficient kernel, the rest on
    # flash ("many scores": 512 keys at most, but more than SMALL_SCORES scores in its bucket); each
    # as exact as the reference, in every dim order the caller may give.
    b, sq, skv, hq, hkv, d = {"tiny": (1, 64, 64, 1, 1, 64), "tiny causal": (2, 100, 100, 4, 4, 128),
                              "decode MHA": (2, 1, 333, 12, 12, 64), "decode GQA": (1, 1, 300, 12, 4, 64),
                              "decode, many keys": (1, 1, 2000, 12, 12, 64), "many scores": (8, 256, 256, 16, 16, 64),
                              "tiny, training": (1, 64, 64, 1, 1, 64), "prefill": (1, 700, 700, 12, 4, 64)}[case]
    training = case.endswith("training")
    q, _, _ = _tensors(b, sq, hq, hkv, d, seed=3, grad=training)
    _, k, v = _tensors(b, skv, hq, hkv, d, seed=4, grad=training)
    q = q.detach().transpose(1, 2).requires_grad_(training)  # as transformers gives them: q a view,
    k, v = (t.detach().transpose(1, 2).contiguous().requires_grad_(training) for t in (k, v))  # K/V a cache's
    mask = "causal" if sq > 1 else "no_mask"
    called = []
    for name in ("_flash", "_efficient"):
        real = getattr(fallback, name)
        monkeypatch.setattr(fallback, name, lambda *args, _real=real, _name=name, **kw: called.append(_name) or
                            _real(*args, **kw))
    ref = reference_attention_bshd(*(t.detach().double().transpose(1, 2) for t in (q, k, v)), mask=mask)
    for layout, dims, back in (("bhsd", (0, 1, 2, 3), (0, 1, 2, 3)), ("bshd", (0, 2, 1, 3), (0, 2, 1, 3)),
                               ("sbhd", (2, 0, 1, 3), (1, 2, 0, 3))):
        given = tuple(t.permute(dims) for t in (q, k, v))  # the same memory in the caller's dim order
        with torch.set_grad_enabled(training):
            opts = call_options(*given, OptionalInputs(None, None, None, None, None),
                                Arguments(layout=layout, mask=mask))
            assert fallback.torch_kernel(q, k, v, 0.0, sq > 1, training) == kernel
            out = fallback.torch_call(opts, *given)(*given)
        assert out.shape == given[0].shape, layout
        assert_close(out.permute(back).transpose(1, 2), ref, TOL_OUT, f"{case} {layout} out")
    assert called == [f"_{kernel}"] * 3, f"the torch runner called {called}"


def test_the_measured_choice_serves_new_shapes_of_its_bucket_at_once():
    q, k, v = _tensors(1, 200, 10, 5, 72, grad=False)
    started = time.perf_counter()
    before = dispatch_info()
    with torch.no_grad():
        while dispatch_info()["swaps"] == before["swaps"]:
            assert time.perf_counter() - started < SWAP_WAIT_S, "no swap"
            attention(q, k, v, mask="causal")
            time.sleep(0.05)
        runner = dispatcher.choices.get(tiers.runner_key(_entry(q, k, v)))
        assert runner is not None, "the swap kept no measured choice"
        q2, k2, v2 = _tensors(1, 180, 10, 5, 72, seed=1, grad=False)  # the same bucket (256)
        attention(q2, k2, v2, mask="causal")
        new = _entry(q2, k2, v2)
    assert new.waiting is None, "a new shape of a measured bucket waited"
    assert bool(new.torch_because) == (runner.runner == tiers.TORCH)
    assert tiers.runner_key(new) in dispatch_info()["runners"]


@pytest.mark.parametrize("case", ["deterministic", "return_lse", "padding", "wait_setting"])
def test_the_waiting_cases_decide_on_the_first_call(case, use_settings):
    q, k, v = _tensors(2, 150, 14, 7, 80, seed=3)
    kwargs = {"mask": "causal"}
    if case == "deterministic":
        kwargs["deterministic"] = True
    elif case == "return_lse":
        kwargs["return_lse"] = True
    elif case == "padding":
        lengths = torch.tensor([150, 90], dtype=torch.int32, device=CUDA)
        kwargs.update(mask="padding_causal", seqlens_q=lengths, seqlens_kv=lengths)
    else:
        use_settings(first_calls="wait")
    before = dispatch_info()["torch_calls"]
    attention(q, k, v, **kwargs)
    found = _entry(q, k, v)
    assert not found.torch_because and found.waiting is None and found.fused, found.reason
    assert dispatch_info()["torch_calls"] == before


def test_a_waiting_signature_captured_in_a_cuda_graph_keeps_torch_inside_the_graph():
    q, k, v = _tensors(1, 100, 18, 9, 48, seed=4, grad=False)
    with torch.no_grad():
        expected = attention(q, k, v, mask="causal")  # torch, waiting
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            out = attention(q, k, v, mask="causal")
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
    assert_close(out, expected, 1e-3, "replayed out")


_PROCESS = textwrap.dedent("""
    import json, os, sys, time, torch
    from fusedattn_select import attention
    from fusedattn_select.runtime import tiers
    from fusedattn_select.runtime.api import dispatch_info
    from fusedattn_select.runtime.dispatcher import dispatcher
    from fusedattn_select.store.sqlite import DATABASE_NAME
    from fusedattn_select.selection.selector import default_selector
    from fusedattn_select.buckets import Bucket, bucket_form
    from fusedattn_select.runtime.api import config_from_tensors
    gen = torch.Generator(device="cuda").manual_seed(0)
    make = lambda s, h: torch.randn(2, s, h, 112, generator=gen, device="cuda").to(torch.bfloat16)
    q, k, v = make(300, 22), make(300, 11), make(300, 11)
    ahead_pid = store_empty = None
    if sys.argv[1] == "started_ahead":  # as register() does while the model loads
        assert tiers.start_early() is None
        ahead_pid = dispatcher.worker.process.pid
        time.sleep(10)  # its warm-up done (or under way): it must leave the store alone
        store_empty = not os.path.exists(os.path.join(os.environ["FUSEDATTN_SELECT_CACHE_DIR"], DATABASE_NAME))
    started = time.perf_counter()
    with torch.no_grad():
        while dispatch_info()["swaps"] == 0:
            assert time.perf_counter() - started < 180, "no swap"
            attention(q, k, v, mask="causal")
            time.sleep(0.05)
    ahead = None
    if sys.argv[1] == "wait_ahead":  # the next bucket (S=1024) built ahead into the store
        cfg = config_from_tensors(q, k, v, mask="causal", is_training=False)
        form = bucket_form(cfg.replace(seqlen_q=1000, seqlen_kv=1000))
        selector = default_selector()
        while selector.store.get(selector.fingerprint, form.cache_key()) is None:
            assert time.perf_counter() - started < 240, "the next bucket was not built ahead"
            time.sleep(0.2)
        ahead = form.cache_key()
    info = dispatch_info()
    print(json.dumps({"runners": info["runners"], "measured": info["measured"], "swaps": info["swaps"],
                      "plan_builds": info["plan_builds"], "ahead": ahead, "store_empty": store_empty,
                      "same_worker": ahead_pid is not None and dispatcher.worker.process.pid == ahead_pid}))
""")


def _process(cache_dir, mode, **env_vars):
    env = dict(os.environ, FUSEDATTN_SELECT_CACHE_DIR=str(cache_dir), FUSEDATTN_SELECT_FIRST_CALLS="torch", **env_vars)
    done = subprocess.run([sys.executable, "-c", _PROCESS, mode], check=False, env=env, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]), stderr=done.stderr)  # the worker's stderr too


def test_the_next_process_starts_with_the_measured_choice_and_the_buckets_built_ahead(tmp_path):
    first = _process(tmp_path, "wait_ahead")
    assert first["measured"] == 1 and first["swaps"] == 1 and first["ahead"]
    assert first["plan_builds"] == 0, "the caller built plans: the worker process should have"
    second = _process(tmp_path, "plain")
    assert second["measured"] == 0, "the stored choice was measured again"
    assert second["swaps"] == 1 and second["runners"] == first["runners"]


def test_a_worker_started_ahead_leaves_an_empty_store_alone_and_decides_the_first_signature(tmp_path):
    # register() starts it ahead only where one device is visible.
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    found = _process(tmp_path, "started_ahead", CUDA_VISIBLE_DEVICES=first)
    assert "the worker's warm-up failed" not in found["stderr"], found["stderr"][-3000:]
    assert found["store_empty"], "the warm-up opened the store: the first call would make its selector here"
    assert found["same_worker"], "the first call started another worker"
    assert found["swaps"] == 1 and found["plan_builds"] == 0, found


def test_start_early_makes_the_selector_in_the_background_from_a_store_that_holds_files():
    from fusedattn_select.selection import selector as selection
    from fusedattn_select.store.sqlite import DATABASE_NAME
    from fusedattn_select.store.store_settings import default_cache_dir

    assert tiers.start_early() is None, "an empty store: the worker decides first"
    assert selection.made_default_selector() is None
    made = selection.default_selector()
    default_cache_dir().mkdir(parents=True, exist_ok=True)
    (default_cache_dir() / DATABASE_NAME).touch(exist_ok=True)  # a store that holds a file
    selection.set_default_selector(None)  # as a new process with this store
    job = tiers.start_early()
    assert job is not None
    job.result(timeout=120)
    again = selection.made_default_selector()
    assert again is not None and again is not made and again.fingerprint == made.fingerprint
    assert tiers.start_early() is None
