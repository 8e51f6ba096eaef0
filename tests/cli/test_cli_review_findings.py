"""What a second adversarial pass over issue 33 found: an export never replaces what is at its
target, a read-only look never deletes a log, long names and deep nesting are errors, a repair says
what it salvaged, and a run of failed writes does not wait the whole patience on every write."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "store"))
from store_samples import H100, SUPPORTED_FULL  # noqa: E402

from fusedattn_select import cli  # noqa: E402
from fusedattn_select.store import DATABASE_NAME, PersistentStore, database, sqlite  # noqa: E402
from fusedattn_select.types import ProbeDepth  # noqa: E402

LONG = "a" * 300


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cache(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(directory))
    store = PersistentStore(directory)
    for index in range(20):
        assert store.put(H100, f"key-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
    store.close()
    return directory


def test_an_export_onto_a_link_writes_where_it_leads_and_keeps_the_link(cache, tmp_path, capsys):
    real = tmp_path / "real.json"
    real.write_text("{}")
    os.chmod(real, 0o600)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    code, _, err = run(capsys, "cache", "export", str(link))
    assert code == 0, err
    assert link.is_symlink() and '"fusedattn-select-cache"' in real.read_text()
    assert stat.S_IMODE(real.stat().st_mode) == 0o600  # an existing file keeps its mode


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mknod needs root")
def test_an_export_onto_a_device_writes_into_it_and_never_replaces_it(cache, tmp_path, capsys):
    device = tmp_path / "null"
    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # another /dev/null
    code, _, err = run(capsys, "cache", "export", str(device))
    assert code == 0, err
    assert stat.S_ISCHR(device.stat().st_mode) and not list(tmp_path.glob(".null.*"))


def test_long_names_are_errors_not_tracebacks(cache, tmp_path, capsys, monkeypatch):
    code, _, err = run(capsys, "cache", "export", str(tmp_path / f"{LONG}.json"))
    assert code == 2 and "cannot be written (File name too long)" in err and "Traceback" not in err
    code, _, err = run(capsys, "why", "--hf-config", LONG)
    assert code == 2 and "cannot be read (File name too long)" in err
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(tmp_path / LONG))
    code, out, err = run(capsys, "cache", "info")
    assert code == 1 and "cannot be used (File name too long)" in out and "Traceback" not in err


@pytest.mark.parametrize("depth", [900, 5000])
def test_flow_style_nesting_too_deep_to_read_is_an_error_naming_the_file(tmp_path, capsys, depth):
    config = tmp_path / "deep.yaml"
    config.write_text("name: t\ndescription: " + "[" * depth + "]" * depth + "\nconfigs:\n  - {name: a}\n")
    code, _, err = run(capsys, "why", str(config))
    assert code == 2 and len(err) < 1000 and "Traceback" not in err and str(config) in err


def _cut_with_rows_in_the_log(tmp_path, size):
    """A store whose rows are all in its write-ahead log (never checkpointed), the main file cut to
    `size` bytes."""
    live_dir = tmp_path / "live"
    live_dir.mkdir(mode=0o700)
    live = PersistentStore(live_dir)
    for index in range(60):
        assert live.put(H100, f"key-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
    copy = tmp_path / "copy"
    copy.mkdir(mode=0o700)
    shutil.copy(live_dir / DATABASE_NAME, copy / DATABASE_NAME)
    shutil.copy(live_dir / f"{DATABASE_NAME}-wal", copy / f"{DATABASE_NAME}-wal")
    with open(copy / DATABASE_NAME, "r+b") as handle:
        handle.truncate(size)
    return copy


@pytest.mark.parametrize("size", [1, 99, 511])
def test_looking_at_a_file_cut_short_never_deletes_its_log(tmp_path, capsys, monkeypatch, size):
    copy = _cut_with_rows_in_the_log(tmp_path, size)
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(copy))
    code, out, _ = run(capsys, "cache", "info", "--json")
    assert code == 1 and '"damage": "decisions.sqlite3 is cut to' in out
    assert (copy / f"{DATABASE_NAME}-wal").stat().st_size > 0
    code, out, _ = run(capsys, "cache", "repair")
    assert code == 0 and "salvaged 1 fingerprints, 60 decisions" in out and "sound" not in out


def test_repair_of_a_file_salvaged_on_opening_says_what_was_salvaged(cache, capsys):
    (cache / f"{DATABASE_NAME}-wal").unlink(missing_ok=True)
    with open(cache / DATABASE_NAME, "r+b") as handle:
        handle.write(b"\x00" * 100)  # the header: not a database any more
    code, out, _ = run(capsys, "cache", "repair")
    assert code == 0 and "was damaged" in out and "salvaged 1 fingerprints, 20 decisions" in out


def test_a_run_of_failed_writes_waits_briefly_after_the_first(cache, monkeypatch):
    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.05)
    monkeypatch.setattr(database, "LOCKED_RETRY_S", 1.5)
    monkeypatch.setattr(sqlite, "FAILING_PATIENCE_S", 0.1)
    store = PersistentStore(cache)
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        assert not store.put(H100, "first", SUPPORTED_FULL, ProbeDepth.FULL)
        first = time.monotonic() - started
        started = time.monotonic()
        for index in range(5):
            assert not store.put(H100, f"later-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
        later = time.monotonic() - started
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert first >= 1.4 and later < 1.5
    assert store.info()["failed_writes"] == 6
    assert store.put(H100, "after", SUPPORTED_FULL, ProbeDepth.FULL)  # and the next write may wait again


def test_a_stored_row_holding_nan_is_dropped(cache):
    conn = sqlite3.connect(cache / DATABASE_NAME, isolation_level=None)
    text = conn.execute("SELECT verdicts FROM verdicts WHERE config_key = 'key-0'").fetchone()[0]
    conn.execute("UPDATE verdicts SET verdicts = ? WHERE config_key = 'key-0'", (text.replace("3.5", "NaN"),))
    conn.close()
    store = PersistentStore(cache)
    assert store.get(H100, "key-0") is None and store.get(H100, "key-1") is not None
