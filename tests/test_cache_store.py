"""The decision and plan stores (fusedattn_select.store.sqlite): persistence, integrity, sharing, eviction."""

import base64
import dataclasses
import json
import logging
import multiprocessing
import os
import sqlite3
import threading
import time

import pytest

from fusedattn_select.store import sqlite as cache
from fusedattn_select.store.sqlite import (
    CacheError,
    ImportReport,
    MemoryStore,
    PersistentStore,
    default_cache_dir,
    open_default_store,
)
from fusedattn_select.types import (
    Backend,
    Fingerprint,
    Outcome,
    Phase,
    ProbeDepth,
    Verdict,
)

H100 = Fingerprint(
    platform="cuda", device_name="NVIDIA H100 80GB HBM3", compute_capability="9.0", sm_count=132,
    cudnn_backend_version=91900, cudnn_frontend_version="1.32.0", driver_version="580.95.05",
    library_version="0.1.0",
)
H200 = dataclasses.replace(H100, device_name="NVIDIA H200", sm_count=132)
KEY = "0123456789abcdef0123456789abcdef"
RUNNING_AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def verdicts(outcome=Outcome.SUPPORTED, depth=ProbeDepth.FULL, message=""):
    stage = "build_plans" if outcome is Outcome.SUPPORTED else "check_support"
    return tuple(
        Verdict(Backend.F16, phase, outcome, stage, message, detail=message, depth=depth,
                timings_ms=(("check_support", 3.5), ("build_plans", 250.25)))
        for phase in (Phase.FORWARD, Phase.BACKWARD)
    )


SUPPORTED_FULL = verdicts()
REJECTED_FAST = verdicts(Outcome.UNSUPPORTED, ProbeDepth.FAST, "hidden_dim should be multiple of 8")


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == "fusedattn_select" and r.levelno == logging.WARNING]


def raw(store):
    """A second, plain SQLite connection to a persistent store's file (to damage rows)."""
    store.close()
    return sqlite3.connect(store.path, isolation_level=None)


@pytest.fixture
def cache_dir(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    os.chmod(directory, 0o700)
    return directory


@pytest.fixture(params=["sqlite", "memory"])
def store(request, cache_dir):
    if request.param == "sqlite":
        return PersistentStore(cache_dir)
    return MemoryStore()


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


def test_full_decision_is_not_replaced_by_a_fast_one(store):
    store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.put(H100, KEY, REJECTED_FAST, ProbeDepth.FAST) is False
    assert store.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)


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
    monkeypatch.setenv(cache.MAX_BYTES_ENV, "64M")
    assert MemoryStore().max_bytes == 64 * 1024**2
    monkeypatch.setenv(cache.MAX_BYTES_ENV, "lots")
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        assert MemoryStore().max_bytes == cache.DEFAULT_MAX_BYTES
    assert any(cache.MAX_BYTES_ENV in r.getMessage() for r in warnings_of(caplog))


# ----- damaged database -------------------------------------------------------------------------
def test_file_that_is_not_a_database_is_set_aside_and_rebuilt(cache_dir, caplog):
    garbage = b"this is not a SQLite database\n" * 200
    (cache_dir / cache.DATABASE_NAME).write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        store = PersistentStore(cache_dir)
    aside = list(cache_dir.glob(cache.DATABASE_NAME + ".corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == garbage
    assert any("damaged" in r.getMessage() for r in warnings_of(caplog))
    assert store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.integrity_check() == ["ok"]


def test_database_that_fails_integrity_check_is_set_aside_and_rebuilt(cache_dir, caplog):
    store = PersistentStore(cache_dir)
    for index in range(400):
        store.put(H100, f"key-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
    store.close()  # checkpoints the write-ahead log into the file
    path = cache_dir / cache.DATABASE_NAME
    data = bytearray(path.read_bytes())
    page = 4096
    data[8 * page:] = b"\x55" * (len(data) - 8 * page)  # schema pages intact, table pages garbage
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        reopened = PersistentStore(cache_dir)
        info = reopened.info()
    assert info["entries"] == 0
    assert len(list(cache_dir.glob(cache.DATABASE_NAME + ".corrupt-*"))) == 1
    assert any("damaged" in r.getMessage() for r in warnings_of(caplog))
    assert reopened.integrity_check() == ["ok"]


# ----- default store ----------------------------------------------------------------------------
def test_unwritable_directory_degrades_to_memory_with_one_warning(tmp_path, monkeypatch, caplog):
    if RUNNING_AS_ROOT:
        # root ignores permission bits: a directory under a regular file can never be created.
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        target = blocker / "cache"
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        os.chmod(locked, 0o500)
        target = locked / "cache"
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(target))
    monkeypatch.delenv(cache.CACHE_SWITCH_ENV, raising=False)
    monkeypatch.setattr(cache, "_fallback_warned", False)
    try:
        with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
            first, second = open_default_store(), open_default_store()
    finally:
        if not RUNNING_AS_ROOT:
            os.chmod(tmp_path / "locked", 0o700)
    assert isinstance(first, MemoryStore) and isinstance(second, MemoryStore)
    assert len(warnings_of(caplog)) == 1
    assert str(target) in warnings_of(caplog)[0].getMessage()
    first.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    assert first.info()["kind"] == "memory" and first.info()["entries"] == 1


def test_cache_off_keeps_decisions_in_memory(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path / "never-created"))
    monkeypatch.setenv(cache.CACHE_SWITCH_ENV, "off")
    assert isinstance(open_default_store(), MemoryStore)
    assert not (tmp_path / "never-created").exists()


def test_default_store_is_sqlite_in_the_configured_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path / "configured"))
    monkeypatch.delenv(cache.CACHE_SWITCH_ENV, raising=False)
    store = open_default_store()
    assert isinstance(store, PersistentStore)
    assert store.info()["path"] == str(tmp_path / "configured" / cache.DATABASE_NAME)
    assert store.info()["kind"] == "sqlite"


