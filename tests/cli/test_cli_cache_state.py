"""Cache commands say what happened: a write that would not outlive the command exits 1 with the
reason (unless --memory-ok), skipped import rows exit 1 and are listed, `info` and `cache info`
flag a degraded or damaged store and disabled plans, and an invalid FUSEDATTN_SELECT_CACHE is bad
input for a command.

The degraded store is a cache directory that cannot be created: under a directory with mode 500,
or, when running as root (which ignores permission bits), under a regular file.
"""

from __future__ import annotations

import json
import os
import sqlite3

import cache_dirs
import pytest

from fusedattn_select import cli
from fusedattn_select.probing import choice
from fusedattn_select.store import CACHE_SWITCH_ENV, DATABASE_NAME, PersistentStore
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, ProbeDepth, Verdict

FINGERPRINT = Fingerprint("cuda", "Test GPU H100", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")
SUPPORTED = (Verdict(Backend.F16, Phase.FORWARD, Outcome.SUPPORTED, "check_support", "", depth=ProbeDepth.FAST),)
SUPPORTED_SUITE = """
name: small
defaults: {batch_size: 2, num_heads_q: 16, num_heads_kv: 4, seqlen_q: 1024, seqlen_kv: 1024, head_dim_qk: 128}
configs:
  - {name: infer, is_training: false}
"""


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def unusable_cache_dir(tmp_path, monkeypatch):
    """FUSEDATTN_SELECT_CACHE_DIR pointing where no cache directory can be created."""
    with cache_dirs.unusable_cache_dir(tmp_path, monkeypatch) as target:
        yield target


@pytest.fixture
def export_file(tmp_path, monkeypatch):
    """An export of a persistent store holding one decision and one plan."""
    store = PersistentStore(tmp_path / "source-cache")
    verdicts = SUPPORTED
    assert store.put(FINGERPRINT, "key-1", verdicts, ProbeDepth.FAST)
    assert store.put_plan(FINGERPRINT, "plan-1", b"plan bytes" * 10)
    path = tmp_path / "export.json"
    store.export(path)
    return path


# ----- a store that is not persistent ---------------------------------------------------------
def test_cache_import_into_an_unusable_cache_exits_1_with_the_reason(capsys, unusable_cache_dir, export_file):
    code, out, err = run(capsys, "cache", "import", str(export_file))
    assert code == 1 and out == ""
    assert err.startswith("error: cache import: the persistent cache cannot be used (cache directory ")
    assert str(unusable_cache_dir) in err and err.rstrip().endswith("nothing was done")
    assert len(err.strip().splitlines()) == 1


def test_cache_import_with_memory_ok_imports_into_memory_and_says_so(capsys, unusable_cache_dir, export_file):
    code, out, err = run(capsys, "cache", "import", "--memory-ok", "--fingerprint", "all", str(export_file))
    assert code == 0 and json.loads(out)["imported"] == 2
    assert "imported into this process's memory only" in err


def test_cache_clear_of_an_unusable_cache_exits_1(capsys, unusable_cache_dir):
    code, _, err = run(capsys, "cache", "clear")
    assert code == 1 and err.startswith("error: cache clear: the persistent cache cannot be used")


def test_cache_info_flags_a_degraded_store_and_exits_1(capsys, unusable_cache_dir):
    code, out, _ = run(capsys, "cache", "info", "--json")
    info = json.loads(out)
    assert code == 1
    assert (info["kind"], info["persistent"]) == ("memory", False)
    assert str(unusable_cache_dir) in info["degraded"] and "cannot be created" in info["degraded"]
    code, out, _ = run(capsys, "cache", "info")
    assert code == 1 and "warning: the persistent cache cannot be used: cache directory" in out
    assert not unusable_cache_dir.exists()


def test_info_flags_a_degraded_store(capsys, unusable_cache_dir):
    code, out, _ = run(capsys, "info", "--json")
    facts = json.loads(out)
    assert code == 0  # info reports; it never fails
    assert facts["cache_store"].startswith("DEGRADED: in memory only, lost at exit: cache directory ")
    assert facts["cache_plans"] == "in memory only, lost at exit"
    assert "cache store                DEGRADED: in memory only" in run(capsys, "info")[1]


def test_cache_off_is_reported_not_flagged_but_writes_still_need_memory_ok(capsys, monkeypatch, export_file):
    monkeypatch.setenv(CACHE_SWITCH_ENV, "off")
    code, out, _ = run(capsys, "cache", "info", "--json")
    info = json.loads(out)
    assert code == 0 and info["switched_off"] == "FUSEDATTN_SELECT_CACHE=off" and info["degraded"] is None
    code, _, err = run(capsys, "cache", "import", str(export_file))
    assert code == 1 and "the persistent cache is turned off (FUSEDATTN_SELECT_CACHE=off)" in err


def _live_test_engine(monkeypatch, recording_engine, tmp_path):
    monkeypatch.setattr(choice, "SNAPSHOT_DIR", tmp_path / "no-bundled")
    monkeypatch.setattr(choice, "live_engine", lambda: (recording_engine, ""))
    suite = tmp_path / "small.yaml"
    suite.write_text(SUPPORTED_SUITE)
    return suite


def test_live_warmup_into_an_unusable_cache_exits_1_before_probing(capsys, monkeypatch, tmp_path,
                                                                   unusable_cache_dir, recording_engine):
    suite = _live_test_engine(monkeypatch, recording_engine, tmp_path)
    code, out, err = run(capsys, "warmup", str(suite), "--depth", "fast")
    assert code == 1 and out == "" and recording_engine.calls == 0
    assert err.startswith("error: warmup would keep its decisions and plans in memory, lost when it exits: "
                          "the persistent cache cannot be used (cache directory ")
    assert "pass --memory-ok" in err


def test_live_warmup_with_memory_ok_warms_this_process(capsys, monkeypatch, tmp_path, unusable_cache_dir,
                                                       recording_engine):
    suite = _live_test_engine(monkeypatch, recording_engine, tmp_path)
    code, out, err = run(capsys, "warmup", str(suite), "--depth", "fast", "--memory-ok")
    assert code == 0, err
    assert "1 accepted" in out and recording_engine.calls > 0


def test_live_warmup_into_a_persistent_cache_needs_no_flag(capsys, monkeypatch, tmp_path, recording_engine):
    suite = _live_test_engine(monkeypatch, recording_engine, tmp_path)
    code, _, err = run(capsys, "warmup", str(suite), "--depth", "fast")
    assert code == 0, err
    assert PersistentStore(tmp_path / "cache", read_only=True).info()["entries"] >= 1


# ----- import that skipped rows -----------------------------------------------------------------
def test_cache_import_that_skips_rows_exits_1_and_lists_them(capsys, export_file):
    document = json.loads(export_file.read_text())
    document["plans"][0]["blob"] = document["plans"][0]["blob"][:-8]  # truncated plan
    document["verdicts"][0]["depth"] = "deep"  # tampered decision
    export_file.write_text(json.dumps(document))
    code, out, err = run(capsys, "cache", "import", "--fingerprint", "all", str(export_file))
    report = json.loads(out)
    assert code == 1 and report["imported"] == 0 and len(report["skipped"]) == 2
    lines = err.strip().splitlines()
    assert lines[0] == f"cache import: skipped 2 of 2 rows of {export_file}:"
    assert lines[1].startswith("  decision ") and "deep" in lines[1]
    assert lines[2].startswith("  plan ") and "plan-1" in lines[2]


# ----- plans refused ----------------------------------------------------------------------------
def test_cache_info_and_info_flag_plans_disabled_in_a_group_writable_directory(capsys, tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir()
    os.chmod(directory, 0o770)
    code, out, _ = run(capsys, "cache", "info", "--json")
    info = json.loads(out)
    assert code == 0 and info["persistent"] and info["plans_enabled"] is False
    assert "writable by group or others (mode 770)" in info["plans_refused"]
    assert "warning: serialized plans are disabled: " in run(capsys, "cache", "info")[1]
    facts = json.loads(run(capsys, "info", "--json")[1])
    assert facts["cache_plans"].startswith("DISABLED: ") and "mode 770" in facts["cache_plans"]


def test_cache_info_names_a_write_ahead_log_writable_by_others(capsys, tmp_path):
    store = PersistentStore(tmp_path / "cache")  # open: its -wal stays, as a process killed with it open leaves it
    assert store.put_plan(FINGERPRINT, "plan-1", b"plan bytes")
    log_file = store.path.with_name(DATABASE_NAME + "-wal")
    os.chmod(log_file, 0o666)
    code, out, _ = run(capsys, "cache", "info", "--json")
    info = json.loads(out)
    assert code == 0 and info["plans_enabled"] is False
    assert info["plans_refused"] == f"{log_file} is writable by group or others (mode 666)"
    assert f"warning: serialized plans are disabled: {log_file} is writable" in run(capsys, "cache", "info")[1]


# ----- damaged database -------------------------------------------------------------------------
def _damaged_store(directory):
    store = PersistentStore(directory)
    verdicts = SUPPORTED
    for index in range(200):
        store.put(FINGERPRINT, f"key-{index}", verdicts, ProbeDepth.FAST)
    store.close()
    conn = sqlite3.connect(store.path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'verdicts_by_last_use'").fetchone()[0]
    conn.close()
    data = bytearray(store.path.read_bytes())
    data[(root - 1) * page_size:root * page_size] = b"\x55" * page_size
    store.path.write_bytes(bytes(data))
    return store.path


def test_cache_info_reports_a_damaged_database_and_moves_nothing(capsys, tmp_path):
    path = _damaged_store(tmp_path / "cache")
    damaged = path.read_bytes()
    code, out, _ = run(capsys, "cache", "info", "--json")
    info = json.loads(out)
    assert code == 1 and info["entries"] == 200 and info["damage"]
    code, out, _ = run(capsys, "info", "--json")
    assert json.loads(out)["cache_store"].startswith(f"DAMAGED: {path} (")
    names = {p.name for p in path.parent.iterdir()}
    assert names <= {DATABASE_NAME, DATABASE_NAME + "-wal", DATABASE_NAME + "-shm"}  # nothing set aside, no lock file
    assert path.read_bytes() == damaged


def test_cache_repair_beside_an_incomplete_salvaged_copy_repairs_the_file_and_exits_0(capsys, tmp_path):
    path = _damaged_store(tmp_path / "cache")
    path.with_name(DATABASE_NAME + ".salvaged").write_bytes(b"not a database")
    code, out, _ = run(capsys, "cache", "repair")
    assert code == 0 and "an incomplete salvaged copy" in out and f"{path} was damaged (" in out
    code, out, _ = run(capsys, "cache", "info", "--json")
    assert code == 0 and json.loads(out)["damage"] is None and json.loads(out)["entries"] == 200


# ----- the cache switch -------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [("cache", "info"), ("cache", "import", "x.json"), ("warmup", "x.yaml")])
def test_an_invalid_cache_switch_is_bad_input_for_commands(capsys, monkeypatch, argv):
    monkeypatch.setenv(CACHE_SWITCH_ENV, "maybe")
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.strip() == ("error: FUSEDATTN_SELECT_CACHE='maybe': must be one of on, 1, true, yes "
                           "(persistent cache) or off, 0, false, no (memory only)")


def test_info_flags_an_invalid_cache_switch(capsys, monkeypatch):
    monkeypatch.setenv(CACHE_SWITCH_ENV, "maybe")
    code, out, _ = run(capsys, "info", "--json")
    assert code == 0
    assert json.loads(out)["cache"].startswith("INVALID: FUSEDATTN_SELECT_CACHE='maybe': must be one of on, 1")


@pytest.mark.parametrize("command", [["why", "--set", "batch_size=1", "--set", "num_heads_q=1", "--set",
                                      "num_heads_kv=1", "--set", "seqlen_q=8", "--set", "seqlen_kv=8",
                                      "--set", "head_dim_qk=64"], ["matrix", "probes/hopper-suite-sample.yaml"]])
def test_every_command_but_info_refuses_an_invalid_cache_switch(monkeypatch, capsys, command):
    from fusedattn_select.cli import main

    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE", "maybe")
    assert main(command) == 2
    assert "FUSEDATTN_SELECT_CACHE='maybe'" in capsys.readouterr().err
