"""Damage in any one place of a real store loses only the rows stored there: every row whose leaf
page and overflow pages are intact is recovered with its values, and no deleted row comes back.

The store: 600 decisions, two plans of 100 KB (each with an overflow chain) and 120 runner choices
written through PersistentStore; rows deleted (whole leaf pages go onto the freelist, single cells into free blocks
of their pages); part of it checkpointed into the file, part still in the write-ahead log. Each
trial damages a fresh copy of the file: every page zeroed in turn, cuts at several lengths, a
damaged header, a damaged root and interior page.
"""

import os
import random
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest
from store_samples import H100, REJECTED_FAST, SUPPORTED_FULL

from fusedattn_select.store import DATABASE_NAME, PersistentStore
from fusedattn_select.store.schema import create_schema
from fusedattn_select.store.entry_rows import sha256
from fusedattn_select.store.pages import scan
from fusedattn_select.store.salvage import TABLE_COLUMNS, readable_rows, recover, salvage
from fusedattn_select.types import ProbeDepth

DECISIONS = 600
CHECKPOINTED = 590  # decisions written before the checkpoint; the rest are only in the log
DELETED_BEFORE_CHECKPOINT = [*range(100, 160), *range(200, 400, 7)]
DELETED_IN_LOG = [*range(300, 340), *range(CHECKPOINTED, DECISIONS, 3)]
RUNNER_CHOICES = 120
DELETED_RUNNER_CHOICES = [*range(10, 40), *range(60, 120, 5)]
KEPT_PLAN = random.Random(1).randbytes(100_000)
DELETED_PLAN = random.Random(2).randbytes(100_000)


@dataclass
class Store:
    """A store's files as written, and what a plain SELECT and the undamaged scan say of them."""

    directory: Path
    live: dict[str, dict[tuple, tuple]]  # table -> primary key -> row (TABLE_COLUMNS order)
    deleted: dict[str, set[tuple]]  # table -> primary keys deleted before the damage
    pages: dict[str, dict[tuple, frozenset[int]]]  # table -> primary key -> its leaf and overflow pages
    wal_pages: frozenset[int]  # pages whose newest version is in the log: damage to the file misses them
    page_size: int

    @property
    def file(self) -> Path:
        return self.directory / DATABASE_NAME

    def file_pages(self) -> int:
        return self.file.stat().st_size // self.page_size

    def rows(self) -> int:
        return sum(len(rows) for rows in self.live.values())


def _key(table: str, row: tuple) -> tuple:
    return tuple(row[:1] if table == "fingerprints" else row[:2])


def _decision(index: int):
    return SUPPORTED_FULL if index % 3 else REJECTED_FAST


def _runner_choice(index: int) -> dict:
    return {"runner": "torch" if index % 2 else "cudnn", "torch_us": 10.0 + index, "cudnn_us": 20.5}


def _delete(path: Path, indexes: list[int], plans: list[str], runners: list[int] = ()) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # Some builds of SQLite zero what a delete frees (Debian's does): here the deleted rows'
        # bytes must stay in the file, as they do by SQLite's default.
        conn.execute("PRAGMA secure_delete = OFF")
        conn.execute("BEGIN")
        conn.executemany("DELETE FROM verdicts WHERE config_key = ?", [(f"key-{i}",) for i in indexes])
        conn.executemany("DELETE FROM plans WHERE plan_key = ?", [(key,) for key in plans])
        conn.executemany("DELETE FROM runner_choices WHERE runner_key = ?", [(f"bucket-{i}",) for i in runners])
        conn.execute("COMMIT")
    finally:
        conn.close()


def _select(directory: Path, scratch: Path) -> dict[str, dict[tuple, tuple]]:
    """Every row by a plain SELECT, read from a copy (SQLite checkpoints the log when it closes)."""
    scratch.mkdir()
    for name in (DATABASE_NAME, DATABASE_NAME + "-wal"):
        if (directory / name).exists():
            shutil.copy(directory / name, scratch / name)
    conn = sqlite3.connect(scratch / DATABASE_NAME)
    try:
        return {table: {_key(table, row): row for row in conn.execute(f"SELECT {', '.join(columns)} FROM {table}")}
                for table, columns in TABLE_COLUMNS.items()}
    finally:
        conn.close()


