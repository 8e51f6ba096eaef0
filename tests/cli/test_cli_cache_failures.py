"""Commands that could not do what they were asked say so: a warmup whose saves failed exits 4 with
one error line, `cache clear` that cannot clear exits 1, `cache import` takes this machine's
fingerprint unless told otherwise (and must be told where no live device answers), a hostile import
changes nothing and exits 2, `cache export` to a place it cannot write exits 2, `cache repair` says
what it did.

Failing stores are real: another connection holds the database's write lock (BEGIN IMMEDIATE, as a
stuck process would; it stops root too), with the store's patience shortened. The live device is
RecordingTestEngine (tests/conftest.py), a test double.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import sqlite3

import pytest

from fusedattn_select import cli
from fusedattn_select.probing import choice
from fusedattn_select.store import MemoryStore, PersistentStore, database
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, ProbeDepth, Verdict

NO_DEVICE = "test: no GPU here"
SUPPORTED = (Verdict(Backend.F16, Phase.FORWARD, Outcome.SUPPORTED, "check_support", "", depth=ProbeDepth.FAST),)
SUITE = """
name: small
defaults: {batch_size: 2, num_heads_q: 16, num_heads_kv: 4, seqlen_q: 1024, seqlen_kv: 1024, is_training: false}
configs:
  - {name: d64, head_dim_qk: 64}
  - {name: d96, head_dim_qk: 96}
  - {name: d128, head_dim_qk: 128}
