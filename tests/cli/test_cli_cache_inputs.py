"""Cache commands take what users type and say what really happened: `cache import` counts only the rows
the store still holds once the import's own writes have evicted what the size bound does not hold,
`cache export -` writes the export to stdout, `--fingerprint` takes a key in either case, and
`cache info` reports a cache no write can use (what `cache clear` then says) as degraded.

Every store is a real SQLite file in the test's private directory (mode 700). Tests run as root
here: where root's writes pass permission bits, the unwritable file is an immutable one (chattr +i).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fusedattn_select import cli
from fusedattn_select.store import (
    CACHE_DIR_ENV, DATABASE_NAME, MAX_BYTES_ENV, MemoryStore, PersistentStore, open_default_store,
)
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, ProbeDepth, Verdict

FINGERPRINT = Fingerprint("cuda", "Test GPU H100", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")
SUPPORTED = (Verdict(Backend.F16, Phase.FORWARD, Outcome.SUPPORTED, "check_support", "", depth=ProbeDepth.FAST),)
PLAN = b"p" * 100
RUNNING_AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def private(tmp_path):
    """The test's own directory, mode 700."""
    os.chmod(tmp_path, 0o700)
    return tmp_path


@pytest.fixture
def export_file(private):
    """An export holding one decision and one 100-byte plan, together over 200 bytes of payload."""
    store = PersistentStore(private / "source")
    assert store.put(FINGERPRINT, "key-1", SUPPORTED, ProbeDepth.FAST)
    assert store.put_plan(FINGERPRINT, "plan-1", PLAN)
    assert store.info()["bytes"] > 200  # the bound below cannot hold both
    path = private / "export.json"
    store.export(path)
    return path


def cache_info(capsys):
    code, out, _ = run(capsys, "cache", "info", "--json")
    return code, json.loads(out)


# ----- import counts what the store holds after its own evictions --------------------------------
def test_import_that_evicts_its_own_rows_counts_only_what_is_kept_and_exits_1(capsys, monkeypatch, export_file):
    monkeypatch.setenv(MAX_BYTES_ENV, "200")
    code, out, err = run(capsys, "cache", "import", str(export_file), "--fingerprint", "all")
    report = json.loads(out)
    assert code == 1
    assert (report["verdicts"], report["plans"], report["imported"]) == (0, 1, 1)  # plans are written last
    [skipped] = report["skipped"]
    assert skipped["row"].startswith("decision ") and "key-1" in skipped["row"]
    assert "not kept" in skipped["reason"] and MAX_BYTES_ENV in skipped["reason"] and "200 bytes" in skipped["reason"]
    assert f"cache import: skipped 1 of 2 rows of {export_file}:" in err and MAX_BYTES_ENV in err
    _, info = cache_info(capsys)
    assert (info["entries"], info["plans"]) == (report["verdicts"], report["plans"])


def test_import_within_the_bound_counts_every_row_and_exits_0(capsys, export_file):
    code, out, _ = run(capsys, "cache", "import", str(export_file), "--fingerprint", "all")
    report = json.loads(out)
    assert code == 0 and (report["verdicts"], report["plans"], report["skipped"]) == (1, 1, [])
    _, info = cache_info(capsys)
    assert (info["entries"], info["plans"]) == (1, 1)


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_import_report_of_either_store_matches_its_contents(private, export_file, kind):
    store = PersistentStore(private / "target", max_bytes=200) if kind == "sqlite" else MemoryStore(200)
    report = store.import_(export_file)
    info = store.info()
    assert (report.verdicts, report.plans) == (info["entries"], info["plans"]) == (0, 1)
    assert [row for row, _ in report.skipped] == ["decision " + FINGERPRINT.key()[:12] + "/key-1"]


# ----- export to stdout ------------------------------------------------------------------------
def test_export_to_dash_writes_the_export_to_stdout_and_nothing_else(capsys, monkeypatch, private, export_file):
    assert run(capsys, "cache", "import", str(export_file), "--fingerprint", "all")[0] == 0
    monkeypatch.chdir(private)
    code, out, err = run(capsys, "cache", "export", "-")
    assert code == 0 and not (private / "-").exists()
    document = json.loads(out)  # stdout holds the export and only the export
    assert document["format"] == "fusedattn-select-cache" and len(document["verdicts"]) == 1
    assert err.strip() == "cache export: wrote 1 decisions, 1 plans and 0 runner choices to stdout"
    piped = private / "piped.json"
    piped.write_text(out)
    monkeypatch.setenv(CACHE_DIR_ENV, str(private / "second"))
    code, out, _ = run(capsys, "cache", "import", str(piped), "--fingerprint", "all")
    assert code == 0 and json.loads(out)["imported"] == 2


def test_export_to_dot_slash_dash_writes_a_file_named_dash(capsys, monkeypatch, private):
    monkeypatch.chdir(private)
    code, out, _ = run(capsys, "cache", "export", "./-")
    assert code == 0 and json.loads(out)["path"] == "-"
    assert json.loads((private / "-").read_text())["format"] == "fusedattn-select-cache"


def test_export_to_dash_from_an_unusable_cache_prints_nothing_on_stdout(capsys, monkeypatch, private):
    (private / "a-file").write_text("")
    monkeypatch.setenv(CACHE_DIR_ENV, str(private / "a-file" / "cache"))
    code, out, err = run(capsys, "cache", "export", "-")
    assert code == 1 and out == "" and err.startswith("error: cache export: the persistent cache cannot be used")


