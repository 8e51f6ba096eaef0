"""A store's rows: decisions and plans round-trip per fingerprint, damaged rows are dropped, the size bound holds."""

import json
import logging
import os
import time

import pytest
from store_samples import H100, H200, KEY, REJECTED_FAST, SUPPORTED_FAST, SUPPORTED_FULL, raw, verdicts, warnings_of

from fusedattn_select.store import DEFAULT_MAX_BYTES, MAX_BYTES_ENV, MemoryStore, PersistentStore
from fusedattn_select.types import Outcome, ProbeDepth


# ----- decisions --------------------------------------------------------------------------------
def test_decision_round_trips_with_its_depth(store):
    assert store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.get(H100, "another-key") is None


def test_decision_survives_reopening_the_directory(cache_dir):
    PersistentStore(cache_dir).put(H100, KEY, REJECTED_FAST, "fast")
    assert PersistentStore(cache_dir).get(H100, KEY) == (REJECTED_FAST, ProbeDepth.FAST)


def test_decision_of_another_fingerprint_is_never_returned(store):
    store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.get(H200, KEY) is None
    store.put(H200, KEY, REJECTED_FAST, ProbeDepth.FAST)
    assert store.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.get(H200, KEY) == (REJECTED_FAST, ProbeDepth.FAST)


def test_full_decision_is_not_replaced_by_a_fast_yes(store):
    store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.put(H100, KEY, SUPPORTED_FAST, ProbeDepth.FAST) is False
    assert store.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)


def test_a_rejection_replaces_a_deeper_yes(store):
    # A build that fails after a verified "yes": the rejection, recorded at depth full, is the answer.
    store.put(H100, KEY, verdicts(depth=ProbeDepth.VERIFY), ProbeDepth.VERIFY)
    rejected = verdicts(Outcome.UNSUPPORTED, ProbeDepth.FULL, "no kernel for this configuration")
    assert store.put(H100, KEY, rejected, ProbeDepth.FULL)
    assert store.get(H100, KEY) == (rejected, ProbeDepth.FULL)
    assert store.put(H100, KEY, REJECTED_FAST, ProbeDepth.FAST)
    assert store.get(H100, KEY) == (REJECTED_FAST, ProbeDepth.FAST)


def test_fast_decision_is_replaced_by_a_full_one(store):
    store.put(H100, KEY, REJECTED_FAST, ProbeDepth.FAST)
    assert store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)


def test_failed_verdicts_are_never_stored(store):
    failed = verdicts(Outcome.FAILED, message="CUDA out of memory")
    with pytest.raises(ValueError, match="FAILED"):
        store.put(H100, KEY, failed, ProbeDepth.FULL)
    assert store.get(H100, KEY) is None


@pytest.mark.parametrize("damage", [
    "{not json",
    json.dumps([{"backend": "F99", "phase": "forward", "outcome": "supported", "stage": "x"}]),
    json.dumps([]),
    json.dumps([v.to_dict() for v in verdicts(Outcome.FAILED, message="oom")]),
], ids=["not-json", "unknown-backend", "empty", "failed-verdict"])
def test_decision_row_that_does_not_parse_is_dropped_with_a_warning(cache_dir, caplog, damage):
    store = PersistentStore(cache_dir)
    store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    raw(store).execute("UPDATE verdicts SET verdicts = ?", (damage,))
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        assert store.get(H100, KEY) is None
    assert any("dropped the cached decision" in r.getMessage() for r in warnings_of(caplog))
    assert store.info()["entries"] == 0


def _written_between_read_and_drop(store, monkeypatch, write):
    """Run `write` after `store` read a damaged row and before it drops it: another process's write."""
    drop = store._drop_bad_row

    def write_then_drop(*args):
        write()
        drop(*args)
    monkeypatch.setattr(store, "_drop_bad_row", write_then_drop)


def test_a_decision_another_process_wrote_after_the_damaged_one_was_read_is_kept(cache_dir, monkeypatch):
    reader, writer = PersistentStore(cache_dir), PersistentStore(cache_dir)
    reader.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    raw(reader).execute("UPDATE verdicts SET depth = 'deep'")  # the same verdicts text as the sound row
    _written_between_read_and_drop(reader, monkeypatch, lambda: writer.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL))
    assert reader.get(H100, KEY) is None
    assert PersistentStore(cache_dir).get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)


def test_get_records_the_use_of_a_decision(cache_dir):
    store = PersistentStore(cache_dir)
    store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    before = raw(store).execute("SELECT last_used FROM verdicts").fetchone()[0]
    time.sleep(0.01)
    store.get(H100, KEY)
    assert raw(store).execute("SELECT last_used FROM verdicts").fetchone()[0] > before


# ----- plans ------------------------------------------------------------------------------------
def test_plan_round_trips(store):
    blob = os.urandom(4096)
    assert store.put_plan(H100, "plan-fwd", blob)
    assert store.get_plan(H100, "plan-fwd") == blob
    assert store.get_plan(H200, "plan-fwd") is None


