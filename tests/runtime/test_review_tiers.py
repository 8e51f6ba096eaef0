"""Review repros for first contact (runtime/tiers.py: commits 3a46beb, b12431d, 4d35990, and the fixes
968bf53 / 9464279 that followed).

Open defects are marked xfail(strict=True): such a test passes (and so fails the suite) once its
defect is fixed, when the mark should go. The tests at the end, unmarked, are regressions for
defects this review found that 9464279 fixed. Nothing here runs a GPU kernel: cuDNN runs are stood
in for by callables, CUDA events by a stub and `is_cuda` by a subclass.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
import types
import weakref

import pytest

torch = pytest.importorskip("torch")
import torch.utils.checkpoint  # noqa: E402 - the checkpoint test uses it

from fusedattn_select.config import AttnConfig
from fusedattn_select.runtime import api, dense_builds, entries, fallback, tiers
from fusedattn_select.runtime.dispatcher import Job, Preparer, dispatcher
from fusedattn_select.runtime.args import Arguments, call_options
from fusedattn_select.runtime.entries import Entry
from fusedattn_select.runtime.fallback import FALLBACK_TORCH
from fusedattn_select.runtime.options import OptionalInputs
from fusedattn_select.result import Selection
from fusedattn_select.selection import runners
from fusedattn_select.types import Backend

NONE = OptionalInputs(None, None, None, None, None)
CFG = AttnConfig(batch_size=2, num_heads_q=4, num_heads_kv=4, seqlen_q=64, seqlen_kv=64, head_dim_qk=64)
# What a prepared cuDNN entry carries: the selection whose backend names its runner (entries.BACKEND_RUNNERS).
SELECTED = Selection(Backend.F16, "", candidate=Backend.F16, config=CFG)


def qkv(b=2, s=64, h=4, d=64):
    return tuple(torch.randn(b, s, h, d, dtype=torch.bfloat16) for _ in range(3))


def opts_of(q, k, v, **arguments):
    return call_options(q, k, v, NONE, Arguments(**arguments))


class FakeEvent:
    """torch.cuda.Event without CUDA: every timed call takes 1 ms (a tie: cuDNN is kept)."""

    def __init__(self, enable_timing=False):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 1.0


def done(value):
    future = Job()
    future.set_result(value)
    return future


def waiting_entry(opts, prepared, torch_call=None):
    return Entry(opts, fallback=FALLBACK_TORCH, torch_because="its cuDNN plans are not ready yet",
                 waiting=done(prepared), torch_call=torch_call or (lambda q, k, v: q.clone()))


@pytest.fixture
def isolated(monkeypatch):
    """Save and restore the module state these tests touch; no store reads or writes, no CUDA events,
    and a cuDNN forward that runs (tests that need it to fail patch it again)."""
    d = dispatcher
    saved = (dict(d.counters), dict(d.entries._values), dict(d.by_call), dict(d.choices), d.class_calls.copy(),
             dict(d.newest), d.class_pass.copy(), dict(d.failed_choices))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)  # the device-side wait of measure()
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(tiers.runners, "store", lambda *args: False)
    monkeypatch.setattr(tiers, "load_choice", lambda key: dispatcher.choices.get(key))
    monkeypatch.setattr(tiers, "cudnn_forward", lambda found, q, k, v: q.clone())
    monkeypatch.setattr(d, "timings", type(d.timings)())  # no timing made by another test
    yield
    counters, values, by_call, known, class_calls, newest, class_pass, failed = saved
    for table, old in ((d.counters, counters), (d.entries._values, values), (d.by_call, by_call), (d.choices, known),
                       (d.class_calls, class_calls), (d.newest, newest), (d.class_pass, class_pass),
                       (d.failed_choices, failed)):
        table.clear()
        table.update(old)


def decide_from_memory(monkeypatch):
    """tiers.entry as on a GPU whose selector exists and whose plans for the call are in memory:
    entries.new_entry returns a fused entry of CFG (a fresh one per signature)."""
    monkeypatch.setattr(tiers, "wait_reason", lambda *args: "")
    monkeypatch.setattr(dispatcher, "no_cudnn", "")  # a process whose cuDNN frontend imports
    monkeypatch.setattr(tiers.selection, "made_default_selector", lambda: object())
    monkeypatch.setattr(tiers.entries, "new_entry",
                        lambda signature, q, k, v, inputs, scales: Entry(signature[0], cfg=CFG, selection=SELECTED))


# =====================================================================================================
# Open defects (HEAD fc809ec)
# =====================================================================================================

# ----- a failing measurement: once per bucket ---------------------------------------------------------
def test_a_failing_measurement_warns_once_per_bucket(isolated, monkeypatch, caplog):
    decide_from_memory(monkeypatch)
    attempts = []

    def fails(found, q, k, v):
        attempts.append(1)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (the cuDNN workspace)")

    monkeypatch.setattr(tiers, "cudnn_forward", fails)
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    for length in (65, 66, 67):  # three decode lengths of one bucket
        q, k, v = qkv(s=length)
        assert tiers.entry((opts_of(q, k, v), f"review-len-{length}"), q, k, v, NONE, None).torch_because
    warnings = [r for r in caplog.records if "stays on torch SDPA" in r.getMessage()]
    assert len(warnings) == 1 and len(attempts) == 1, (len(warnings), len(attempts))


# ----- a swap between a checkpointed forward and its recomputation ------------------------------------
class _SavesLikeLean(torch.autograd.Function):
    """Stands in for cuDNN's LeanAttention: what it saves (q, k, v, out, stats (B, H, S, 1) float32)."""

    @staticmethod
    def forward(ctx, q, k, v):
        with torch.no_grad():
            out = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
        out = out.transpose(1, 2).contiguous()
        b, s, h, _ = q.shape
        ctx.save_for_backward(q, k, v, out, torch.zeros(b, h, s, 1, dtype=torch.float32))
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


