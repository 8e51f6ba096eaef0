"""A warmup whose saves fail says so: the report counts the writes the persistent store could not do
(in this process and in worker processes), and its summary names them.

The failing store is real: another connection holds the database's write lock (BEGIN IMMEDIATE, as a
stuck process would; it stops root too), with the store's patience shortened. The engine is
RecordingTestEngine (tests/conftest.py), a test double standing in for a live device.
"""

import sqlite3

import pytest

from fusedattn_select.config import AttnConfig
from fusedattn_select.selection import local_warmup
from fusedattn_select.selection.local_warmup import WarmupOutcome, warmup
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store import PersistentStore, database

BASE = dict(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, is_training=False)
PROBLEMS = [(f"d{dim}", AttnConfig(head_dim_qk=dim, **BASE)) for dim in (64, 96, 128)]


@pytest.fixture
def cache_dir(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    return directory


@pytest.fixture
def locked_store(cache_dir, monkeypatch):
    """A persistent store whose write lock another connection holds for the whole test."""
    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.02)
    monkeypatch.setattr(database, "LOCKED_RETRY_S", 0.05)
    store = PersistentStore(cache_dir)
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    yield store
    other.execute("ROLLBACK")
    other.close()


def test_a_warmup_whose_saves_fail_counts_them(locked_store, recording_engine):
    report = warmup(PROBLEMS, jobs=2, depth="fast", selector=Selector(recording_engine, store=locked_store))
    assert report.count(WarmupOutcome.ACCEPTED) == 3  # the answers were given
    assert report.failed_saves == 3 and report.totals["failed_saves"] == 3
    assert report.store_path == str(locked_store.path)
    assert report.summary().endswith(f"; 3 saves of answers and plans to {locked_store.path} failed: "
                                     "they last only as long as this process")
    assert report.to_dict()["totals"]["failed_saves"] == 3
    assert locked_store.info()["entries"] == 0


def test_a_warmup_whose_saves_succeed_reports_none(cache_dir, recording_engine):
    store = PersistentStore(cache_dir)
    report = warmup(PROBLEMS, jobs=2, depth="fast", selector=Selector(recording_engine, store=store))
    assert report.failed_saves == 0 and "saves" not in report.summary()
    assert store.info()["entries"] == 3


def test_a_worker_process_reports_the_saves_it_could_not_do(locked_store, recording_engine, monkeypatch):
    # What a spawned worker runs for one problem, run here: its saves happen in its own store, so
    # the count must come back with its row.
    monkeypatch.setattr(local_warmup, "worker_selector",
                        lambda store_dir, device: Selector(recording_engine, store=locked_store))
    name, cfg = PROBLEMS[0]
    row, failed = local_warmup._warm_in_worker(name, cfg.to_dict(), cfg.cache_key(), "fast",
                                                str(locked_store.directory), 0)
    assert row.outcome is WarmupOutcome.ACCEPTED and failed == 1
