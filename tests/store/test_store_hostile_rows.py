"""Rows nobody should trust: a stored or imported row holding a number beyond any float or JSON nested
past Python's recursion limit is dropped (store) or refuses the whole file (import), never raised into
select(); an edited decision row of an export does not match its sha256; an export that cannot be
written says so and leaves nothing behind; a store that cannot be cleared says so."""

import json
import logging
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from store_samples import H100, H200, KEY, REJECTED_FAST, SUPPORTED_FULL, raw, warnings_of

from fusedattn_select.config import AttnConfig
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store import CacheError, MemoryStore, PersistentStore, database
from fusedattn_select.types import Backend, ProbeDepth, Verdict

HUGE = 10 ** 400  # fewer digits than int() reads (4300), more than any float holds
NESTED = "[" * 100_000 + "]" * 100_000


def _verdicts_text(timing=1.5):
    """The stored JSON of SUPPORTED_FULL with its first timing replaced by `timing` (any JSON number)."""
    rows = [v.to_dict() for v in SUPPORTED_FULL]
    rows[0]["timings_ms"] = {"check_support": "TIMING"}
    return json.dumps(rows).replace('"TIMING"', str(timing))


def _plant(store, text):
    """Overwrite the stored decision (H100, KEY) with `text`, as a damaged or hostile file would hold."""
    store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    conn = raw(store)
    conn.execute("UPDATE verdicts SET verdicts = ? WHERE config_key = ?", (text, KEY))
    conn.close()


# ----- stored rows ------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [_verdicts_text(HUGE), NESTED], ids=["integer-beyond-float", "deep-nesting"])
def test_a_hostile_stored_row_is_dropped_with_one_warning(cache_dir, caplog, text):
    store = PersistentStore(cache_dir)
    _plant(store, text)
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        assert store.get(H100, KEY) is None
        assert store.get(H100, KEY) is None  # the row is gone: no second warning
    assert len(warnings_of(caplog)) == 1
    assert "dropped the cached decision" in warnings_of(caplog)[0].getMessage()
    assert store.info()["entries"] == 0


def test_select_answers_again_after_a_hostile_stored_row(cache_dir, recording_engine):
    store = PersistentStore(cache_dir)
    selector = Selector(recording_engine, store=store)
    cfg = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128)
    selector.select(cfg)
    conn = raw(store)
    conn.execute("UPDATE verdicts SET verdicts = ?", (NESTED,))
    conn.close()
    fresh = Selector(recording_engine, store=PersistentStore(cache_dir))
    assert fresh.select(cfg).backend is Backend.F16  # probed again, not raised
    assert fresh.select(cfg).from_cache


def test_a_verdict_with_an_integer_beyond_any_float_is_a_value_error():
    data = SUPPORTED_FULL[0].to_dict()
    data["timings_ms"] = {"check_support": HUGE}
    with pytest.raises(ValueError, match=r"timings_ms\['check_support'\]: an integer of \d+ bits is out of range"):
        Verdict.from_dict(data)


# ----- import -----------------------------------------------------------------------------------
def _export_of_twenty(tmp_path):
    source = MemoryStore()
    for index in range(20):
        source.put(H100, f"key-{index:02d}", SUPPORTED_FULL, ProbeDepth.FULL)
    path = tmp_path / "twenty.json"
    source.export(path)
    return path


def test_an_import_holding_an_integer_beyond_64_bits_changes_nothing_and_names_the_row(cache_dir, tmp_path):
    path = _export_of_twenty(tmp_path)
    document = json.loads(path.read_text())
    document["verdicts"][10]["verdicts"][0]["timings_ms"] = {"check_support": "TIMING"}
    path.write_text(json.dumps(document).replace('"TIMING"', str(HUGE)))
    store = PersistentStore(cache_dir)
    with pytest.raises(CacheError, match=r"verdicts\[10\] \(decision [0-9a-f]{12}/key-10\): an integer of "
                                         r"\d+ bits is out of range; .*nothing was imported"):
        store.import_(path)
    assert store.info()["entries"] == 0