@pytest.mark.skipif(tiers._top_hooks is None, reason="before torch 2.8 training calls wait for their cuDNN runner "
                    "(no hook stack to tell a checkpointed forward): no signature of them runs on torch first")
def test_a_swap_between_a_checkpointed_forward_and_its_recompute(isolated):
    q, k, v = (t.requires_grad_() for t in qkv(s=32))
    opts = opts_of(q, k, v)
    job = Job()
    # The signature was decided by an un-checkpointed layer's call: torch until its plans are ready.
    waiting = Entry(opts, fallback=FALLBACK_TORCH, torch_because="its cuDNN plans are not ready yet", waiting=job,
                    torch_call=tiers.torch_call(opts, q, k, v))

    def run_decided(found, q, k, v, *args):
        return _SavesLikeLean.apply(q, k, v)

    def layer(q, k, v):  # attention() of a checkpointed layer: by_call gives `waiting` until the swap
        return tiers.run(waiting, q, k, v, run_decided)

    # The checkpointed forward waits for the preparation (finished by the preparer meanwhile) and runs
    # cuDNN, as its recomputation in the backward does.
    threading.Timer(0.2, lambda: job.set_result(Entry(opts, cfg=CFG, selection=SELECTED))).start()
    out = torch.utils.checkpoint.checkpoint(layer, q, k, v, use_reentrant=False)
    out.sum().backward()


# ----- memory of a waiting signature -----------------------------------------------------------------
def test_dummies_do_not_allocate_the_callers_strided_span():
    cache_k = torch.empty(8, 4096, 8, 128, dtype=torch.bfloat16)
    cache_v = torch.empty(8, 4096, 8, 128, dtype=torch.bfloat16)
    q = torch.randn(8, 16, 32, 128, dtype=torch.bfloat16)
    k, v = cache_k[:, :16], cache_v[:, :16]  # a static cache's first 16 positions, read in place
    made = tiers.dummies(entries.key(q, k, v, opts_of(q, k, v), NONE))
    allocated = sum(t.untyped_storage().nbytes() for t in made)
    logical = sum(t.numel() * t.element_size() for t in (q, k, v))
    assert allocated <= 2 * logical, f"{allocated / 2**20:.1f} MiB allocated for {logical / 2**20:.2f} MiB of tensors"


