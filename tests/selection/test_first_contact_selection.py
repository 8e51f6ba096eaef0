"""First contact in the selector: a limited decision (offpath.only) answers from memory, or memory and
the store, and never probes; the bucket index reads no store under MEMORY and does not remember that
answer; stored runner choices (selection/runners.py) round-trip through a real PersistentStore.

ScriptedTestEngine (tests/selection/test_selector.py) is a TEST DOUBLE that probes nothing and records
every probe it is asked for: "no probe" below means its call list did not grow.
"""

from __future__ import annotations

import os
import sqlite3
import threading

import pytest
from test_selector import ScriptedTestEngine, answer

from fusedattn_select import AttnConfig, offpath
from fusedattn_select.buckets import Bucket, bucket_form
from fusedattn_select.selection import runners
from fusedattn_select.planning.bucket_index import BucketIndex
from fusedattn_select.selection.selector import Selector, made_default_selector, set_default_selector
from fusedattn_select.store import MemoryStore, PersistentStore
from fusedattn_select.types import Backend, Fingerprint, Outcome, ProbeDepth, Provenance

BASE = {"batch_size": 3, "num_heads_q": 16, "num_heads_kv": 4, "seqlen_q": 1000, "seqlen_kv": 1000,
        "head_dim_qk": 128, "mask": "causal"}
FINGERPRINT = ScriptedTestEngine().fingerprint()


def config(**changes) -> AttnConfig:
    return AttnConfig(**{**BASE, **changes})


class CountingStore:
    """A real MemoryStore whose verdict reads are counted; `gate`, when set, holds the first read."""

    def __init__(self, inner=None) -> None:
        self.inner = inner if inner is not None else MemoryStore()
        self.gets = 0
        self.gate: threading.Event | None = None
        self.reading = threading.Event()

    def get(self, fingerprint, key):
        self.gets += 1
        if self.gate is not None and not self.reading.is_set():
            self.reading.set()
            self.gate.wait(5)
        return self.inner.get(fingerprint, key)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def store_yes(store, cfg: AttnConfig, outcome: Outcome = Outcome.SUPPORTED) -> None:
    """What another process's probe of `cfg` left in the store."""
    verdicts = tuple(answer(outcome)(cfg, cfg.candidate, phase, ProbeDepth.FAST) for phase in cfg.phases)
    assert store.put(FINGERPRINT, cfg.cache_key(), verdicts, ProbeDepth.FAST)


# ----- Selector under MEMORY --------------------------------------------------------------------
def test_memory_answers_a_hit_without_the_store_or_the_engine():
    engine, store = ScriptedTestEngine(), CountingStore()
    selector = Selector(engine, store=store)
    assert selector.select(config()).selected
    probes, reads = len(engine.calls), store.gets
    with offpath.only(offpath.MEMORY):
        again = selector.select(config())
        inside = selector.select(config(batch_size=4, seqlen_q=900, seqlen_kv=900))  # the same bucket
    assert again.selected and again.from_cache and inside.selected and inside.from_cache
    assert (len(engine.calls), store.gets) == (probes, reads)


@pytest.mark.parametrize("selector_of", [lambda store: Selector(ScriptedTestEngine(), store=store),
                                         lambda store: Selector(None, unavailable_reason="no GPU (test)")])
def test_memory_answers_a_rule_rejection(selector_of):
    store = CountingStore()
    selector = selector_of(store)
    with offpath.only(offpath.MEMORY):
        ruled = selector.select(config(bias="pre_scale_bias"))
    assert ruled.backend is Backend.NONE and ruled.verdicts
    assert {v.provenance for v in ruled.verdicts} == {Provenance.RULE}
    assert store.gets == 0 and (selector.engine is None or selector.engine.calls == [])


def test_memory_raises_not_ready_on_a_miss_without_reading_the_store_or_probing():
    engine, store = ScriptedTestEngine(), CountingStore()
    store_yes(store.inner, bucket_form(config()))  # the store could answer it, but memory cannot
    selector = Selector(engine, store=store)
    for cfg in (config(), config(is_training=False)):
        with offpath.only(offpath.MEMORY), pytest.raises(offpath.NotReady, match="selection of"):
            selector.select(cfg)
    assert engine.calls == [] and store.gets == 0 and selector._in_flight == {}
    assert selector.select(config()).selected and engine.calls == []  # unlimited: the store answers
    assert selector.select(config(head_dim_qk=64)).selected and len(engine.calls) == 2  # a real miss probes


def test_memory_does_not_take_a_fast_answer_for_a_full_question():
    engine = ScriptedTestEngine()
    selector = Selector(engine)
    selector.select(config(), "fast")
    probes = len(engine.calls)
    with offpath.only(offpath.MEMORY), pytest.raises(offpath.NotReady):
        selector.select(config(), "full")
    assert len(engine.calls) == probes


