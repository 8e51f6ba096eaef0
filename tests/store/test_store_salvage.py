"""A damaged database keeps every row SQLite can still read: a write salvages them into a fresh
file and sets the damaged one aside; a read-only store only reports the damage."""

import logging
import sqlite3

import pytest
from store_samples import H100, SUPPORTED_FULL, warnings_of

from fusedattn_select.store import DATABASE_NAME, PersistentStore
from fusedattn_select.types import ProbeDepth

ROWS = 300
PLAN = b"serialized plan bytes " * 40


def _written_store(cache_dir) -> PersistentStore:
    store = PersistentStore(cache_dir)
    for index in range(ROWS):
        assert store.put(H100, f"key-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.put_plan(H100, "plan-0", PLAN)
    store.close()  # checkpoints the write-ahead log into the file
    return store


def _pages(path, query: str) -> tuple[int, list[int]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA page_size").fetchone()[0], [row[0] for row in conn.execute(query)]
    finally:
        conn.close()


def _overwrite_page(path, page_size: int, page: int) -> None:
    data = bytearray(path.read_bytes())
    data[(page - 1) * page_size:page * page_size] = b"\x55" * page_size
    path.write_bytes(bytes(data))


def _damage_index_page(cache_dir):
    path = cache_dir / DATABASE_NAME
    page_size, roots = _pages(path, "SELECT rootpage FROM sqlite_master WHERE name = 'verdicts_by_last_use'")
    _overwrite_page(path, page_size, roots[0])
    return path


def _files(directory):
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(("-wal", "-shm")))


def test_read_only_store_reports_a_damaged_index_page_and_moves_nothing(cache_dir, caplog):
    _written_store(cache_dir)
    path = _damage_index_page(cache_dir)
    damaged_bytes = path.read_bytes()
    before = _files(cache_dir)
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        store = PersistentStore(cache_dir, read_only=True)
        info = store.info()
        damage = store.check_damage()
    assert (info["entries"], info["plans"]) == (ROWS, 1)  # counted from the table, not the index
    assert info["damage"] and damage
    assert store.get(H100, "key-7") == (SUPPORTED_FULL, ProbeDepth.FULL)
    assert not store.put(H100, "key-new", SUPPORTED_FULL, ProbeDepth.FULL)
    assert _files(cache_dir) == before and path.read_bytes() == damaged_bytes
    assert len([r for r in warnings_of(caplog) if "damaged" in r.getMessage()]) == 1


def test_write_salvages_every_row_of_a_database_with_a_damaged_index_page(cache_dir, caplog):
    _written_store(cache_dir)
    path = _damage_index_page(cache_dir)
    damaged_bytes = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        store = PersistentStore(cache_dir)
        assert store.put(H100, "key-new", SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.integrity_check() == ["ok"]
    assert all(store.get(H100, f"key-{index}") == (SUPPORTED_FULL, ProbeDepth.FULL) for index in range(ROWS))
    assert store.get_plan(H100, "plan-0") == PLAN
    assert store.info()["entries"] == ROWS + 1
    aside = [p for p in cache_dir.glob(DATABASE_NAME + ".corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and aside[0].read_bytes() == damaged_bytes
    messages = [r.getMessage() for r in warnings_of(caplog) if "salvaged" in r.getMessage()]
    assert len(messages) == 1
    assert f"salvaged 1 fingerprints, {ROWS} decisions, 1 plans, 0 runner choices; lost 0 rows" in messages[0]
    assert not [p for p in cache_dir.iterdir() if p.name.endswith((".lock", ".recover.lock"))
                or ".salvage-" in p.name]


def test_write_salvages_the_rows_of_intact_pages_when_a_table_page_is_damaged(cache_dir, caplog):
    _written_store(cache_dir)
    path = cache_dir / DATABASE_NAME
    try:
        page_size, leaves = _pages(path, "SELECT pageno FROM dbstat WHERE name = 'verdicts' AND pagetype = 'leaf' "
                                         "ORDER BY pageno")
    except sqlite3.OperationalError:
        pytest.skip("this SQLite has no dbstat table to find a table page with")
    assert len(leaves) > 3
    _overwrite_page(path, page_size, leaves[len(leaves) // 2])
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        store = PersistentStore(cache_dir)
        readable = sum(store.get(H100, f"key-{index}") is not None for index in range(ROWS))
        assert not list(cache_dir.glob(DATABASE_NAME + ".corrupt-*"))  # reads (and their bookkeeping) move nothing
        assert store.put_plan(H100, "plan-1", PLAN)  # the first write after the damage was seen salvages
    kept = sum(store.get(H100, f"key-{index}") is not None for index in range(ROWS))
    assert ROWS // 2 < kept == readable < ROWS  # one leaf page of rows lost, every other page kept
    message = next(r.getMessage() for r in warnings_of(caplog) if "salvaged" in r.getMessage())
    assert f"{kept} decisions" in message and f"lost {ROWS - kept} rows" in message
    assert store.get_plan(H100, "plan-0") == PLAN
    assert store.integrity_check() == ["ok"]


def test_write_salvages_every_row_under_a_damaged_root_page_of_the_decisions_table(cache_dir, caplog):
    _written_store(cache_dir)
    path = cache_dir / DATABASE_NAME
    page_size, roots = _pages(path, "SELECT rootpage FROM sqlite_master WHERE name = 'verdicts'")
    _overwrite_page(path, page_size, roots[0])  # SQLite reaches no decision: their leaf pages are intact
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        store = PersistentStore(cache_dir)
        assert store.put(H100, "key-new", SUPPORTED_FULL, ProbeDepth.FULL)
    assert all(store.get(H100, f"key-{index}") == (SUPPORTED_FULL, ProbeDepth.FULL) for index in range(ROWS))
    assert store.get_plan(H100, "plan-0") == PLAN
    assert store.integrity_check() == ["ok"]
    messages = [r.getMessage() for r in warnings_of(caplog) if "salvaged" in r.getMessage()]
    assert len(messages) == 1 and f"salvaged 1 fingerprints, {ROWS} decisions, 1 plans, 0 runner choices; lost 0 rows" in messages[0]


def test_read_only_store_exports_every_row_of_a_database_with_a_damaged_primary_key_index(cache_dir, tmp_path):
    _written_store(cache_dir)
    path = cache_dir / DATABASE_NAME
    page_size, roots = _pages(path, "SELECT rootpage FROM sqlite_master WHERE name = 'sqlite_autoindex_verdicts_1'")
    _overwrite_page(path, page_size, roots[0])
    store = PersistentStore(cache_dir, read_only=True)
    assert store.check_damage()
    counts = store.export(tmp_path / "export.json")
    assert (counts["verdicts"], counts["plans"]) == (ROWS, 1)
    assert not list(cache_dir.glob(DATABASE_NAME + ".corrupt-*"))


def test_a_file_cut_to_nothing_keeps_the_rows_of_its_write_ahead_log(cache_dir, tmp_path):
    """SQLite deletes the log of an empty database file it opens, even read-only: the store never
    lets it, and salvages the log's rows instead."""
    import shutil

    live = PersistentStore(cache_dir)
    for index in range(50):
        assert live.put(H100, f"key-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
    copy = tmp_path / "copy"
    copy.mkdir(mode=0o700)
    shutil.copy(cache_dir / f"{DATABASE_NAME}-wal", copy / f"{DATABASE_NAME}-wal")  # the rows, still in the log
    (copy / DATABASE_NAME).write_bytes(b"")
    looking = PersistentStore(copy, read_only=True)
    assert looking.info()["entries"] == 50 and "is cut to 0 bytes" in looking.info()["damage"]
    assert (copy / f"{DATABASE_NAME}-wal").stat().st_size > 0
    store = PersistentStore(copy)
    assert store.put(H100, "new", SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.info()["entries"] == 51 and store.get(H100, "key-49") == (SUPPORTED_FULL, ProbeDepth.FULL)
