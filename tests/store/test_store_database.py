"""The SQLite file under a persistent store: damage is set aside, a busy database is waited for, many writers lose nothing."""

import logging
import multiprocessing
import sqlite3
import threading
import time

from store_samples import H100, KEY, SUPPORTED_FULL, warnings_of

from fusedattn_select.store import DATABASE_NAME, PersistentStore, database
from fusedattn_select.types import ProbeDepth


# ----- damaged database -------------------------------------------------------------------------
def test_file_that_is_not_a_database_is_set_aside_and_rebuilt(cache_dir, caplog):
    garbage = b"this is not a SQLite database\n" * 200
    (cache_dir / DATABASE_NAME).write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        store = PersistentStore(cache_dir)
    aside = list(cache_dir.glob(DATABASE_NAME + ".corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == garbage
    assert any("damaged" in r.getMessage() for r in warnings_of(caplog))
    assert store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.integrity_check() == ["ok"]


def test_database_that_fails_integrity_check_is_salvaged_by_a_write_not_by_a_read(cache_dir, caplog):
    store = PersistentStore(cache_dir)
    for index in range(400):
        store.put(H100, f"key-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
    store.close()  # checkpoints the write-ahead log into the file
    path = cache_dir / DATABASE_NAME
    data = bytearray(path.read_bytes())
    page = 4096
    data[8 * page:] = b"\x55" * (len(data) - 8 * page)  # schema pages intact, table pages garbage
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        reopened = PersistentStore(cache_dir)
        info = reopened.info()
        assert info["damage"] and not list(cache_dir.glob(DATABASE_NAME + ".corrupt-*"))  # a read moves nothing
        assert reopened.put(H100, "key-new", SUPPORTED_FULL, ProbeDepth.FULL)
    assert len(list(cache_dir.glob(DATABASE_NAME + ".corrupt-[0-9]*[0-9]"))) == 1
    assert any("salvaged" in r.getMessage() for r in warnings_of(caplog))
    assert reopened.integrity_check() == ["ok"]
    assert reopened.get(H100, "key-new") == (SUPPORTED_FULL, ProbeDepth.FULL)


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
    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.05)
    monkeypatch.setattr(database, "LOCKED_RETRY_S", 0.3)
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