def _described(directory: Path, scratch: Path, deleted_decisions: list[int], deleted_plans: list[str],
               deleted_runners: list[int] = ()) -> Store:
    live = _select(directory, scratch)
    pages = scan(directory / DATABASE_NAME)
    where = {table: {} for table in TABLE_COLUMNS}
    for row in pages.rows:
        if row.table in where:
            where[row.table][_key(row.table, row.values)] = frozenset({row.page, *row.overflow})
    deleted = {
        "fingerprints": set(),
        "verdicts": {(H100.key(), f"key-{i}") for i in deleted_decisions},
        "plans": {(H100.key(), key) for key in deleted_plans},
        "runner_choices": {(H100.key(), f"bucket-{i}") for i in deleted_runners},
    }
    return Store(directory, live, deleted, where, pages.wal_pages, pages.page_size)


@pytest.fixture(scope="module")
def with_log(tmp_path_factory) -> Store:
    """The store with its last decisions and deletions only in the write-ahead log."""
    cache = tmp_path_factory.mktemp("cache")
    os.chmod(cache, 0o700)
    store = PersistentStore(cache)
    for index in range(CHECKPOINTED):
        assert store.put(H100, f"key-{index}", _decision(index), ProbeDepth.FULL)
    assert store.put_plan(H100, "plan-kept", KEPT_PLAN)
    assert store.put_plan(H100, "plan-deleted", DELETED_PLAN)
    for index in range(RUNNER_CHOICES):
        assert store.put_runner_choice(H100, f"bucket-{index}", _runner_choice(index))
    _delete(store.path, DELETED_BEFORE_CHECKPOINT, ["plan-deleted"], DELETED_RUNNER_CHOICES)
    store.close()  # the last connection: the log is checkpointed into the file and removed
    store = PersistentStore(cache)
    for index in range(CHECKPOINTED, DECISIONS):
        assert store.put(H100, f"key-{index}", _decision(index), ProbeDepth.FULL)
    _delete(store.path, DELETED_IN_LOG, [])
    kept = tmp_path_factory.mktemp("with-log")
    for name in (DATABASE_NAME, DATABASE_NAME + "-wal"):  # copied while open: nothing checkpoints it
        shutil.copy(cache / name, kept / name)
    store.close()
    return _described(kept, tmp_path_factory.mktemp("select") / "copy", DELETED_BEFORE_CHECKPOINT + DELETED_IN_LOG,
                      ["plan-deleted"], DELETED_RUNNER_CHOICES)


@pytest.fixture(scope="module")
def checkpointed(with_log, tmp_path_factory) -> Store:
    """The same store with its log checkpointed into the file: every page is the file's."""
    directory = tmp_path_factory.mktemp("checkpointed")
    for name in (DATABASE_NAME, DATABASE_NAME + "-wal"):
        shutil.copy(with_log.directory / name, directory / name)
    conn = sqlite3.connect(directory / DATABASE_NAME)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert not (directory / (DATABASE_NAME + "-wal")).exists()
    return _described(directory, tmp_path_factory.mktemp("select") / "copy", DELETED_BEFORE_CHECKPOINT + DELETED_IN_LOG,
                      ["plan-deleted"], DELETED_RUNNER_CHOICES)


def _damaged_copy(store: Store, directory: Path, data: bytes) -> Path:
    directory.mkdir()
    (directory / DATABASE_NAME).write_bytes(data)
    if (store.directory / (DATABASE_NAME + "-wal")).exists():
        shutil.copy(store.directory / (DATABASE_NAME + "-wal"), directory / (DATABASE_NAME + "-wal"))
    return directory / DATABASE_NAME


def _check(store: Store, rows: dict[str, list[tuple]], damaged: set[int], trial: str) -> int:
    """Assert that every row off the damaged pages came back as it was, and nothing else but rows
    as they were (a plan whose last overflow page was zeroed may come back with zeros: its sha256
    says so to every reader of it); the number of rows recovered."""
    lost_pages = damaged - store.wal_pages
    for table, live in store.live.items():
        got = {_key(table, row): row for row in rows[table]}
        assert len(got) == len(rows[table]), f"{trial}: {table} rows repeat a primary key"
        assert not got.keys() & store.deleted[table], f"{trial}: deleted {table} rows came back"
        assert got.keys() <= live.keys(), f"{trial}: {table} rows that were never written"
        for key, row in live.items():
            if store.pages[table][key].isdisjoint(lost_pages):
                assert got.get(key) == row, f"{trial}: the {table} row {key} on intact pages"
        for key, row in got.items():
            assert row == live[key] or (table == "plans" and sha256(row[-1]) != row[2]), \
                f"{trial}: the {table} row {key} came back changed"
    return sum(len(table_rows) for table_rows in rows.values())