# ----- Selector under STORED ------------------------------------------------------------------------
def test_stored_reads_the_store_but_never_probes():
    engine, store = ScriptedTestEngine(), CountingStore()
    Selector(ScriptedTestEngine(), store=store.inner).select(config())  # another process warmed it
    selector = Selector(engine, store=store)
    with offpath.only(offpath.STORED):
        found = selector.select(config())
        with pytest.raises(offpath.NotReady, match="a probe of"):
            selector.select(config(head_dim_qk=64))  # stored nowhere
    assert found.selected and found.plan_form.startswith("bucket B=4 S_q=1024")
    assert engine.calls == [] and store.gets > 0 and selector.cache_info()["persistent_hits"] == 1
    assert selector._in_flight == {}
    with offpath.only(offpath.MEMORY):
        assert selector.select(config()).from_cache  # promoted into memory
    assert selector.select(config(head_dim_qk=64)).selected and len(engine.calls) == 2


def test_stored_finds_a_larger_stored_bucket_that_memory_does_not_scan_for():
    engine, store = ScriptedTestEngine(), CountingStore()
    Selector(ScriptedTestEngine(), store=store.inner).select(config(batch_size=8, seqlen_q=4096, seqlen_kv=4096))
    selector = Selector(engine, store=store)
    small = config(seqlen_q=700, seqlen_kv=700)
    with offpath.only(offpath.MEMORY), pytest.raises(offpath.NotReady):
        selector.select(small)
    assert store.gets == 0
    with offpath.only(offpath.STORED):
        found = selector.select(small)
    assert found.selected and found.plan_form.startswith("bucket B=8 S_q=4096 S_kv=4096") and engine.calls == []


def test_a_learned_bucket_is_answered_from_the_store_then_from_memory():
    engine, store = ScriptedTestEngine(), CountingStore()
    learned = bucket_form(config(), Bucket(8, 2048, 2048))
    store_yes(store.inner, learned)  # what the worker process selected and stored
    selector = Selector(engine, store=store)
    selector.learn_bucket(learned)
    with offpath.only(offpath.MEMORY), pytest.raises(offpath.NotReady):
        selector.select(config())  # the bucket is known, its answer is not in memory yet
    with offpath.only(offpath.STORED):
        found = selector.select(config())
    assert found.selected and found.plan_form.startswith("bucket B=8 S_q=2048") and store.gets == 1  # no scan
    with offpath.only(offpath.MEMORY):
        assert selector.select(config(batch_size=7, seqlen_q=1500, seqlen_kv=1500)).selected
    assert engine.calls == []


class SpyFlights(dict):
    """The selector's in-flight table; `joined` is set once a thread finds another's flight."""

    def __init__(self) -> None:
        super().__init__()
        self.joined = threading.Event()

    def get(self, key, default=None):
        found = super().get(key, default)
        if found is not None:
            self.joined.set()
        return found


def test_a_waiter_is_not_poisoned_by_a_limited_leader():
    engine, store = ScriptedTestEngine(), CountingStore()
    store.gate = threading.Event()
    selector = Selector(engine, store=store, bucket_forms=False)
    selector._in_flight = flights = SpyFlights()
    results: dict[str, object] = {}

    def ask(name: str, limited: bool) -> None:
        try:
            if limited:
                with offpath.only(offpath.STORED):
                    results[name] = selector.select(config())
            else:
                results[name] = selector.select(config())
        except Exception as err:  # noqa: BLE001 - checked below
            results[name] = err

    leader = threading.Thread(target=ask, args=("leader", True))
    leader.start()
    assert store.reading.wait(5)  # the limited leader is reading the store, its flight open
    waiter = threading.Thread(target=ask, args=("waiter", False))
    waiter.start()
    assert flights.joined.wait(5)  # the waiter found the leader's flight
    store.gate.set()
    leader.join(5), waiter.join(5)
    assert isinstance(results["leader"], offpath.NotReady)
    assert getattr(results["waiter"], "backend", None) is Backend.F16
    assert len(engine.calls) == 2 and dict(flights) == {}  # the waiter probed, once per phase


def test_made_default_selector_never_makes_one():
    set_default_selector(None)
    assert made_default_selector() is None and made_default_selector() is None
    mine = Selector(ScriptedTestEngine())
    set_default_selector(mine)
    assert made_default_selector() is mine


# ----- BucketIndex ----------------------------------------------------------------------------------
def test_bucket_index_under_memory_reads_no_store_and_remembers_no_answer():
    store = CountingStore()
    larger = bucket_form(config(), Bucket(8, 4096, 4096))
    store_yes(store.inner, larger)
    index = BucketIndex(store, FINGERPRINT)
    own = bucket_form(config())
    for _ in range(2):
        with offpath.only(offpath.MEMORY):
            assert index.find(config()) == own
    assert store.gets == 0
    assert index.find(config()) == larger and store.gets > 0  # unlimited: scans, finds the larger one
    reads = store.gets
    with offpath.only(offpath.MEMORY):
        assert index.find(config()) == larger  # learned in memory now
    assert store.gets == reads