def test_default_directory_is_under_the_user_cache_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "fusedattn-select"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == cache.Path.home() / ".cache" / "fusedattn-select"


def test_info_and_clear(store):
    store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    store.put_plan(H100, "plan-fwd", bytes(1000))
    info = store.info()
    assert (info["entries"], info["plans"]) == (1, 1)
    assert info["bytes"] > 1000 and info["max_bytes"] == cache.DEFAULT_MAX_BYTES
    assert info["kind"] == store.kind
    store.clear()
    assert (store.info()["entries"], store.info()["plans"], store.info()["bytes"]) == (0, 0, 0)
    assert store.get(H100, KEY) is None


# ----- export and import ------------------------------------------------------------------------
def _filled(store):
    store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    store.put(H100, "rejected", REJECTED_FAST, ProbeDepth.FAST)
    store.put(H200, KEY, REJECTED_FAST, ProbeDepth.FAST)
    store.put_plan(H100, "plan-fwd", b"\x00\x01plan bytes" * 50)
    return store


def test_export_import_round_trip(store, tmp_path):
    exported = _filled(store).export(tmp_path / "decisions.json")
    assert (exported["verdicts"], exported["plans"]) == (3, 1)
    target = MemoryStore() if isinstance(store, PersistentStore) else PersistentStore(tmp_path / "other")
    report = target.import_(tmp_path / "decisions.json")
    assert report == ImportReport(verdicts=3, plans=1)
    assert target.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)
    assert target.get(H100, "rejected") == (REJECTED_FAST, ProbeDepth.FAST)
    assert target.get(H200, KEY) == (REJECTED_FAST, ProbeDepth.FAST)
    assert target.get_plan(H100, "plan-fwd") == b"\x00\x01plan bytes" * 50


def test_import_for_one_fingerprint_skips_foreign_rows(cache_dir, tmp_path):
    _filled(PersistentStore(cache_dir)).export(tmp_path / "decisions.json")
    target = MemoryStore()
    report = target.import_(tmp_path / "decisions.json", fingerprint=H200)
    assert (report.verdicts, report.plans) == (1, 0)
    assert len(report.skipped) == 3
    assert all("foreign fingerprint" in reason for _, reason in report.skipped)
    assert target.get(H200, KEY) == (REJECTED_FAST, ProbeDepth.FAST)
    assert target.get(H100, KEY) is None


def test_import_verifies_rows(cache_dir, tmp_path):
    path = tmp_path / "decisions.json"
    _filled(PersistentStore(cache_dir)).export(path)
    document = json.loads(path.read_text())
    plan = document["plans"][0]
    plan["blob"] = base64.b64encode(base64.b64decode(plan["blob"])[:-1] + b"X").decode()
    rows = {(row["fingerprint"], row["key"]): row for row in document["verdicts"]}
    rows[H100.key(), KEY]["verdicts"][0]["outcome"] = "failed"
    rows[H100.key(), "rejected"]["verdicts"] = "garbage"
    forged = dict(document["fingerprints"][H200.key()], device_name="NVIDIA B200")
    document["fingerprints"][H200.key()] = forged
    path.write_text(json.dumps(document))
    report = MemoryStore().import_(path)
    assert (report.verdicts, report.plans) == (0, 0)
    reasons = " | ".join(reason for _, reason in report.skipped)
    assert "sha256" in reasons
    assert "FAILED" in reasons
    assert "not a non-empty list" in reasons
    assert "hashes to" in reasons