"""


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def error_lines(err):
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"  # FUSEDATTN_SELECT_CACHE_DIR (tests/conftest.py)


@pytest.fixture
def locked_cache(cache_dir, monkeypatch):
    """The default cache, holding one decision, with its write lock held by another connection."""
    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.02)
    monkeypatch.setattr(database, "LOCKED_RETRY_S", 0.05)
    store = PersistentStore(cache_dir)
    assert store.put(THIS_MACHINE, "held-key", SUPPORTED, ProbeDepth.FAST)
    store.close()
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    yield store.path
    other.execute("ROLLBACK")
    other.close()


# RecordingTestEngine's (tests/conftest.py): the test double's fingerprint, this "machine's".
THIS_MACHINE = Fingerprint("test-double", "Test GPU H100", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")


@pytest.fixture
def live_device(monkeypatch, recording_engine, tmp_path):
    assert recording_engine.fingerprint() == THIS_MACHINE
    monkeypatch.setattr(choice, "SNAPSHOT_DIR", tmp_path / "no-bundled")
    monkeypatch.setattr(choice, "live_engine", lambda: (recording_engine, ""))
    return recording_engine


@pytest.fixture
def no_device(monkeypatch):
    monkeypatch.setattr(choice, "live_engine", lambda: (None, NO_DEVICE))


# ----- warmup whose saves fail --------------------------------------------------------------------
def test_a_live_warmup_whose_saves_fail_exits_4_with_one_error_line(capsys, tmp_path, live_device, locked_cache):
    suite = tmp_path / "small.yaml"
    suite.write_text(SUITE)
    code, out, err = run(capsys, "warmup", str(suite), "--depth", "fast")
    assert code == 4
    assert "3 accepted" in out and "3 saves of answers and plans" in out
    assert error_lines(err) == [f"error: warmup: 3 saves of answers and plans to {locked_cache} failed (store a "
                                "decision: the database stayed locked for 0 s): they last only as long as this command"]


def test_a_live_warmup_whose_saves_fail_reports_them_in_json(capsys, tmp_path, live_device, locked_cache):
    suite = tmp_path / "small.yaml"
    suite.write_text(SUITE)
    code, out, _ = run(capsys, "warmup", str(suite), "--depth", "fast", "--json")
    report = json.loads(out)
    assert code == 4 and report["totals"]["failed_saves"] == 3 and report["store_path"] == str(locked_cache)


def test_a_live_warmup_whose_saves_succeed_exits_0(capsys, tmp_path, live_device):
    suite = tmp_path / "small.yaml"
    suite.write_text(SUITE)
    code, out, err = run(capsys, "warmup", str(suite), "--depth", "fast", "--json")
    assert code == 0 and json.loads(out)["totals"]["failed_saves"] == 0 and error_lines(err) == []


# ----- clear that cannot clear --------------------------------------------------------------------
def test_cache_clear_that_cannot_clear_exits_1_with_one_error_line(capsys, locked_cache):
    code, out, err = run(capsys, "cache", "clear")
    assert code == 1 and out == ""
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith(f"error: cache clear: decision cache {locked_cache}: ")
    assert lines[0].endswith("; not cleared")


# ----- import: whose rows -------------------------------------------------------------------------
@pytest.fixture
def two_machines_export(tmp_path):
    """An export holding one decision of the test device and one of another machine."""
    this = THIS_MACHINE
    other = dataclasses.replace(this, device_name="Another GPU")
    source = MemoryStore()
    source.put(this, "this-key", SUPPORTED, ProbeDepth.FAST)
    source.put(other, "other-key", SUPPORTED, ProbeDepth.FAST)
    path = tmp_path / "export.json"
    source.export(path)
    return path, this.key(), other.key()


def _imported(cache_dir):
    store = PersistentStore(cache_dir, read_only=True)
    fp = THIS_MACHINE
    other = dataclasses.replace(fp, device_name="Another GPU")
    return {key for f, key in ((fp, "this-key"), (other, "other-key")) if store.get(f, key) is not None}


def test_cache_import_takes_this_machines_rows_and_lists_the_others(capsys, cache_dir, live_device,
                                                                     two_machines_export):
    path, this, other = two_machines_export
    code, out, err = run(capsys, "cache", "import", str(path))
    assert code == 1
    report = json.loads(out)
    assert report["fingerprint"] == this and report["imported"] == 1
    assert [row["row"] for row in report["skipped"]] == [f"decision {other[:12]}/other-key"]
    assert f"  decision {other[:12]}/other-key: foreign fingerprint" in err
    assert f"--fingerprint KEY ({other}) or --fingerprint all imports them" in err
    assert _imported(cache_dir) == {"this-key"}


def test_cache_import_without_a_live_device_needs_the_fingerprint_option(capsys, cache_dir, no_device,
                                                                         two_machines_export):
    path, this, other = two_machines_export
    code, out, err = run(capsys, "cache", "import", str(path))
    assert code == 2 and out == ""
    lines = error_lines(err)
    assert len(lines) == 1 and NO_DEVICE in lines[0] and "--fingerprint KEY" in lines[0]
    assert this in lines[0] and other in lines[0] and lines[0].endswith("or --fingerprint all")
    assert _imported(cache_dir) == set()


def test_cache_import_of_one_named_fingerprint(capsys, cache_dir, no_device, two_machines_export):
    path, _, other = two_machines_export
    code, out, _ = run(capsys, "cache", "import", str(path), "--fingerprint", other)
    assert code == 1 and json.loads(out)["imported"] == 1
    assert _imported(cache_dir) == {"other-key"}


def test_cache_import_of_every_fingerprint(capsys, cache_dir, no_device, two_machines_export):
    path, _, _ = two_machines_export
    code, out, _ = run(capsys, "cache", "import", str(path), "--fingerprint", "all")
    assert code == 0 and json.loads(out)["imported"] == 2
    assert _imported(cache_dir) == {"this-key", "other-key"}


def test_cache_import_fingerprint_must_be_a_key_or_all(capsys, two_machines_export):
    code, _, err = run(capsys, "cache", "import", str(two_machines_export[0]), "--fingerprint", "H100")
    assert code == 2 and "--fingerprint: 'H100': must be a fingerprint key (32 hex digits" in err


def test_cache_import_holding_a_hostile_row_changes_nothing_and_exits_2(capsys, cache_dir, live_device, tmp_path):
    source = MemoryStore()
    for index in range(20):
        source.put(THIS_MACHINE, f"key-{index:02d}", SUPPORTED, ProbeDepth.FAST)
    path = tmp_path / "export.json"
    source.export(path)
    document = json.loads(path.read_text())
    document["verdicts"][10]["verdicts"][0]["timings_ms"] = {"check_support": "HUGE"}
    path.write_text(json.dumps(document).replace('"HUGE"', str(10 ** 400)))
    code, out, err = run(capsys, "cache", "import", str(path))
    assert code == 2 and out == ""
    lines = error_lines(err)
    assert len(lines) == 1 and "verdicts[10]" in lines[0] and "key-10" in lines[0]
    assert "nothing was imported" in lines[0]
    assert PersistentStore(cache_dir, read_only=True).info()["entries"] == 0


# ----- export that cannot be written --------------------------------------------------------------
def test_cache_export_into_a_missing_directory_exits_2_naming_it(capsys, tmp_path):
    target = tmp_path / "missing" / "export.json"
    code, out, err = run(capsys, "cache", "export", str(target))
    assert code == 2 and out == ""
    assert err.strip() == f"error: cache export {target}: directory {target.parent} does not exist"


def test_cache_export_onto_a_directory_exits_2_and_leaves_nothing(capsys, tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    code, _, err = run(capsys, "cache", "export", str(target))
    assert code == 2 and err.strip() == f"error: cache export {target}: is a directory; name the file to write"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


# ----- repair -------------------------------------------------------------------------------------
def test_cache_repair_of_a_sound_store_says_so_and_exits_0(capsys, cache_dir):
    PersistentStore(cache_dir).put(THIS_MACHINE, "key", SUPPORTED, ProbeDepth.FAST)
    code, out, err = run(capsys, "cache", "repair")
    assert code == 0 and error_lines(err) == []
    assert out.strip().startswith(str(cache_dir / "decisions.sqlite3")) and "sound" in out


def test_cache_repair_that_cannot_repair_exits_1_with_one_error_line(capsys, cache_dir, monkeypatch):
    monkeypatch.setattr(database, "LOCKED_RETRY_S", 0.05)
    PersistentStore(cache_dir).put(THIS_MACHINE, "key", SUPPORTED, ProbeDepth.FAST)
    # Another process writing holds the directory's shared flock: a repair, which needs it alone, waits
    # out its patience and gives up.
    held = os.open(cache_dir, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)
    try:
        code, out, err = run(capsys, "cache", "repair")
    finally:
        os.close(held)
    assert code == 1 and out == ""
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith(f"error: cache repair: decision cache {cache_dir}")