def _zeroed(data: bytes, page_size: int, page: int) -> bytes:
    damaged = bytearray(data)
    damaged[(page - 1) * page_size:page * page_size] = bytes(page_size)
    return bytes(damaged)


def _root(store: Store, table: str) -> int:
    return scan(store.file).schema[table]


def test_the_store_has_what_the_sweep_needs(with_log, checkpointed):
    for store in (with_log, checkpointed):
        assert len(store.live["verdicts"]) == DECISIONS - len(set(DELETED_BEFORE_CHECKPOINT + DELETED_IN_LOG))
        assert store.live["plans"][(H100.key(), "plan-kept")][-1] == KEPT_PLAN
        assert len(store.pages["plans"][(H100.key(), "plan-kept")]) > 20  # an overflow chain
        assert len(store.live["runner_choices"]) == RUNNER_CHOICES - len(DELETED_RUNNER_CHOICES)
    assert with_log.wal_pages and not checkpointed.wal_pages
    conn = sqlite3.connect(f"{checkpointed.file.as_uri()}?mode=ro", uri=True)
    assert conn.execute("PRAGMA freelist_count").fetchone()[0] > 5
    conn.close()
    # The deleted rows' bytes are still in the files: on freed pages and in free blocks.
    stale = checkpointed.file.read_bytes()
    assert sum(f"{H100.key()}key-{i}full".encode() in stale for i in DELETED_BEFORE_CHECKPOINT) > 30
    assert any(DELETED_PLAN[start:start + 1000] in stale for start in range(0, len(DELETED_PLAN), 4000))


@pytest.mark.parametrize("variant", ["with_log", "checkpointed"])
def test_an_undamaged_store_recovers_exactly_its_rows(variant, request, tmp_path):
    store = request.getfixturevalue(variant)
    assert {table: {_key(table, row): row for row in rows} for table, rows in recover(store.file).rows.items()} \
        == store.live
    assert {table: set(keys) for table, keys in store.pages.items()} == \
        {table: set(rows) for table, rows in store.live.items()}  # the scan alone reads every row


def test_every_page_zeroed_in_turn_loses_only_the_rows_on_it(with_log, checkpointed, tmp_path):
    trials = recovered = 0
    for store in (with_log, checkpointed):
        data = store.file.read_bytes()
        for page in range(1, store.file_pages() + 1):
            path = _damaged_copy(store, tmp_path / f"{trials}", _zeroed(data, store.page_size, page))
            recovered += _check(store, recover(path).rows, {page}, f"page {page} zeroed")
            trials += 1
    print(f"{trials} pages zeroed in turn: every intact row recovered; {recovered / trials:.1f} rows of "
          f"{checkpointed.rows()} recovered on average")


