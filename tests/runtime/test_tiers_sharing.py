"""First contact on CPU (runtime/tiers.py): new signatures of one bucket that arrive while a
preparation of that bucket is in flight wait on it instead of starting their own (a decode step's KV
length grows by one each step: every step is a new signature), and each is decided for its own
tensors at its swap. Nothing runs a GPU kernel: the cuDNN forward is stood in for by a callable,
CUDA events by a stub, and the preparer by Futures the test finishes."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import Future

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select import offpath
from fusedattn_select.config import AttnConfig
from fusedattn_select.result import Selection
from fusedattn_select.runtime import entries, tiers
from fusedattn_select.runtime.args import Arguments, call_options
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.entries import Entry
from fusedattn_select.runtime.options import OptionalInputs
from fusedattn_select.types import Backend
from tests.runtime.test_review_tiers import FakeEvent

NONE = OptionalInputs(None, None, None, None, None)
CFG = AttnConfig(batch_size=1, num_heads_q=4, num_heads_kv=4, seqlen_q=1, seqlen_kv=512, head_dim_qk=64,
                 mask="causal_bottom_right")
SELECTED = Selection(Backend.F16, "", candidate=Backend.F16, config=CFG)


def decode_step(kv_length: int):
    """q, k, v of a decode step over `kv_length` keys (BSHD), and its signature."""
    q = torch.randn(1, 1, 4, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(1, kv_length, 4, 64, dtype=torch.bfloat16) for _ in range(2))
    opts = call_options(q, k, v, NONE, Arguments(mask="causal_bottom_right"))
    return (q, k, v), entries.key(q, k, v, opts, NONE)


@pytest.fixture
def submitted(monkeypatch):
    """A process whose first signatures are not ready (no selector yet): the preparations asked for,
    as Futures the test finishes; every table these tests touch starts empty."""
    monkeypatch.setattr(tiers, "wait_reason", lambda *args: "")  # a CUDA call torch runs meanwhile
    monkeypatch.setattr(dispatcher, "no_cudnn", "")              # a process whose cuDNN frontend imports
    monkeypatch.setattr(tiers.selection, "made_default_selector", lambda: None)
    for name, empty in (("preparing", {}), ("entries", type(dispatcher.entries)()), ("choices", {}),
                        ("timings", type(dispatcher.timings)()), ("counters", Counter(dispatcher.counters)),
                        ("by_call", {})):
        monkeypatch.setattr(dispatcher, name, empty)
    asked: list[Future] = []
    monkeypatch.setattr(dispatcher.preparer, "submit", lambda job: asked.append(Future()) or asked[-1])
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(tiers.runners, "store", lambda *args: False)
    monkeypatch.setattr(tiers, "load_choice", lambda key: dispatcher.choices.get(key))
    monkeypatch.setattr(tiers, "cudnn_forward", lambda found, q, k, v: q.clone())
    return asked


def decided(kv_length: int) -> tuple[Entry, tuple]:
    (q, k, v), signature = decode_step(kv_length)
    return tiers.entry(signature, q, k, v, NONE, None), (q, k, v)


def test_new_signatures_of_one_bucket_wait_on_the_preparation_in_flight(submitted):
    first, _ = decided(300)
    second, _ = decided(301)    # the next decode step: KV 301, the same bucket (512)
    other, _ = decided(700)     # another bucket (1024): a preparation of its own
    assert second.waiting is first.waiting and second.shares and not first.shares
    assert other.waiting is not first.waiting and not other.shares
    assert len(submitted) == 2 and dispatcher.counters["shared_preparations"] == 1
    assert all(e.torch_because == "its cuDNN plans are not ready yet" for e in (first, second, other))
    submitted[0].set_result(Entry(first.opts, cfg=CFG, selection=SELECTED))
    assert len(dispatcher.preparing) == 1  # a finished preparation is forgotten; the other bucket's is in flight
    third, _ = decided(302)     # the bucket's preparation is done: no job in flight to share
    assert third.waiting is not first.waiting and not third.shares and len(submitted) == 3


def test_a_shared_preparation_is_decided_again_for_the_callers_own_signature_at_its_swap(submitted, monkeypatch):
    first, _ = decided(300)
    second, (q, k, v) = decided(301)
    prepared_for_first = Entry(first.opts, cfg=CFG, selection=SELECTED)
    submitted[0].set_result(prepared_for_first)
    own = Entry(second.opts, cfg=CFG.replace(seqlen_kv=301), selection=SELECTED)
    asked = []

    def from_memory(signature, *call):
        assert offpath.limit() is offpath.MEMORY  # decided from what memory holds, never built here
        asked.append(signature)
        return own

    monkeypatch.setattr(tiers.entries, "new_entry", from_memory)
    swapped = tiers.swap(second, second.waiting, q, k, v, lambda *args: pytest.fail("no call runs here"))
    assert swapped is own and asked == [entries.key(q, k, v, second.opts, NONE)]
    assert dispatcher.counters["swaps"] == 1


def test_a_shared_preparation_that_memory_cannot_serve_starts_the_signatures_own(submitted, monkeypatch):
    first, _ = decided(300)
    second, (q, k, v) = decided(301)
    job = second.waiting
    submitted[0].set_result(Entry(first.opts, cfg=CFG, selection=SELECTED))

    def not_in_memory(*args):
        raise offpath.NotReady("its plans are not in memory")

    monkeypatch.setattr(tiers.entries, "new_entry", not_in_memory)
    after = tiers.swap(second, job, q, k, v, lambda *args: pytest.fail("no call runs here"))
    # Still on torch, waiting on a preparation of its own (not on torch for good).
    assert after is second and second.waiting is submitted[-1] and second.waiting is not job
    assert not second.shares and second.torch_because == "its cuDNN plans are not ready yet"
    assert len(submitted) == 2 and dispatcher.counters["stays_on_torch"] == 0


def test_a_third_signature_that_meets_the_seconds_own_preparation_is_still_decided_for_itself(submitted, monkeypatch):
    first, _ = decided(300)
    second, call2 = decided(301)
    third, call3 = decided(302)
    submitted[0].set_result(Entry(first.opts, cfg=CFG, selection=SELECTED))
    memory: dict = {}

    def from_memory(signature, *call):
        if signature not in memory:
            raise offpath.NotReady("its plans are not in memory")
        return memory[signature]

    monkeypatch.setattr(tiers.entries, "new_entry", from_memory)
    never = lambda *args: pytest.fail("no call runs here")  # noqa: E731
    tiers.swap(second, second.waiting, *call2, never)   # memory lacks it: its own preparation
    assert second.waiting is submitted[1] and not second.shares
    tiers.swap(third, third.waiting, *call3, never)     # meets the second's preparation in flight: shares it
    assert third.waiting is submitted[1] and third.shares
    submitted[1].set_result(Entry(second.opts, cfg=CFG.replace(seqlen_kv=301), selection=SELECTED))
    own = memory[entries.key(*call3, third.opts, NONE)] = Entry(third.opts, cfg=CFG.replace(seqlen_kv=302),
                                                                 selection=SELECTED)
    assert tiers.swap(third, third.waiting, *call3, never) is own  # never the second's entry


def test_a_failed_shared_preparation_does_not_leave_the_other_signatures_on_torch_for_good(submitted, monkeypatch):
    first, _ = decided(300)
    second, call = decided(301)
    submitted[0].set_exception(RuntimeError("the worker process exited with code -9"))
    own = Entry(second.opts, cfg=CFG.replace(seqlen_kv=301), selection=SELECTED)
    monkeypatch.setattr(tiers.entries, "new_entry", lambda signature, *args: own)
    assert tiers.swap(second, second.waiting, *call, lambda *args: pytest.fail("no call runs here")) is own
    assert dispatcher.counters["stays_on_torch"] == 0


def test_a_sharer_whose_decision_fails_otherwise_stays_on_torch_and_says_why(submitted, monkeypatch):
    first, _ = decided(300)
    second, call = decided(301)
    submitted[0].set_result(Entry(first.opts, cfg=CFG, selection=SELECTED))

    def broken(*args):
        raise RuntimeError("a stored plan did not load")

    monkeypatch.setattr(tiers.entries, "new_entry", broken)
    assert tiers.swap(second, second.waiting, *call, lambda *args: pytest.fail("no call runs here")) is second
    assert second.waiting is None and dispatcher.counters["stays_on_torch"] == 1
    assert second.torch_because == "it could not be decided from memory (RuntimeError: a stored plan did not load)"


def test_a_checkpointed_forward_and_its_recomputation_run_one_entry(submitted, monkeypatch):
    q, k, v = (t.requires_grad_() for t in decode_step(64)[0])
    opts = call_options(q, k, v, NONE, Arguments(mask="causal_bottom_right"))
    first = tiers.entry(entries.key(q, k, v, opts, NONE), q, k, v, NONE, None)
    q2, k2, v2 = (torch.randn_like(t).requires_grad_() for t in (q, k, v[:, :-1]))  # KV 63: the same bucket
    second = tiers.entry(entries.key(q2, k2, v2, opts, NONE), q2, k2, v2, NONE, None)
    assert second.shares
    submitted[0].set_result(Entry(first.opts, cfg=CFG, selection=SELECTED))
    own = Entry(second.opts, cfg=CFG.replace(seqlen_kv=63), selection=SELECTED)
    # Memory lacks it: the checkpointed forward decides it on the caller's thread, once.
    monkeypatch.setattr(tiers.entries, "new_entry",
                        lambda *args: (_ for _ in ()).throw(offpath.NotReady("not in memory"))
                        if offpath.limit() is offpath.MEMORY else own)
    ran = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        for _ in range(2):  # the forward, then its recomputation in the backward
            tiers.run(second, q2, k2, v2, lambda found, *args: ran.append(found) or q2)
    assert ran == [own, own]


def test_a_signature_whose_cudnn_runner_failed_when_timed_stays_on_torch_under_checkpointing(submitted, monkeypatch):
    q, k, v = (t.requires_grad_() for t in decode_step(64)[0])
    found = tiers.entry(entries.key(q, k, v, call_options(q, k, v, NONE, Arguments(mask="causal_bottom_right")), NONE),
                        q, k, v, NONE, None)
    submitted[0].set_result(Entry(found.opts, cfg=CFG, selection=SELECTED))

    def fails(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (the cuDNN workspace)")

    monkeypatch.setattr(tiers, "cudnn_forward", fails)
    monkeypatch.setattr(tiers.entries, "new_entry", lambda *args: pytest.fail("decided again on the caller's thread"))
    ran = []
    tiers.run(found, q, k, v, lambda entry, *args: ran.append(entry) or q)  # the swap's timing fails: torch
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        tiers.run(found, q, k, v, lambda entry, *args: ran.append(entry) or q)
    assert ran == [] and "failed when timed" in found.torch_because


def test_the_compiled_and_checkpointing_paths_decide_a_shared_signature_for_themselves(submitted, monkeypatch):
    first, _ = decided(300)
    second, (q, k, v) = decided(301)
    submitted[0].set_result(Entry(first.opts, cfg=CFG, selection=SELECTED))
    own = Entry(second.opts, cfg=CFG.replace(seqlen_kv=301), selection=SELECTED)
    monkeypatch.setattr(tiers.entries, "new_entry", lambda signature, *call: own)
    signature = entries.key(q, k, v, second.opts, NONE)
    assert tiers.cudnn_entry(second, signature, q, k, v, NONE, None) is own


def test_clear_forgets_the_preparations_in_flight(submitted):
    decided(300)
    assert dispatcher.preparing
    dispatcher.clear()
    assert dispatcher.preparing == {}
