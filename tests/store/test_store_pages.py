"""The page scanner reads a SQLite file as SQLite's `.recover` does: the committed frames of its
write-ahead log laid over the file, every page size, overflow chains, a damaged header; and no
damage makes it raise."""

import os
import random
import shutil
import sqlite3
from pathlib import Path

import pytest
from store_samples import H100, SUPPORTED_FULL, verdicts

from fusedattn_select.store import DATABASE_NAME, PersistentStore
from fusedattn_select.store.pages import scan
from fusedattn_select.store.salvage import TABLE_COLUMNS, recover
from fusedattn_select.types import Outcome, ProbeDepth

WAL = DATABASE_NAME + "-wal"
PLAN = random.Random(5).randbytes(30_000)


def _write(directory: Path, decisions: int, page_size: int | None = None, keep_log: bool = False,
           decision=SUPPORTED_FULL) -> Path:
    """A store of `decisions` decisions and one plan in `directory`; with `keep_log` its writes are
    left in the write-ahead log (the files are copied while the store is open)."""
    cache = directory.with_name(directory.name + "-cache")
    cache.mkdir(mode=0o700)
    if page_size is not None:
        conn = sqlite3.connect(cache / DATABASE_NAME)
        conn.execute(f"PRAGMA page_size = {page_size}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.close()
        os.chmod(cache / DATABASE_NAME, 0o600)
    store = PersistentStore(cache)
    assert store.put_plan(H100, "plan", PLAN)
    for index in range(decisions):
        assert store.put(H100, f"key-{index}", decision, ProbeDepth.FULL)
    directory.mkdir()
    if keep_log:
        for name in (DATABASE_NAME, WAL):
            shutil.copy(cache / name, directory / name)
    store.close()
    if not keep_log:
        shutil.copy(cache / DATABASE_NAME, directory / DATABASE_NAME)
    return directory / DATABASE_NAME


def _select(path: Path, wal: bytes | None = None) -> dict[str, set[tuple]]:
    """Every row of the data tables by SQLite, from a copy of `path` with `wal` as its log."""
    copy = path.parent.with_name(path.parent.name + f"-select-{random.random()}") / DATABASE_NAME
    copy.parent.mkdir()
    shutil.copy(path, copy)
    if wal is not None:
        Path(f"{copy}-wal").write_bytes(wal)
    conn = sqlite3.connect(copy)
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return {table: set(conn.execute(f"SELECT {', '.join(columns)} FROM {table}")) if table in tables else set()
                for table, columns in TABLE_COLUMNS.items()}
    finally:
        conn.close()


def _scanned(path: Path) -> dict[str, set[tuple]]:
    """Every row of the data tables by the scanner alone."""
    rows = {table: set() for table in TABLE_COLUMNS}
    for row in scan(path).rows:
        if row.table in rows:
            rows[row.table].add(row.values)
    return rows


def _frame_offset(index: int, page_size: int) -> int:
    return 32 + index * (24 + page_size)


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> Path:
    """A store whose every write is still in its write-ahead log, one commit per decision."""
    return _write(tmp_path_factory.mktemp("logged") / "store", 40, keep_log=True)


def test_committed_log_frames_are_laid_over_the_file(logged):
    pages = scan(logged)
    assert pages.wal_pages and _scanned(logged) == _select(logged, Path(f"{logged}-wal").read_bytes())
    assert len(_scanned(logged)["verdicts"]) == 40


def test_a_log_cut_short_is_read_up_to_its_last_whole_commit(logged, tmp_path):
    wal = Path(f"{logged}-wal").read_bytes()
    page_size = scan(logged).page_size
    frames = (len(wal) - 32) // (24 + page_size)
    for frames_kept in (0, 1, frames // 3, frames // 2, frames - 1):
        for extra in (0, 24 + page_size // 2):  # at a frame's end, and inside the next frame
            cut = wal[:_frame_offset(frames_kept, page_size) + extra]
            copy = tmp_path / f"{frames_kept}-{extra}"
            copy.mkdir()
            shutil.copy(logged, copy / DATABASE_NAME)
            (copy / WAL).write_bytes(cut)
            expected = _select(logged, cut)
            assert _scanned(copy / DATABASE_NAME) == expected, f"log cut after {frames_kept} frames + {extra} bytes"
    assert len(expected["verdicts"]) < 40  # the cuts did lose commits


@pytest.mark.parametrize("damage", ["page data", "salt", "page number"])
def test_a_log_frame_that_is_not_valid_ends_the_log(logged, tmp_path, damage):
    wal = bytearray(Path(f"{logged}-wal").read_bytes())
    page_size = scan(logged).page_size
    frame = _frame_offset(((len(wal) - 32) // (24 + page_size)) // 2, page_size)
    position = {"page data": frame + 24 + 100, "salt": frame + 9, "page number": frame + 3}[damage]
    wal[position] ^= 0xFF
    shutil.copy(logged, tmp_path / DATABASE_NAME)
    (tmp_path / WAL).write_bytes(bytes(wal))
    scanned, expected = _scanned(tmp_path / DATABASE_NAME), _select(logged, bytes(wal))
    assert scanned == expected and 0 < len(expected["verdicts"]) < 40


def test_a_log_whose_header_is_damaged_is_not_read(logged, tmp_path):
    wal = bytearray(Path(f"{logged}-wal").read_bytes())
    wal[17] ^= 0xFF  # a salt: the header's checksum no longer matches
    shutil.copy(logged, tmp_path / DATABASE_NAME)
    (tmp_path / WAL).write_bytes(bytes(wal))
    pages = scan(tmp_path / DATABASE_NAME)
    assert not pages.wal_pages
    assert _scanned(tmp_path / DATABASE_NAME) == _select(logged, bytes(wal))


@pytest.mark.parametrize("page_size", [512, 1024, 8192, 65536])
def test_the_page_size_is_found_when_the_header_is_damaged(tmp_path, page_size):
    path = _write(tmp_path / "store", 30, page_size)
    expected = _select(path)
    data = bytearray(path.read_bytes())
    data[:100] = bytes(100)
    path.write_bytes(bytes(data))
    pages = scan(path)
    assert (pages.page_size, pages.header_damaged) == (page_size, True)
    assert _scanned(path) == expected and len(expected["verdicts"]) == 30


def test_rows_of_small_pages_are_read_through_their_overflow_chains(tmp_path):
    long_message = verdicts(Outcome.UNSUPPORTED, ProbeDepth.FAST, "not supported " * 20)
    path = _write(tmp_path / "store", 30, 512, decision=long_message)  # a decision fills more than a page
    rows = [row for row in scan(path).rows if row.table in ("verdicts", "plans")]
    assert len(rows) == 31 and all(row.overflow for row in rows)
    assert _scanned(path) == _select(path)


def test_a_broken_overflow_chain_loses_only_its_own_row(tmp_path):
    path = _write(tmp_path / "store", 30)
    pages = scan(path)
    plan = next(row for row in pages.rows if row.table == "plans")
    data = bytearray(path.read_bytes())
    middle = plan.overflow[len(plan.overflow) // 2]
    data[(middle - 1) * pages.page_size:middle * pages.page_size] = bytes(pages.page_size)
    path.write_bytes(bytes(data))
    scanned = _scanned(path)
    assert not scanned["plans"] and len(scanned["verdicts"]) == 30


def test_an_integral_real_stored_as_an_integer_is_read_back_as_a_real(tmp_path):
    path = _write(tmp_path / "store", 3)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE verdicts SET created = 1700000000.0 WHERE config_key = 'key-1'")
    conn.close()
    on_disk = next(row for row in scan(path).rows if row.values[1:2] == ("key-1",))
    assert type(on_disk.values[5]) is int  # SQLite's own space saving
    data = bytearray(path.read_bytes())
    data[:100] = bytes(100)  # SQLite cannot read the file: only the scanner can
    path.write_bytes(bytes(data))
    recovered = next(row for row in recover(path).rows["verdicts"] if row[1] == "key-1")
    assert type(recovered[5]) is float and recovered[5] == 1700000000.0


def test_text_that_is_not_utf8_loses_its_row(tmp_path):
    path = _write(tmp_path / "store", 5)
    data = bytearray(path.read_bytes())
    at = data.find(b"key-3full")
    data[at + 4] = 0xFF  # "key-\xff"
    path.write_bytes(bytes(data))
    assert {row[1] for row in _scanned(path)["verdicts"]} == {"key-0", "key-1", "key-2", "key-4"}


@pytest.mark.parametrize("content", [None, b"", b"SQLite format 3\x00", b"\x00" * 4096, b"\x0d" * 9000])
def test_a_file_with_nothing_to_read_gives_no_rows(tmp_path, content):
    path = tmp_path / DATABASE_NAME
    if content is not None:
        path.write_bytes(content)
    assert scan(path).rows == ()
    assert recover(path).rows == {table: [] for table in TABLE_COLUMNS}


def test_cycles_in_the_file_end_the_walks_that_meet_them(tmp_path):
    path = _write(tmp_path / "store", 30)
    pages = scan(path)
    size = pages.page_size
    plan = next(row for row in pages.rows if row.table == "plans")
    data = bytearray(path.read_bytes())
    last = plan.overflow[-1]
    data[(last - 1) * size:(last - 1) * size + 4] = plan.overflow[0].to_bytes(4, "big")  # the chain loops
    root = pages.schema["verdicts"]
    if data[(root - 1) * size] == 0x05:  # the root's right-most child: the root itself
        data[(root - 1) * size + 8:(root - 1) * size + 12] = root.to_bytes(4, "big")
    data[32:36] = (2).to_bytes(4, "big")  # the freelist starts at a page that is not on it
    path.write_bytes(bytes(data))
    scanned = _scanned(path)
    assert not scanned["plans"] and scanned["fingerprints"]


def test_random_damage_never_raises(tmp_path):
    """Bytes overwritten at random places of leaf, interior, overflow and log pages: the scan
    reads what it can and never raises; every row it gives has its table's shape or no table."""
    path = _write(tmp_path / "store", 60, 1024, keep_log=True)
    data, wal = path.read_bytes(), Path(f"{path}-wal").read_bytes()
    size = 1024
    generator = random.Random(11)
    for trial in range(100):
        damaged, damaged_wal = bytearray(data), bytearray(wal)
        for _ in range(generator.randint(1, 6)):
            target = damaged if generator.random() < 0.8 else damaged_wal
            start = generator.randrange(len(target))
            if generator.random() < 0.2:  # a whole page of garbage
                start -= start % size
                target[start:start + size] = generator.randbytes(size)
            else:
                target[start:start + 8] = generator.randbytes(8)
        if generator.random() < 0.2:
            del damaged[generator.randrange(len(damaged)):]
        copy = tmp_path / f"trial-{trial}"
        copy.mkdir()
        (copy / DATABASE_NAME).write_bytes(bytes(damaged))
        (copy / WAL).write_bytes(bytes(damaged_wal))
        pages = scan(copy / DATABASE_NAME)
        assert all(1 <= row.page <= pages.page_count for row in pages.rows)
        recovered = recover(copy / DATABASE_NAME)
        assert all(len(row) == len(TABLE_COLUMNS[table]) for table, rows in recovered.rows.items() for row in rows)