def test_bucket_index_under_memory_answers_learned_buckets():
    store = CountingStore()
    larger = bucket_form(config(), Bucket(4, 2048, 2048))
    index = BucketIndex(store, FINGERPRINT)
    index.remember(larger)
    with offpath.only(offpath.MEMORY):
        assert index.find(config()) == larger
    assert store.gets == 0


def test_the_own_bucket_is_preferred_when_it_and_a_larger_one_are_stored_yes():
    store = CountingStore()
    own, larger = bucket_form(config()), bucket_form(config(), Bucket(4, 2048, 2048))
    store_yes(store.inner, larger)
    store_yes(store.inner, own)
    index = BucketIndex(store, FINGERPRINT)
    assert index.find(config()) == own and store.gets == 1  # stopped at its own bucket
    assert index.find(config(seqlen_q=1024, seqlen_kv=1024)) == own


def test_a_larger_bucket_answers_where_the_own_one_is_stored_no():
    store = CountingStore()
    own, larger = bucket_form(config()), bucket_form(config(), Bucket(4, 2048, 2048))
    store_yes(store.inner, own, Outcome.UNSUPPORTED)
    store_yes(store.inner, larger)
    assert BucketIndex(store, FINGERPRINT).find(config()) == larger


# ----- stored runner choices -----------------------------------------------------------------------------
@pytest.fixture
def persistent(tmp_path):
    directory = tmp_path / "store"
    directory.mkdir()
    os.chmod(directory, 0o700)
    return directory


def test_a_runner_choice_round_trips_through_the_persistent_store(persistent):
    selector = Selector(ScriptedTestEngine(), store=PersistentStore(persistent))
    key = runners.runner_key("graphs-key")
    choice = runners.Choice(runners.TORCH, 12.5, 20.25)
    runners.store(selector, "graphs-key", runners.Choice(runners.CUDNN, 1.0, 0.5))  # keyed as an older version timed
    assert runners.stored(selector, key) is None, "a choice timed another way was taken"
    assert runners.store(selector, key, choice) is True
    assert runners.stored(selector, key) == choice
    again = Selector(ScriptedTestEngine(), store=PersistentStore(persistent))  # the next process
    assert runners.stored(again, key) == choice
    assert runners.stored(again, runners.runner_key("graphs-key", True)) is None  # heads as batch: its own key
    other = Fingerprint("test-double", "Another GPU", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")
    assert runners.stored(Selector(ScriptedTestEngine(fingerprint=other), store=again.store), key) is None
    faster = runners.Choice(runners.CUDNN, 30.0, 10.0)
    assert runners.store(again, key, faster) and runners.stored(selector, key) == faster
    info = selector.store.info()
    assert (info["runner_choices"], info["plans"]) == (2, 0)  # rows of their own kind, not plans


@pytest.mark.parametrize("text", ["not json", "[]", "null", "3", '{"runner": "torch"}',
                                  '{"runner": "torch", "torch_us": "fast", "cudnn_us": 1}',
                                  '{"runner": "torch", "torch_us": [1], "cudnn_us": 1}',
                                  '{"runner": "triton", "torch_us": 1, "cudnn_us": 1}'])
def test_a_bad_stored_choice_reads_as_none(persistent, text):
    selector = Selector(ScriptedTestEngine(), store=PersistentStore(persistent))
    conn = sqlite3.connect(selector.store.path, isolation_level=None)  # a row no put_runner_choice writes
    conn.execute("INSERT INTO runner_choices VALUES (?, 'k', ?, 10, 0, 0)", (FINGERPRINT.key(), text))
    conn.close()
    assert runners.stored(selector, "k") is None


def test_without_a_store_nothing_is_stored_or_read():
    for selector in (Selector(ScriptedTestEngine()), Selector(None)):
        assert selector.store is None
        assert runners.store(selector, "k", runners.Choice(runners.CUDNN, 2.0, 1.0)) is False
        assert runners.stored(selector, "k") is None


def test_runner_keys_and_descriptions():
    assert runners.runner_key("g") == "cost g" and runners.runner_key("g", True) == "cost heads g"
    torch_kept, cudnn_kept = runners.Choice(runners.TORCH, 1.0, 2.0), runners.Choice(runners.CUDNN, 2.0, 1.0)
    assert torch_kept.describe().startswith("torch SDPA (") and cudnn_kept.describe().startswith("cuDNN (")
    assert "torch 1.0 us vs cuDNN 2.0 us" in torch_kept.why()