def test_import_of_a_file_that_is_not_an_export_raises(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"hello": "world"}))
    with pytest.raises(CacheError, match="format"):
        MemoryStore().import_(path)


def test_import_keeps_a_stored_full_decision(cache_dir, tmp_path):
    source = MemoryStore()
    source.put(H100, KEY, REJECTED_FAST, ProbeDepth.FAST)
    source.export(tmp_path / "fast.json")
    target = PersistentStore(cache_dir)
    target.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    report = target.import_(tmp_path / "fast.json")
    assert report.verdicts == 0 and "full-depth decision is already stored" in report.skipped[0][1]
    assert target.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)


# ----- many processes ---------------------------------------------------------------------------
WRITERS = 8
ENTRIES_PER_WRITER = 200


def _write_entries(directory, writer, barrier):
    store = PersistentStore(directory)
    barrier.wait()
    for index in range(ENTRIES_PER_WRITER):
        if not store.put(H100, f"writer{writer}-key{index}", SUPPORTED_FULL, ProbeDepth.FULL):
            raise SystemExit(1)


def test_eight_processes_writing_at_once_lose_nothing(cache_dir):
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(WRITERS)
    writers = [context.Process(target=_write_entries, args=(str(cache_dir), w, barrier)) for w in range(WRITERS)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(60)
    assert [p.exitcode for p in writers] == [0] * WRITERS
    store = PersistentStore(cache_dir)
    assert store.info()["entries"] == WRITERS * ENTRIES_PER_WRITER
    missing = [
        (w, i) for w in range(WRITERS) for i in range(ENTRIES_PER_WRITER)
        if store.get(H100, f"writer{w}-key{i}") != (SUPPORTED_FULL, ProbeDepth.FULL)
    ]
    assert missing == []
    assert store.integrity_check() == ["ok"]


def _hold_key_lock(directory, holder_locked, waiter_trying, times):
    store = PersistentStore(directory)
    with store.key_lock(H100, KEY) as exclusive:
        holder_locked.set()
        waiter_trying.wait(60)
        time.sleep(0.3)  # the waiter is blocked on the lock now
        times["holder_released"] = time.time()
    times["holder_exclusive"] = exclusive


def _wait_for_key_lock(directory, holder_locked, waiter_trying, times):
    store = PersistentStore(directory)
    holder_locked.wait(60)
    waiter_trying.set()
    times["waiter_tried"] = time.time()
    with store.key_lock(H100, KEY) as exclusive:
        times["waiter_acquired"] = time.time()
    times["waiter_exclusive"] = exclusive


def test_key_lock_excludes_a_second_process(cache_dir):
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        times = manager.dict()
        holder_locked, waiter_trying = context.Event(), context.Event()
        args = (str(cache_dir), holder_locked, waiter_trying, times)
        processes = [context.Process(target=_hold_key_lock, args=args),
                     context.Process(target=_wait_for_key_lock, args=args)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
        times = dict(times)
    assert [p.exitcode for p in processes] == [0, 0]
    assert times["holder_exclusive"] and times["waiter_exclusive"]
    assert times["waiter_acquired"] >= times["holder_released"]
    assert times["waiter_acquired"] - times["waiter_tried"] >= 0.25


def test_key_lock_is_reentrant_in_one_thread(store):
    with store.key_lock(H100, KEY, timeout=2) as outer:
        with store.key_lock(H100, KEY, timeout=2) as inner:
            assert outer and inner


def test_key_lock_of_another_key_does_not_wait(store):
    with store.key_lock(H100, KEY, timeout=2):
        started = time.monotonic()
        with store.key_lock(H100, "another-key", timeout=2) as exclusive:
            assert exclusive
        assert time.monotonic() - started < 1


# ----- a busy database --------------------------------------------------------------------------
def test_write_waits_while_another_process_holds_the_write_lock(cache_dir):
    store = PersistentStore(cache_dir)
    other = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, other.execute, args=("COMMIT",)).start()
    started = time.monotonic()
    assert store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    assert time.monotonic() - started >= 0.25
    assert store.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)


def test_write_gives_up_with_a_warning_when_the_lock_is_never_released(cache_dir, caplog, monkeypatch):
    monkeypatch.setattr(cache, "BUSY_TIMEOUT_S", 0.05)
    monkeypatch.setattr(cache, "LOCKED_RETRY_S", 0.3)
    store = PersistentStore(cache_dir)
    store.put(H100, "stored-before", SUPPORTED_FULL, ProbeDepth.FULL)
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
            assert store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL) is False
            assert store.get(H100, "stored-before") == (SUPPORTED_FULL, ProbeDepth.FULL)  # WAL: reads go on
    finally:
        other.execute("ROLLBACK")
    assert any("stayed locked" in r.getMessage() for r in warnings_of(caplog))
