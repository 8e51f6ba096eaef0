"""A salvage never loses an acknowledged write: connections opened before it reopen the new file,
and a salvage cut short at any step is finished by the next write, from any process."""

import logging
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_samples import H100, SUPPORTED_FULL, race_writers_with_salvage, warnings_of

from fusedattn_select.store import DATABASE_NAME, PersistentStore, database, swap
from fusedattn_select.types import ProbeDepth

ROWS = 300
PLAN = b"serialized plan bytes " * 40


def _damaged_store(cache_dir, rows=ROWS) -> Path:
    """A store of `rows` decisions and a plan whose verdicts index page is overwritten: every row
    is still readable, integrity_check fails, and a decision write meets the damage."""
    store = PersistentStore(cache_dir)
    for index in range(rows):
        assert store.put(H100, f"key-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.put_plan(H100, "plan-0", PLAN)
    store.close()
    path = cache_dir / DATABASE_NAME
    conn = sqlite3.connect(path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'verdicts_by_last_use'").fetchone()[0]
    conn.close()
    with open(path, "r+b") as handle:
        handle.seek((root - 1) * page_size)
        handle.write(b"\x55" * page_size)
    assert database.integrity_problem(path)
    return path


def _keys(cache_dir) -> set[str]:
    conn = sqlite3.connect(cache_dir / DATABASE_NAME)
    try:
        return {row[0] for row in conn.execute("SELECT config_key FROM verdicts")}
    finally:
        conn.close()


SALVAGE_IN_ANOTHER_PROCESS = """
import sys
from fusedattn_select.store import PersistentStore
print(PersistentStore(sys.argv[1]).repair(), flush=True)
"""


def test_writes_of_a_store_opened_before_another_process_salvages_reach_the_live_file(cache_dir):
    _damaged_store(cache_dir)
    first = PersistentStore(cache_dir)
    # A plan write does not touch the damaged decisions index: this process's writing connection
    # opens on the damaged file without noticing.
    assert first.put_plan(H100, "plan-1", PLAN)
    said = subprocess.run([sys.executable, "-c", SALVAGE_IN_ANOTHER_PROCESS, str(cache_dir)],
                          capture_output=True, text=True, check=True).stdout
    assert "salvaged" in said and database.integrity_problem(cache_dir / DATABASE_NAME) is None
    # Plan writes, which would never meet damage in the file set aside either.
    for index in range(50):
        assert first.put_plan(H100, f"after-{index}", PLAN)
    assert first.get_plan(H100, "after-49") == PLAN
    conn = sqlite3.connect(cache_dir / DATABASE_NAME)
    plans = {row[0] for row in conn.execute("SELECT plan_key FROM plans")}
    conn.close()
    assert {f"after-{index}" for index in range(50)} <= plans
    assert {f"key-{index}" for index in range(ROWS)} <= _keys(cache_dir)


def _salvaged_copy_waiting(cache_dir, steps: int) -> Path:
    """The files a salvaging process leaves when it dies after `steps` of: the complete copy under
    its final name, the damaged file's second name, its log moved aside."""
    path = _damaged_store(cache_dir)
    db = database.Database(path)
    partial = path.with_name(path.name + ".salvage-1")
    aside = path.with_name(path.name + ".corrupt-20260101T000000.000000")
    swap._salvage_into(path, partial, {"salvage_aside": aside.name, "salvage_problem": "test"})
    os.replace(partial, db.salvaged_copy)
    if steps >= 2:
        os.link(path, aside)
    if steps >= 3:
        for suffix in ("-wal", "-shm"):
            if Path(f"{path}{suffix}").exists():
                os.replace(f"{path}{suffix}", f"{aside}{suffix}")
    return aside


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_the_next_write_finishes_a_salvage_cut_short(cache_dir, caplog, steps):
    aside = _salvaged_copy_waiting(cache_dir, steps)
    looking = PersistentStore(cache_dir, read_only=True)
    assert "a salvage was interrupted" in looking.info()["damage"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        store = PersistentStore(cache_dir)
        assert store.put(H100, "new", SUPPORTED_FULL, ProbeDepth.FULL)
    said = [r.getMessage() for r in warnings_of(caplog)]
    assert len(said) == 1 and "finished the salvage" in said[0] and aside.name in said[0]
    assert not (cache_dir / (DATABASE_NAME + ".salvaged")).exists() and aside.exists()
    assert _keys(cache_dir) == {f"key-{index}" for index in range(ROWS)} | {"new"}
    assert store.get_plan(H100, "plan-0") == PLAN
    assert store.integrity_check() == ["ok"]


def test_repair_finishes_a_salvage_cut_short_and_then_finds_the_file_sound(cache_dir):
    aside = _salvaged_copy_waiting(cache_dir, 2)
    store = PersistentStore(cache_dir)
    assert "finished the salvage" in store.repair() and aside.exists()
    assert "sound" in store.repair()
    assert _keys(cache_dir) == {f"key-{index}" for index in range(ROWS)}


def test_repair_beside_an_incomplete_salvaged_copy_removes_it_and_salvages_the_damaged_file(cache_dir):
    path = _damaged_store(cache_dir)
    copy = cache_dir / (DATABASE_NAME + ".salvaged")
    copy.write_bytes(b"not a database")  # a salvage that died before its copy reached the disk
    said = PersistentStore(cache_dir).repair()
    assert said.startswith(f"removed {copy.name}, an incomplete salvaged copy") and f"{path} was damaged (" in said
    assert not copy.exists() and database.integrity_problem(path) is None
    assert _keys(cache_dir) == {f"key-{index}" for index in range(ROWS)}


def test_a_write_after_a_read_found_damage_salvages_the_file_beside_an_incomplete_copy(cache_dir):
    path = _damaged_store(cache_dir)
    store = PersistentStore(cache_dir)
    assert store.check_damage()
    (cache_dir / (DATABASE_NAME + ".salvaged")).write_bytes(b"not a database")
    assert store.put_plan(H100, "plan-1", PLAN)  # a write that does not touch the damaged index
    assert database.integrity_problem(path) is None and store.damage == ""
    assert _keys(cache_dir) == {f"key-{index}" for index in range(ROWS)}
    assert store.get_plan(H100, "plan-1") == PLAN


KILLED_SALVAGE = """
import sys
from fusedattn_select.store import PersistentStore
store = PersistentStore(sys.argv[1])
print("ready", flush=True)
store.repair()
print("done", flush=True)
"""


def test_kill_9_at_any_moment_of_a_salvage_loses_no_row(cache_dir, tmp_path):
    """A salvaging process killed at random moments: the next open always holds every row."""
    rows = 1500
    template = tmp_path / "template"
    template.mkdir(mode=0o700)
    _damaged_store(template, rows)
    expected = {f"key-{index}" for index in range(rows)}

    def run(kill_after: float | None) -> bool:
        directory = tmp_path / f"run-{random.random()}"
        shutil.copytree(template, directory)
        child = subprocess.Popen([sys.executable, "-c", KILLED_SALVAGE, str(directory)],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        started = time.monotonic()
        if kill_after is None:
            assert child.stdout.readline().strip() == "done"
            run.duration = time.monotonic() - started
            child.wait(60)
        else:
            time.sleep(kill_after)
            child.send_signal(signal.SIGKILL)
            child.wait(60)
        child.stdout.close()
        store = PersistentStore(directory)
        assert store.put(H100, "after", SUPPORTED_FULL, ProbeDepth.FULL)
        assert _keys(directory) == expected | {"after"}, f"killed after {kill_after} s"
        assert not list(directory.glob(DATABASE_NAME + ".salvage*"))
        shutil.rmtree(directory)
        return child.returncode == -signal.SIGKILL

    run(None)  # how long a whole salvage takes here (the shorter of two)
    duration = run.duration
    run(None)
    duration = min(duration, run.duration)
    rng = random.Random(33)
    killed = sum(run(rng.uniform(0, 0.9 * duration)) for _ in range(16))
    assert killed >= 10  # most kills landed before the salvage finished


WRITER = """
import sys
from store_samples import H100, SUPPORTED_FULL
from fusedattn_select.store import PersistentStore
from fusedattn_select.types import ProbeDepth
store = PersistentStore(sys.argv[1])
for index in range(int(sys.argv[3])):
    key = f"{sys.argv[2]}-{index}"
    if store.put(H100, key, SUPPORTED_FULL, ProbeDepth.FULL):
        print(key, flush=True)
"""


def test_writers_lose_no_acknowledged_row_while_another_process_salvages_again_and_again(cache_dir):
    PersistentStore(cache_dir).put(H100, "seed", SUPPORTED_FULL, ProbeDepth.FULL)
    acknowledged = race_writers_with_salvage(cache_dir, WRITER, salvages=12)
    assert len(acknowledged) == 600  # every write succeeded
    assert acknowledged <= _keys(cache_dir)
    assert len(list(cache_dir.glob(DATABASE_NAME + ".corrupt-*[0-9]"))) == 12
