"""A cache hit never waits for the write lock, and a write never sums a whole table."""

import sqlite3
import threading
import time

from store_samples import H100, KEY, SUPPORTED_FULL

from fusedattn_select.store import PersistentStore, database
from fusedattn_select.types import ProbeDepth


def _last_used(store, key):
    conn = sqlite3.connect(store.path)
    try:
        return conn.execute("SELECT last_used FROM verdicts WHERE config_key = ?", (key,)).fetchone()[0]
    finally:
        conn.close()


def test_a_hit_answers_at_once_while_another_connection_holds_the_write_lock(cache_dir):
    store = PersistentStore(cache_dir)
    assert store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    written = _last_used(store, KEY)
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        for _ in range(3):
            assert store.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)
        assert time.monotonic() - started < 0.5
    finally:
        other.execute("ROLLBACK")
        other.close()
    # The use is not lost: the next write carries it.
    assert store.put(H100, "other", SUPPORTED_FULL, ProbeDepth.FULL)
    assert _last_used(store, KEY) > written


def test_hits_on_many_threads_do_not_queue_behind_a_write_that_waits(cache_dir, monkeypatch):
    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.2)
    store = PersistentStore(cache_dir)
    for index in range(6):
        assert store.put(H100, f"key-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
    other = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    writer = threading.Thread(target=store.put, args=(H100, "waiting", SUPPORTED_FULL, ProbeDepth.FULL))
    writer.start()
    time.sleep(0.1)  # the writer now waits for the lock, holding this process's writing connection
    finished = {}
    started = time.monotonic()

    def hit(index):
        assert store.get(H100, f"key-{index}") == (SUPPORTED_FULL, ProbeDepth.FULL)
        finished[index] = time.monotonic() - started

    readers = [threading.Thread(target=hit, args=(index,)) for index in range(6)]
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join(10)
    other.execute("COMMIT")
    writer.join(40)
    assert sorted(finished) == list(range(6)) and max(finished.values()) < 0.5
    assert store.get(H100, "waiting") == (SUPPORTED_FULL, ProbeDepth.FULL)


def _payload_sum(store):
    conn = sqlite3.connect(store.path)
    try:
        return conn.execute("SELECT (SELECT COALESCE(SUM(size), 0) FROM verdicts) + "
                            "(SELECT COALESCE(SUM(size), 0) FROM plans)").fetchone()[0]
    finally:
        conn.close()


def test_the_payload_total_follows_every_write_eviction_and_clear(cache_dir):
    store = PersistentStore(cache_dir, max_bytes=60_000)
    for index in range(200):  # past max_bytes: evictions happen
        store.put(H100, f"key-{index % 150}", SUPPORTED_FULL, ProbeDepth.FULL)
        if index % 40 == 0:
            store.put_plan(H100, f"plan-{index}", bytes(range(256)) * (10 + index // 10))
    info = store.info()
    assert info["bytes"] == _payload_sum(store) and info["bytes"] <= 60_000
    store.clear()
    assert store.info()["bytes"] == _payload_sum(store) == 0


def test_a_write_under_the_bound_reads_no_whole_table(cache_dir):
    store = PersistentStore(cache_dir)
    for index in range(100):
        store.put(H100, f"key-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
    statements = []
    store._db._writer.conn.set_trace_callback(statements.append)
    assert store.put(H100, "one-more", SUPPORTED_FULL, ProbeDepth.FULL)
    assert statements and not [s for s in statements if "SUM(" in s.upper() or "COUNT(" in s.upper()]


def test_a_store_written_before_totals_existed_gets_its_total_counted_once(cache_dir):
    store = PersistentStore(cache_dir)
    for index in range(20):
        store.put(H100, f"key-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
    store.close()
    conn = sqlite3.connect(store.path, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("DROP TABLE totals")
    conn.close()
    reopened = PersistentStore(cache_dir)
    assert reopened.put(H100, "new", SUPPORTED_FULL, ProbeDepth.FULL)
    assert reopened.info()["bytes"] == _payload_sum(reopened)