def test_an_import_nested_past_the_recursion_limit_is_refused(cache_dir, tmp_path):
    path = _export_of_twenty(tmp_path)
    text = path.read_text()
    path.write_text(text.replace('"verdicts": [', '"verdicts": [' + NESTED + ",", 1))
    store = PersistentStore(cache_dir)
    with pytest.raises(CacheError, match="nested too deeply"):
        store.import_(path)
    assert store.info()["entries"] == 0


# ----- decision rows carry a sha256 -------------------------------------------------------------
def test_a_verdict_flipped_in_an_export_does_not_import(store, tmp_path):
    source = MemoryStore()
    source.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    source.put(H100, "other", SUPPORTED_FULL, ProbeDepth.FULL)
    path = tmp_path / "export.json"
    source.export(path)
    document = json.loads(path.read_text())
    flipped = document["verdicts"][0]["verdicts"][0]
    flipped.update(outcome="unsupported", stage="check_support", message="not supported here")
    path.write_text(json.dumps(document))
    report = store.import_(path)
    assert report.verdicts == 1
    assert report.skipped == ((f"decision {H100.key()[:12]}/{KEY}",
                               "sha256 of the decision does not match the row (edited or damaged)"),)
    assert store.get(H100, KEY) is None
    assert store.get(H100, "other") == (SUPPORTED_FULL, ProbeDepth.FULL)


def test_a_decision_row_without_a_sha256_does_not_import(tmp_path):
    source = MemoryStore()
    source.put(H200, KEY, REJECTED_FAST, ProbeDepth.FAST)
    path = tmp_path / "export.json"
    source.export(path)
    document = json.loads(path.read_text())
    del document["verdicts"][0]["sha256"]
    path.write_text(json.dumps(document))
    report = MemoryStore().import_(path)
    assert report.verdicts == 0 and "carries no sha256" in report.skipped[0][1]


# ----- export that cannot be written ------------------------------------------------------------
def test_export_into_a_missing_directory_names_it_and_writes_nothing(store, tmp_path):
    target = tmp_path / "missing" / "export.json"
    with pytest.raises(CacheError, match=f"cache export {target}: directory {target.parent} does not exist"):
        store.export(target)
    assert not (tmp_path / "missing").exists()


def test_export_onto_a_directory_names_it_and_leaves_no_temporary_file(store, tmp_path):
    target = tmp_path / "a-directory"
    target.mkdir()
    with pytest.raises(CacheError, match=f"cache export {target}: is a directory"):
        store.export(target)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_export_that_runs_out_of_space_leaves_no_temporary_file(tmp_path):
    # A real failed write: the file size limit (as a full disk) stops json.dump part way.
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from store_samples import H100, SUPPORTED_FULL
        from fusedattn_select.store import CacheError, MemoryStore
        from fusedattn_select.types import ProbeDepth
        store = MemoryStore()
        for i in range(200):
            store.put(H100, f"key-{{i}}", SUPPORTED_FULL, ProbeDepth.FULL)
        try:
            store.export({str(tmp_path / "export.json")!r})
        except CacheError as err:
            print(err)
    """)

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          preexec_fn=limit_file_size)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"cache export {tmp_path / 'export.json'}: cannot be written (")
    assert list(tmp_path.iterdir()) == []


# ----- clear that cannot clear ------------------------------------------------------------------
@pytest.fixture
def locked_store(cache_dir, monkeypatch):
    """A persistent store holding one decision, whose database another connection holds the write
    lock of (BEGIN IMMEDIATE, as a stuck process would), with the store's patience shortened."""
    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.02)
    monkeypatch.setattr(database, "LOCKED_RETRY_S", 0.1)
    store = PersistentStore(cache_dir)
    store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    yield store
    other.execute("ROLLBACK")
    other.close()


def test_clear_that_cannot_write_raises_and_removes_nothing(locked_store):
    with pytest.raises(CacheError, match=f"decision cache {locked_store.path}: .*locked.*; not cleared"):
        locked_store.clear()
    assert locked_store.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)


def test_clear_cache_of_a_store_that_cannot_be_cleared_raises(locked_store, recording_engine):
    selector = Selector(recording_engine, store=locked_store)
    with pytest.raises(CacheError, match="not cleared"):
        selector.clear(persistent=True)
    assert selector.cache_info()["entries"] == 0  # memory is emptied all the same