def test_a_failed_preparation_does_not_keep_its_dummies_alive(monkeypatch):
    monkeypatch.setattr(tiers.selection, "made_default_selector", lambda: object())
    monkeypatch.setattr(dense_builds, "ask_decide", lambda *args, **kwargs: None)
    seen = []

    def new_entry(signature, q, k, v, inputs, scales):
        seen.extend(weakref.ref(t) for t in (q, k, v))
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(tiers.entries, "new_entry", new_entry)
    q, k, v = qkv()
    signature = entries.key(q, k, v, opts_of(q, k, v), NONE)
    job = Preparer("test-prepare").submit(lambda: tiers.prepare(signature))
    assert isinstance(job.exception(timeout=30), RuntimeError)
    gc.collect()
    assert seen and all(ref() is None for ref in seen), "the dummies are alive while the failed job is kept"


def test_a_preparers_job_is_finished_once_its_result_or_error_is_set():
    # A waiting signature reads `finished` on every call, never Future.done() (which takes a lock).
    release = threading.Event()
    preparer = Preparer("test-prepare")
    job = preparer.submit(lambda: release.wait(30) and "prepared")
    failed = preparer.submit(lambda: 1 / 0)
    assert not job.finished and not job.done()
    release.set()
    assert job.result(timeout=30) == "prepared" and job.finished
    assert isinstance(failed.exception(timeout=30), ZeroDivisionError) and failed.finished


# ----- settings the store takes with a warning stop every preparation --------------------------------
def test_an_unknown_cache_switch_value_does_not_stop_preparing(monkeypatch, use_settings):
    use_settings(dense_builds=dense_builds.PROCESS)
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE", "maybe")  # open_default_store: "using the persistent cache"
    dense_builds.fresh_store_target(0)  # raises ConfigError today