def test_a_file_cut_short_keeps_the_rows_of_the_pages_before_the_cut(with_log, checkpointed, tmp_path):
    for store in (with_log, checkpointed):
        data = store.file.read_bytes()
        size, pages = store.page_size, store.file_pages()
        for length in (0, 60, size, size * (pages // 4), size * (pages // 2) + 1000, size * (pages - 1),
                       len(data) - 1):
            path = _damaged_copy(store, tmp_path / f"{store.wal_pages != frozenset()}-{length}", data[:length])
            lost = {page for page in range(1, pages + 1) if page * size > length}
            _check(store, recover(path).rows, lost, f"cut at {length} bytes")


@pytest.mark.parametrize("variant", ["with_log", "checkpointed"])
def test_a_damaged_header_loses_no_row(variant, request, tmp_path):
    store = request.getfixturevalue(variant)
    data = bytearray(store.file.read_bytes())
    data[:100] = random.Random(3).randbytes(100)
    path = _damaged_copy(store, tmp_path / "header", bytes(data))
    recovered = recover(path)
    assert _check(store, recovered.rows, set(), "header damaged") == store.rows()
    assert recovered.lost == {table: 0 for table in TABLE_COLUMNS}  # counted by indexes the scan read


def test_a_damaged_root_page_loses_no_row(checkpointed, tmp_path):
    root = _root(checkpointed, "verdicts")
    data = bytearray(checkpointed.file.read_bytes())
    data[(root - 1) * checkpointed.page_size:root * checkpointed.page_size] = b"\x55" * checkpointed.page_size
    path = _damaged_copy(checkpointed, tmp_path / "root", bytes(data))
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    assert list(readable_rows(conn, "verdicts", ("config_key",))) == []  # SQLite alone reads none of them
    conn.close()
    assert _check(checkpointed, recover(path).rows, set(), "verdicts root damaged") == checkpointed.rows()


def test_freed_pages_stay_out_when_both_the_freelist_and_the_root_page_are_damaged(checkpointed, tmp_path):
    data = checkpointed.file.read_bytes()
    trunk, root = int.from_bytes(data[32:36], "big"), _root(checkpointed, "verdicts")
    assert trunk  # the first freelist trunk page: the freed pages it lists are lost with it
    damaged = _zeroed(_zeroed(data, checkpointed.page_size, trunk), checkpointed.page_size, root)
    path = _damaged_copy(checkpointed, tmp_path / "trunk-and-root", damaged)
    # Leaf pages outside the damaged tree are live or freed: the intact indexes tell which.
    assert _check(checkpointed, recover(path).rows, {trunk, root}, "trunk and root zeroed") == checkpointed.rows()


def test_salvage_copies_every_row_under_a_damaged_root_page(checkpointed, tmp_path):
    root = _root(checkpointed, "verdicts")
    path = _damaged_copy(checkpointed, tmp_path / "root",
                         _zeroed(checkpointed.file.read_bytes(), checkpointed.page_size, root))
    fresh = sqlite3.connect(tmp_path / "fresh.sqlite3", isolation_level=None)
    fresh.execute("BEGIN")
    create_schema(fresh)
    report = salvage(path, fresh)
    fresh.execute("COMMIT")
    rows = {table: fresh.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall()
            for table, columns in TABLE_COLUMNS.items()}
    assert _check(checkpointed, rows, set(), "salvage, verdicts root zeroed") == checkpointed.rows()
    assert report.salvaged == {table: len(live) for table, live in checkpointed.live.items()}
    assert report.describe().endswith("lost 0 rows")


@pytest.fixture(scope="module")
def three_levels(tmp_path_factory) -> Store:
    """A store of 1 KB pages: its decisions' b-tree has a root, interior pages below it, leaves."""
    cache = tmp_path_factory.mktemp("small-pages")
    os.chmod(cache, 0o700)
    conn = sqlite3.connect(cache / DATABASE_NAME)
    conn.execute("PRAGMA page_size = 1024")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()
    os.chmod(cache / DATABASE_NAME, 0o600)
    store = PersistentStore(cache)
    for index in range(300):
        assert store.put(H100, f"key-{index}", _decision(index), ProbeDepth.FULL)
    _delete(store.path, [*range(40, 60)], [])
    store.close()
    return _described(cache, tmp_path_factory.mktemp("select") / "copy", [*range(40, 60)], [])


def _interior_pages(store: Store, root: int) -> list[int]:
    """The interior pages of the table b-tree at `root` below the root itself."""
    data = store.file.read_bytes()
    size = store.page_size

    def children(page: int) -> list[int]:
        body = data[(page - 1) * size:page * size]
        if body[0] != 0x05:
            return []
        count = int.from_bytes(body[3:5], "big")
        pointers = [int.from_bytes(body[12 + 2 * i:14 + 2 * i], "big") for i in range(count)]
        return [int.from_bytes(body[p:p + 4], "big") for p in pointers] + [int.from_bytes(body[8:12], "big")]

    return [child for child in children(root) if children(child)]


def test_damaged_root_and_interior_pages_of_a_deeper_tree_lose_no_row(three_levels, tmp_path):
    assert three_levels.page_size == 1024
    root = _root(three_levels, "verdicts")
    interior = _interior_pages(three_levels, root)
    assert len(interior) >= 2
    data = three_levels.file.read_bytes()
    for pages in ([root], [interior[0]], [root, interior[-1]], interior):
        damaged = data
        for page in pages:
            damaged = _zeroed(damaged, 1024, page)
        path = _damaged_copy(three_levels, tmp_path / "-".join(map(str, pages)), damaged)
        assert _check(three_levels, recover(path).rows, set(), f"pages {pages} zeroed") == three_levels.rows()