# ----- fingerprint keys ------------------------------------------------------------------------
def test_export_to_dash_with_stdout_closed_is_one_error_line_not_a_traceback(private):
    _stored_once(private)
    env = dict(os.environ, **{CACHE_DIR_ENV: str(private / "cache")})
    done = subprocess.run(["bash", "-c", f"{shlex.quote(sys.executable)} -m fusedattn_select.cli cache export - >&-"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stderr == "error: cache export: FILE='-': stdout is closed; name a file\n", \
        done.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device every write to fails)")
def test_export_to_dash_where_stdout_cannot_be_written_is_one_error_line(private):
    _stored_once(private)
    env = dict(os.environ, **{CACHE_DIR_ENV: str(private / "cache")})
    done = subprocess.run(["bash", "-c", f"{shlex.quote(sys.executable)} -m fusedattn_select.cli cache export - "
                                         ">/dev/full"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: cache export -: stdout cannot be written ("), done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_fingerprint_key_in_upper_case_imports_that_fingerprints_rows(capsys, export_file):
    code, out, _ = run(capsys, "cache", "import", str(export_file), "--fingerprint", FINGERPRINT.key().upper())
    report = json.loads(out)
    assert code == 0 and report["fingerprint"] == FINGERPRINT.key() and report["imported"] == 2


@pytest.mark.parametrize("key", ["0" * 31, "g" * 32, "every"])
def test_a_fingerprint_that_is_no_key_is_one_error_line_naming_the_field_and_the_values(capsys, export_file, key):
    code, out, err = run(capsys, "cache", "import", str(export_file), "--fingerprint", key)
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and out == "" and "Traceback" not in err
    assert "argument --fingerprint" in line and "32 hex digits" in line and "'all'" in line


# ----- info tells a cache no write can use ------------------------------------------------------
def _where_nothing_can_be_created(private: Path) -> list[str]:
    (private / "a-file").write_text("")
    places = [str(private / "a-file" / "cache")]
    if Path("/proc/self").is_dir():  # root's access(2) allows /proc, where mkdir fails
        places.append("/proc/fusedattn-select-test/cache")
    return places


def test_info_and_clear_give_the_same_reason_where_no_cache_can_be_created(capsys, monkeypatch, private):
    for place in _where_nothing_can_be_created(private):
        monkeypatch.setenv(CACHE_DIR_ENV, place)
        code, info = cache_info(capsys)
        assert code == 1 and not info["persistent"] and info["degraded"].startswith(f"cache directory {place} ")
        code, _, err = run(capsys, "cache", "clear")
        assert code == 1 and f"the persistent cache cannot be used ({info['degraded']})" in err
        assert not Path(place).exists()


def test_info_creates_no_missing_directory_that_could_be_created(capsys, monkeypatch, private):
    target = private / "new" / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(target))
    code, info = cache_info(capsys)
    assert code == 0 and info["persistent"] and info["degraded"] is None
    assert not (private / "new").exists()


def _stored_once(private: Path) -> Path:
    store = PersistentStore(private / "cache")
    assert store.put(FINGERPRINT, "key-1", SUPPORTED, ProbeDepth.FAST)
    store.close()
    return store.path


def _assert_unwritable_file_is_reported(capsys, path: Path) -> None:
    # Its rows are still read (by the library, info and export); what would write is refused, saying why.
    code, info = cache_info(capsys)
    assert code == 1 and info["persistent"] and info["entries"] == 1 and info["degraded"] is None
    assert info["unwritable"] == f"decision cache {path} is not writable by this user"
    code, out, _ = run(capsys, "cache", "info")
    assert f"warning: {info['unwritable']}: its rows are read, and every save fails" in out
    code, _, err = run(capsys, "cache", "clear")
    assert code == 1 and info["unwritable"] in err and "nothing was done" in err
    exported = path.parent.parent / "out.json"
    code, out, _ = run(capsys, "cache", "export", str(exported))
    assert code == 0 and json.loads(out)["verdicts"] == 1, out
    assert open_default_store().get(FINGERPRINT, "key-1") is not None
    # --memory-ok keeps an import in memory only where no file is in use; here the rows would go to the
    # file, so the import is refused as without it (not reported as "imported into memory" with 0 rows).
    code, out, err = run(capsys, "cache", "import", str(exported), "--fingerprint", FINGERPRINT.key(), "--memory-ok")
    assert code == 1 and out == "" and info["unwritable"] in err, err
    assert "--memory-ok does not help" in err and "nothing was done" in err and "memory only" not in err


@pytest.mark.skipif(RUNNING_AS_ROOT, reason="root writes a mode-400 file (access(2) and SQLite both let it): "
                    "the immutable-file test covers root")
def test_info_reports_a_read_only_database_file(capsys, private):
    path = _stored_once(private)
    os.chmod(path, 0o400)
    _assert_unwritable_file_is_reported(capsys, path)


@pytest.mark.skipif(not RUNNING_AS_ROOT or not shutil.which("chattr"), reason="chattr +i needs root and chattr")
def test_info_reports_an_immutable_database_file(capsys, private):
    path = _stored_once(private)
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip(f"this file system takes no immutable attribute ({path})")
    try:
        with pytest.raises(PermissionError):
            open(path, "r+b").close()  # the premise: not even root can write it
        _assert_unwritable_file_is_reported(capsys, path)
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    assert run(capsys, "cache", "clear")[0] == 0  # writable again: the cache is usable


def test_info_of_a_writable_database_is_persistent(capsys, private):
    path = _stored_once(private)
    code, info = cache_info(capsys)
    assert code == 0 and info["persistent"] and info["path"] == str(path) and info["entries"] == 1
    assert path.name == DATABASE_NAME