# ----- stored runner choices are rows of the plans table ---------------------------------------------
def _store_selector(directory):
    from fusedattn_select.store import PersistentStore
    from fusedattn_select.types import Fingerprint

    fingerprint = Fingerprint("test-double", "Test GPU H100", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")
    return types.SimpleNamespace(store=PersistentStore(str(directory)), fingerprint=fingerprint)


def test_a_runner_choice_persists_where_serialized_plans_are_refused(tmp_path):
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(0o770)  # a group-shared cache: decisions are cached, plans are refused
    selector = _store_selector(directory)
    assert selector.store.info()["plans_enabled"] is False
    choice = runners.Choice(runners.TORCH, 9.0, 10.0)
    assert runners.store(selector, "some-bucket", choice)
    assert runners.stored(_store_selector(directory), "some-bucket") == choice


def test_a_runner_choice_is_not_counted_as_a_plan(tmp_path):
    directory = tmp_path / "own"
    directory.mkdir(mode=0o700)
    selector = _store_selector(directory)
    assert runners.store(selector, "some-bucket", runners.Choice(runners.CUDNN, 12.0, 10.0))
    info = selector.store.info()
    assert (info["plans"], info["runner_choices"]) == (0, 1)


# =====================================================================================================
# Regressions: defects this review found in 3a46beb..968bf53 that 9464279 fixed
# =====================================================================================================
def _raising_cudnn(found, q, k, v):
    raise RuntimeError("cuDNN: CUDNN_STATUS_EXECUTION_FAILED")


def test_a_measurement_that_raises_during_a_swap_leaves_the_call_on_torch(isolated, monkeypatch):
    monkeypatch.setattr(tiers, "cudnn_forward", _raising_cudnn)
    q, k, v = qkv()
    opts = opts_of(q, k, v)
    waiting = waiting_entry(opts, Entry(opts, cfg=CFG, selection=SELECTED))
    out = tiers.run(waiting, q, k, v, lambda *args: pytest.fail("the failed runner was swapped in"))
    torch.testing.assert_close(out, q)
    assert "failed when timed" in waiting.torch_because


def test_a_measurement_that_raises_while_deciding_from_memory_leaves_the_signature_on_torch(isolated, monkeypatch):
    decide_from_memory(monkeypatch)
    monkeypatch.setattr(tiers, "cudnn_forward", _raising_cudnn)
    q, k, v = qkv()
    assert tiers.entry((opts_of(q, k, v), "review-raise"), q, k, v, NONE, None).torch_because


def test_calls_of_other_threads_during_a_measurement_are_counted(isolated):
    q, k, v = qkv()
    opts = opts_of(q, k, v)
    other = Entry(opts, fallback=FALLBACK_TORCH, torch_because="measured faster", torch_call=lambda q, k, v: q)

    def run_decided(found, *args):
        dispatcher.counters["calls"] += 1
        dispatcher.counters["fused_calls"] += 1
        return q

    started = []

    def torch_side(q, k, v):
        if not started:  # another thread's attention() call of another signature, during the measurement
            started.append(True)
            thread = threading.Thread(target=tiers.run, args=(other, q, k, v, run_decided))
            thread.start()
            thread.join()
        return q

    before = dict(dispatcher.counters)
    tiers.run(waiting_entry(opts, Entry(opts, cfg=CFG, selection=SELECTED), torch_side), q, k, v, run_decided)
    assert dispatcher.counters["torch_calls"] == before["torch_calls"] + 1  # the other thread's call
    assert dispatcher.counters["calls"] == before["calls"] + 2            # its call and this one


def test_clear_plans_during_a_measurement_keeps_the_counters_cleared(isolated, monkeypatch):
    q, k, v = qkv()
    opts = opts_of(q, k, v)
    dispatcher.counters["calls"] = dispatcher.counters["fused_calls"] = 100

    def cudnn_then_clear(found, q, k, v):
        api.clear_plans()  # another thread
        return q

    monkeypatch.setattr(tiers, "cudnn_forward", cudnn_then_clear)

    def run_decided(found, *args):
        dispatcher.counters["calls"] += 1
        dispatcher.counters["fused_calls"] += 1
        return q

    tiers.run(waiting_entry(opts, Entry(opts, cfg=CFG, selection=SELECTED)), q, k, v, run_decided)
    assert dispatcher.counters["calls"] <= 1, dispatcher.counters


def test_measurement_calls_do_not_count_toward_the_promotion(isolated):
    q, k, v = qkv()
    opts = opts_of(q, k, v)
    prepared = Entry(opts, cfg=CFG, selection=SELECTED, ragged_forward={}, shape_class="review-class",
                     lean=types.SimpleNamespace(native=lambda q, k, v: q.clone()))
    tiers.run(waiting_entry(opts, prepared), q, k, v, api._run)
    assert prepared.calls == 1, prepared.calls


class ClaimsCuda(torch.Tensor):
    @property
    def is_cuda(self) -> bool:
        return True


def test_torch_deterministic_mode_waits(monkeypatch, use_settings):
    monkeypatch.setattr(tiers, "_flash_or_efficient", lambda *args: True)  # what a GPU answers for this problem
    use_settings(first_calls="torch")  # the default (tests/gpu/conftest.py sets the env to wait)
    q, k, v = qkv()
    signature = entries.key(q, k, v, opts_of(q, k, v, mask="causal"), NONE)
    cq, ck, cv = (t.as_subclass(ClaimsCuda) for t in (q, k, v))
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert "determinis" in tiers.wait_reason(signature, cq, ck, cv, NONE, None)
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("served", ["waiting", "measured torch faster"])
def test_the_compiled_ops_get_the_cudnn_entry_of_a_torch_served_signature(isolated, served):
    q, k, v = qkv()
    opts = opts_of(q, k, v)
    cudnn = Entry(opts, cfg=CFG, selection=SELECTED)
    if served == "waiting":
        found = waiting_entry(opts, cudnn)
    else:  # what tiers.apply_choice files when torch was measured faster
        found = tiers.apply_choice(cudnn, tiers.Choice(tiers.TORCH, 9.0, 10.0),
                                    Entry(opts, fallback=FALLBACK_TORCH, torch_call=tiers.torch_call(opts, q, k, v)))
    signature = entries.key(q, k, v, opts, NONE)
    assert tiers.cudnn_entry(found, signature, q, k, v, NONE, None) is cudnn


# ----- one bucket, two runners (fixed: tiers.measure_once) --------------------------------------------------------------------
def test_two_signatures_of_one_bucket_decided_at_once_share_one_measured_choice(isolated, monkeypatch):
    decide_from_memory(monkeypatch)
    q, k, v = qkv()
    opts = opts_of(q, k, v)
    measured = []
    lock = threading.Lock()
    meet = threading.Barrier(2)

    def measure(key, *args):
        with lock:
            measured.append(key)
            # The two timings land on either side of the 2% tie rule.
            choice = tiers.Choice(tiers.TORCH if len(measured) == 1 else tiers.CUDNN, 9.9, 10.0)
        try:
            meet.wait(timeout=2)  # both threads measure at once (a fixed version has one wait instead)
        except threading.BrokenBarrierError:
            pass
        dispatcher.choices[key] = choice
        return choice

    monkeypatch.setattr(tiers, "measure", measure)
    got = {}

    def decide(name):
        got[name] = tiers.entry((opts, name), q, k, v, NONE, None)

    threads = [threading.Thread(target=decide, args=(name,)) for name in ("review-a", "review-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(measured) == 1, measured
    assert bool(got["review-a"].torch_because) == bool(got["review-b"].torch_because)


# ----- the torch runner and the process-wide cuDNN SDPA switch (fixed: tiers.torch_call never turns it) ----------------------------------------
def test_torch_call_does_not_undo_a_switch_change_made_meanwhile(monkeypatch):
    q, k, v = qkv()
    call = tiers.torch_call(opts_of(q, k, v), q, k, v)
    real = fallback.torch_sdpa

    def sdpa_while_another_thread_turns_cudnn_off(*args, **kwargs):
        torch.backends.cuda.enable_cudnn_sdp(False)  # the user's own setting, from another thread
        return real(*args, **kwargs)

    monkeypatch.setattr(fallback, "torch_sdpa", sdpa_while_another_thread_turns_cudnn_off)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        call(q, k, v)
        assert torch.backends.cuda.cudnn_sdp_enabled() is False  # the other thread's setting stands
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


# ----- the paths that never switch kernels ----------------------------------------------------------
def test_a_signature_whose_cudnn_runner_failed_when_timed_stays_on_torch_under_checkpointing(isolated, monkeypatch):
    q, k, v = (t.requires_grad_() for t in qkv(s=32))
    found = waiting_entry(opts_of(q, k, v), Entry(opts_of(q, k, v), cfg=CFG, selection=SELECTED))

    def fails(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (the cuDNN workspace)")

    monkeypatch.setattr(tiers, "cudnn_forward", fails)
    monkeypatch.setattr(tiers.entries, "new_entry", lambda *args: pytest.fail("decided again on the caller's thread"))
    ran = []
    tiers.run(found, q, k, v, lambda entry, *args: ran.append(entry) or q)  # the swap's timing fails: torch
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        tiers.run(found, q, k, v, lambda entry, *args: ran.append(entry) or q)
    assert ran == [] and "failed when timed" in found.torch_because


def test_an_entry_decided_under_capture_as_itself_is_not_its_own_cudnn_entry(isolated, monkeypatch):
    # Under CUDA-graph capture entries.new_entry may answer with the signature's eager entry, which is
    # `found` itself: that must not become found.cudnn (it would be asked again as its own cuDNN entry).
    q, k, v = qkv(s=32)
    opts = opts_of(q, k, v)
    found = Entry(opts, fallback=FALLBACK_TORCH, torch_because="its cuDNN plans are not ready yet",
                  torch_call=lambda q, k, v: q.clone())
    monkeypatch.setattr(dispatcher, "no_cudnn", "")
    monkeypatch.setattr(tiers.entries, "new_entry", lambda *args: found)
    assert tiers.cudnn_entry(found, entries.key(q, k, v, opts, NONE), q, k, v, NONE, None) is found
    assert found.cudnn is None


# ----- notes said once per process (Dispatcher.first_time) ------------------------------------------
def test_first_time_is_true_once_per_note_across_threads_and_survives_clear():
    from fusedattn_select.runtime.dispatcher import Dispatcher

    fresh = Dispatcher()
    answers: list[bool] = []
    start = threading.Barrier(8)

    def ask() -> None:
        start.wait()
        answers.append(fresh.first_time("a note"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [False] * 7 + [True]
    assert fresh.first_time("another note")
    fresh.clear()  # forgets decisions, not what was said
    assert not fresh.first_time("a note")


# ----- what a measurement charges a runner ----------------------------------------------------------
def _busy(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class DeviceClock:
    """torch.cuda.Event and the measurement's device-side hold without CUDA: an end event reads the
    device time the runner called since its start event declared (`spend`), 1 ms where none did."""

    def __init__(self, monkeypatch):
        self.pending, self.holds, self.devices = 1.0, [], []
        clock = self

        class Event:
            def __init__(self, enable_timing=False):
                self.ms = 0.0

            def record(self, stream=None):
                self.ms, clock.pending = clock.pending, 1.0

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.ms

        @contextlib.contextmanager
        def device(where):
            clock.devices.append(where)
            yield

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "_sleep", self.holds.append)
        monkeypatch.setattr(torch.cuda, "device", device)

    def spend(self, ms):
        self.pending = ms


def _measured(monkeypatch, cudnn_side, torch_side=lambda: None):
    """The choice measure() makes with `cudnn_side` and `torch_side` run by the two runners' calls."""
    monkeypatch.setattr(tiers, "cudnn_forward", lambda found, q, k, v: cudnn_side() or q.clone())
    q, k, v = qkv()
    opts = opts_of(q, k, v)
    keeper = waiting_entry(opts, None, torch_call=lambda q, k, v: torch_side() or q.clone())
    return tiers.measure("review-cost", keeper, Entry(opts, cfg=CFG, selection=SELECTED), q, k, v)


def test_a_runner_is_charged_its_host_time_where_that_exceeds_its_device_time(isolated, monkeypatch):
    DeviceClock(monkeypatch)  # 1 ms of device time per call, each runner
    choice = _measured(monkeypatch, lambda: _busy(0.003))  # 3 ms of this thread's CPU per call
    assert choice.runner == tiers.TORCH and choice.cudnn_us >= 3000 and choice.torch_us < 3000, choice


def test_a_runner_is_charged_its_device_time_where_that_exceeds_its_host_time(isolated, monkeypatch):
    clock = DeviceClock(monkeypatch)
    choice = _measured(monkeypatch, lambda: clock.spend(0.2), torch_side=lambda: clock.spend(4.0))
    assert choice == tiers.Choice(tiers.CUDNN, 4000.0, 200.0), choice


def test_a_runner_is_not_charged_for_waiting_on_other_threads(isolated, monkeypatch):
    # A GIL wait or another process's CPU use: the calling thread is off the CPU, as in time.sleep.
    DeviceClock(monkeypatch)
    choice = _measured(monkeypatch, lambda: time.sleep(0.005))
    assert choice.runner == tiers.CUDNN and choice.cudnn_us < 2000, choice


def test_each_cost_is_the_least_of_its_timed_calls(isolated, monkeypatch):
    # The warm-up call and the first three timed calls of the cuDNN runner are slow (as calls met by a
    # burst of other work would be), the last two are not: the least, not the median, is its cost.
    clock, calls = DeviceClock(monkeypatch), []

    def cudnn_side():
        calls.append(1)
        clock.spend(5.0 if len(calls) <= 4 else 0.5)

    choice = _measured(monkeypatch, cudnn_side)
    assert len(calls) == 1 + tiers.ROUNDS and choice.runner == tiers.CUDNN and choice.cudnn_us < 1000, choice


@pytest.mark.parametrize("fails", ["cuDNN", "timing", "torch and cuDNN"])
def test_a_failure_when_timed_names_the_runner_that_failed_or_the_timing(isolated, monkeypatch, fails):
    DeviceClock(monkeypatch)

    def raise_if(side):
        def call():
            if side in fails.split(" and "):
                raise RuntimeError(f"{side} broke")
        return call

    if fails == "timing":
        def no_hold(cycles):
            raise RuntimeError("timing broke")
        monkeypatch.setattr(torch.cuda, "_sleep", no_hold)
    q, k, v = qkv()
    opts = opts_of(q, k, v)
    keeper = waiting_entry(opts, None, torch_call=lambda q, k, v: raise_if("torch")() or q.clone())
    monkeypatch.setattr(tiers, "cudnn_forward", lambda found, q, k, v: raise_if("cuDNN")() or q.clone())
    assert tiers.measure("review-blame", keeper, Entry(opts, cfg=CFG, selection=SELECTED), q, k, v) is None
    said = {"cuDNN": "its cuDNN runner failed when timed (RuntimeError: cuDNN broke)",
            "timing": "its runners could not be timed (RuntimeError: timing broke)",
            "torch and cuDNN": "its torch runner failed when timed (RuntimeError: torch broke); its cuDNN runner "
                               "failed too (RuntimeError: cuDNN broke)"}[fails]
    assert keeper.torch_because == said and dispatcher.failed_choices["review-blame"] == said


def test_where_only_the_torch_runner_fails_when_timed_cudnn_runs_the_bucket_untimed_and_unstored(isolated,
                                                                                                 monkeypatch, caplog):
    # An out-of-memory error of the torch runner passes: torch must not keep the bucket for the process.
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    DeviceClock(monkeypatch)
    stored = []
    monkeypatch.setattr(tiers.runners, "store", lambda *args: stored.append(args) or True)
    cudnn_calls = []

    def torch_side(q, k, v):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (torch's flash)")

    monkeypatch.setattr(tiers, "cudnn_forward", lambda found, q, k, v: cudnn_calls.append(1) or q.clone())
    q, k, v = qkv()
    opts = opts_of(q, k, v)
    prepared = Entry(opts, cfg=CFG, selection=SELECTED)
    waiting = waiting_entry(opts, prepared, torch_call=torch_side)
    ran, measured = [], dispatcher.counters["measured"]
    tiers.run(waiting, q, k, v, lambda entry, *args: ran.append(entry) or q)
    assert ran == [prepared] and cudnn_calls, "the swap did not put the cuDNN runner in place"
    assert stored == [] and dispatcher.counters["measured"] == measured
    choice = dispatcher.choices[tiers.runner_key(prepared)]
    assert choice.runner == tiers.CUDNN and "its torch runner failed when timed (OutOfMemoryError" in choice.why()
    assert tiers.describe_choices()[tiers.runner_key(prepared)].startswith("cuDNN (its torch runner failed")
    said = [r for r in caplog.records if "OutOfMemoryError" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING, [r.getMessage() for r in said]  # the swap: once


def test_a_device_fault_of_the_cudnn_runner_is_blamed_on_it_not_on_a_later_call(isolated, monkeypatch):
    # CUDA reports a kernel's fault at a later synchronisation: the warm-up calls are each waited for.
    DeviceClock(monkeypatch)
    faults = []

    class FaultingEvent(torch.cuda.Event):
        def synchronize(self):
            if faults:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "Event", FaultingEvent)
    monkeypatch.setattr(tiers, "cudnn_forward", lambda found, q, k, v: faults.append(1) or q.clone())
    q, k, v = qkv()
    opts = opts_of(q, k, v)
    keeper = waiting_entry(opts, None, torch_call=lambda q, k, v: q.clone())
    assert tiers.measure("review-fault", keeper, Entry(opts, cfg=CFG, selection=SELECTED), q, k, v) is None
    assert keeper.torch_because.startswith("its cuDNN runner failed when timed (RuntimeError: CUDA error"), \
        keeper.torch_because


def test_the_timed_calls_queue_behind_one_hold_on_the_callers_device(isolated, monkeypatch):
    clock = DeviceClock(monkeypatch)
    _measured(monkeypatch, lambda: None)
    assert clock.holds == [tiers.HOLD_CYCLES] and clock.devices == [torch.device("cpu")]


def test_a_torch_runner_failing_in_a_timed_round_leaves_the_whole_bucket_to_cudnn_said_once(isolated, monkeypatch,
                                                                                           caplog):
    # Its warm-up call passes and a timed call fails; the bucket's later signatures reuse the untimed choice.
    decide_from_memory(monkeypatch)
    DeviceClock(monkeypatch)
    cudnn_calls, torch_calls = [], []

    def torch_side(q, k, v):
        torch_calls.append(1)
        if len(torch_calls) == 2:
            raise RuntimeError("torch broke in a timed call")
        return q.clone()

    monkeypatch.setattr(tiers, "torch_call", lambda opts, q, k, v: torch_side)
    monkeypatch.setattr(tiers, "cudnn_forward", lambda found, q, k, v: cudnn_calls.append(1) or q.clone())
    caplog.set_level(logging.INFO, logger="fusedattn_select")  # the warning, and no INFO line saying it again
    found = []
    for length in (65, 66, 67):  # three lengths of one bucket
        q, k, v = qkv(s=length)
        found.append(tiers.entry((opts_of(q, k, v), f"review-round-{length}"), q, k, v, NONE, None))
    assert all(entry.fused and not entry.torch_because for entry in found), [e.torch_because for e in found]
    assert len(torch_calls) == 2, "timed again for a later signature of the bucket"
    said = [r.getMessage() for r in caplog.records if "torch broke" in r.getMessage()]
    assert len(said) == 1 and "cuDNN runs its bucket in this process" in said[0], said