@pytest.mark.parametrize("damage", [
    "UPDATE plans SET blob = substr(blob, 1, 100)",
    "UPDATE plans SET blob = zeroblob(size)",
], ids=["truncated", "altered"])
def test_damaged_plan_is_dropped_with_a_warning(cache_dir, caplog, damage):
    store = PersistentStore(cache_dir)
    store.put_plan(H100, "plan-fwd", os.urandom(4096))
    raw(store).execute(damage)
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        assert store.get_plan(H100, "plan-fwd") is None
    assert any("dropped the cached plan" in r.getMessage() for r in warnings_of(caplog))
    assert store.info()["plans"] == 0


def test_a_plan_rebuilt_by_another_process_after_the_damaged_one_was_read_is_kept(cache_dir, monkeypatch):
    reader, writer = PersistentStore(cache_dir), PersistentStore(cache_dir)
    plan = os.urandom(4096)
    reader.put_plan(H100, "plan-fwd", plan)
    raw(reader).execute("UPDATE plans SET blob = zeroblob(size)")  # damaged, its sha256 the sound plan's
    _written_between_read_and_drop(reader, monkeypatch, lambda: writer.put_plan(H100, "plan-fwd", plan))
    assert reader.get_plan(H100, "plan-fwd") is None
    assert PersistentStore(cache_dir).get_plan(H100, "plan-fwd") == plan


def test_group_writable_directory_refuses_plans_but_keeps_decisions(cache_dir, caplog):
    store = PersistentStore(cache_dir)
    store.put_plan(H100, "plan-fwd", b"native code")
    os.chmod(cache_dir, 0o775)
    try:
        with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
            assert store.get_plan(H100, "plan-fwd") is None
            assert store.get_plan(H100, "plan-fwd") is None
            assert store.put_plan(H100, "plan-bwd", b"more native code") is False
            assert store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
            assert store.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)
        refusals = [r for r in warnings_of(caplog) if "serialized plans" in r.getMessage()]
        assert len(refusals) == 1
        assert "writable by group or others" in refusals[0].getMessage()
    finally:
        os.chmod(cache_dir, 0o700)
    assert store.get_plan(H100, "plan-fwd") == b"native code"


# ----- size bound -------------------------------------------------------------------------------
def test_eviction_keeps_the_most_recently_used_plans(cache_dir, request):
    store = PersistentStore(cache_dir, max_bytes=10_000)
    for name in ("p1", "p2", "p3"):
        store.put_plan(H100, name, bytes(3000))
        time.sleep(0.002)
    assert store.get_plan(H100, "p1") is not None  # p2 is now the least recently used
    time.sleep(0.002)
    store.put_plan(H100, "p4", bytes(3000))
    present = {name for name in ("p1", "p2", "p3", "p4") if store.get_plan(H100, name) is not None}
    assert present == {"p1", "p3", "p4"}
    assert store.info()["bytes"] <= 10_000


def test_memory_store_eviction_keeps_the_most_recently_used_plans():
    store = MemoryStore(max_bytes=10_000)
    for name in ("p1", "p2", "p3"):
        store.put_plan(H100, name, bytes(3000))
    store.get_plan(H100, "p1")
    store.put_plan(H100, "p4", bytes(3000))
    assert {n for n in ("p1", "p2", "p3", "p4") if store.get_plan(H100, n) is not None} == {"p1", "p3", "p4"}


def test_plans_are_evicted_before_older_decisions(store):
    small = type(store)(max_bytes=5_000) if isinstance(store, MemoryStore) else PersistentStore(store.directory, 5_000)
    small.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    time.sleep(0.002)
    small.put_plan(H100, "p1", bytes(2000))
    time.sleep(0.002)
    small.put_plan(H100, "p2", bytes(3000))
    assert small.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)
    assert small.get_plan(H100, "p1") is None
    assert small.get_plan(H100, "p2") is not None


def test_max_bytes_comes_from_the_environment(monkeypatch, caplog):
    monkeypatch.setenv(MAX_BYTES_ENV, "64M")
    assert MemoryStore().max_bytes == 64 * 1024**2
    monkeypatch.setenv(MAX_BYTES_ENV, "lots")
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        assert MemoryStore().max_bytes == DEFAULT_MAX_BYTES
    assert any(MAX_BYTES_ENV in r.getMessage() for r in warnings_of(caplog))


# ----- whole store ------------------------------------------------------------------------------
def test_info_and_clear(store):
    store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    store.put_plan(H100, "plan-fwd", bytes(1000))
    info = store.info()
    assert (info["entries"], info["plans"]) == (1, 1)
    assert info["bytes"] > 1000 and info["max_bytes"] == DEFAULT_MAX_BYTES
    assert info["kind"] == store.kind
    store.clear()
    assert (store.info()["entries"], store.info()["plans"], store.info()["bytes"]) == (0, 0, 0)
    assert store.get(H100, KEY) is None
