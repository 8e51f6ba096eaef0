"""`snapshot record` refuses what it cannot do before it probes anything: an --output path that cannot
take the snapshot (a missing /proc folder, a directory, a file as parent folder) and --no-ladder with a
ladder option it would ignore; a write that still fails (a full disk) is one `error:` line, no file."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusedattn_select import cli
from fusedattn_select.cli import engines
from fusedattn_select.errors import ConfigError, SnapshotError
from fusedattn_select.selection import recorder
from fusedattn_select.selection.recorder import check_output, write_snapshot

ROOT = Path(__file__).resolve().parents[2]
GPT2 = str(ROOT / "configs" / "gpt2.yaml")
LADDER_CONFLICTS = [
    (["--ladder-max-batch", "8"], "error: --ladder-max-batch=8: not allowed with --no-ladder"),
    (["--ladder-depth", "full"], "error: --ladder-depth='full': not allowed with --no-ladder"),
    (["--ladder-max-seqlen", "64"], "error: --ladder-max-seqlen=64: not allowed with --no-ladder"),
]


def child_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEDATTN_SELECT_")}
    env["FUSEDATTN_SELECT_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def record(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """`fusedattn-select snapshot record configs/gpt2.yaml ARGV...` in a child process."""
    return subprocess.run([sys.executable, "-m", "fusedattn_select.cli", "snapshot", "record", GPT2, *argv],
                          cwd=ROOT, env=child_env(tmp_path), capture_output=True, text=True, timeout=120)


def bad_outputs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """Output paths that cannot take a snapshot, each with the error line's start and a piece of its reason."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    return {
        "proc": ("/proc/x/s.json", "no file can be created in /proc"),
        "directory": (str(tmp_path), "is a directory"),
        "file as folder": (str(a_file / "s.json"), f"{a_file} is not a directory"),
    }


def must_not_start():
    raise AssertionError("the live engine was made before the bad input was refused")


@pytest.mark.parametrize("case", ["proc", "directory", "file as folder"])
def test_an_unusable_output_is_one_error_line_naming_output_and_exit_2(tmp_path, case):
    path, reason = bad_outputs(tmp_path)[case]
    proc = record(tmp_path, "-o", path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --output={path!r}: "), proc.stderr
    assert reason in lines[0]
    assert proc.stdout == ""


@pytest.mark.parametrize("options,message", LADDER_CONFLICTS)
def test_no_ladder_with_a_ladder_option_is_one_error_line_naming_both_and_exit_2(tmp_path, options, message):
    out = tmp_path / "s.json"
    proc = record(tmp_path, "-o", str(out), "--no-ladder", *options)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [f"{message}, which records no ladder; drop --no-ladder or {options[0]}"]
    assert not out.exists()


def test_every_ladder_option_given_with_no_ladder_is_named(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(engines, "live_engine", must_not_start)
    code = cli.main(["snapshot", "record", GPT2, "-o", str(tmp_path / "s.json"), "--no-ladder",
                     "--ladder-max-batch", "8", "--ladder-depth", "fast"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.endswith("drop --no-ladder or --ladder-max-batch and --ladder-depth\n"), err


@pytest.mark.parametrize("case", ["proc", "directory", "file as folder"])
def test_the_output_is_refused_before_the_live_engine_is_made(capsys, monkeypatch, tmp_path, case):
    monkeypatch.setattr(engines, "live_engine", must_not_start)
    path, _ = bad_outputs(tmp_path)[case]
    assert cli.main(["snapshot", "record", GPT2, "-o", path]) == 2
    assert capsys.readouterr().err.startswith(f"error: --output={path!r}: ")


@pytest.mark.parametrize("options,message", LADDER_CONFLICTS)
def test_the_ladder_conflict_is_refused_before_the_live_engine_is_made(capsys, monkeypatch, tmp_path, options,
                                                                        message):
    monkeypatch.setattr(engines, "live_engine", must_not_start)
    assert cli.main(["snapshot", "record", GPT2, "-o", str(tmp_path / "s.json"), "--no-ladder", *options]) == 2
    assert capsys.readouterr().err.startswith(message)


def test_ladder_options_without_no_ladder_are_recorded(capsys, monkeypatch, suite_file, tmp_path, recording_engine):
    monkeypatch.setattr(engines, "live_engine", lambda: (recording_engine, ""))
    out = tmp_path / "missing" / "folder" / "s.json"  # missing folders pass the check and are created
    code = cli.main(["snapshot", "record", str(suite_file), "-o", str(out), "--ladder-max-batch", "8",
                     "--ladder-max-seqlen", "256", "--ladder-depth", "fast"])
    assert code == 3, capsys.readouterr().err  # the suite's out-of-memory entry: recorded as failed
    assert json.loads(out.read_text())["ladder"] == {"max_batch": 8, "max_seqlen": 256, "depth": "fast"}
    default = tmp_path / "default.json"
    assert cli.main(["snapshot", "record", str(suite_file), "-o", str(default)]) == 3
    assert json.loads(default.read_text())["ladder"] == {"max_batch": 64, "max_seqlen": 16384}
    assert cli.main(["snapshot", "record", str(suite_file), "-o", str(default), "--no-ladder"]) == 3
    assert "ladder" not in json.loads(default.read_text())


def no_space(fd: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_write_that_fails_after_recording_is_one_error_line_and_no_file(capsys, monkeypatch, suite_file, tmp_path,
                                                                           recording_engine):
    monkeypatch.setattr(engines, "live_engine", lambda: (recording_engine, ""))
    monkeypatch.setattr(recorder.os, "fsync", no_space)  # the disk fills up after the check passed
    out = tmp_path / "s.json"
    code = cli.main(["snapshot", "record", str(suite_file), "-o", str(out), "--no-ladder"])
    captured = capsys.readouterr()
    assert code == 1  # the recording ran and could not be saved: not done, not bad input
    assert captured.err == (f"error: --output={str(out)!r}: cannot be written (No space left on device); "
                            "no snapshot was written\n")
    assert list(tmp_path.iterdir()) == [suite_file]  # neither the snapshot nor its temporary file


def test_write_snapshot_keeps_the_old_file_whole_when_the_disk_is_full(monkeypatch, tmp_path):
    out = tmp_path / "s.json"
    out.write_text('{"old": true}\n')
    monkeypatch.setattr(recorder.os, "fsync", no_space)
    with pytest.raises(SnapshotError, match=r"^snap=.*s\.json': cannot be written \(No space left on device\)"):
        write_snapshot({"new": True}, out, "snap")
    assert out.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


@pytest.mark.parametrize("case", ["directory", "file as folder"])
def test_write_snapshot_into_an_unwritable_target_raises_snapshot_error(tmp_path, case):
    # What a race leaves for the write: the target turned into a folder, or its folder into a file.
    target = tmp_path / "target"
    if case == "directory":
        target.mkdir()
        path = target
    else:
        target.write_text("a file\n")
        path = target / "s.json"
    with pytest.raises(SnapshotError, match=f"^--output={str(path)!r}: cannot be written "):
        write_snapshot({"entries": []}, path, "--output")
    assert [p.name for p in tmp_path.iterdir()] == ["target"]  # no temporary file left beside it


def test_check_output_accepts_a_new_file_and_leaves_nothing_behind(tmp_path):
    assert check_output(tmp_path / "new" / "s.json") == tmp_path / "new" / "s.json"
    assert list(tmp_path.iterdir()) == []  # neither the missing folder nor the trial file is made
    # A name the file system takes, but not with write_snapshot's temporary prefix and suffix.
    too_long = r"^output='.*: no file can be created in .* \(File name too long\); the snapshot needs a shorter"
    with pytest.raises(ConfigError, match=too_long):
        check_output(tmp_path / ("x" * 250))


# ----- the ladder's reach: at most 2**30, and the summary counts groups and rungs ------------------------------
@pytest.mark.parametrize("option", ["--ladder-max-seqlen", "--ladder-max-batch"])
@pytest.mark.parametrize("value", ["99999999999", str(2**30 + 1)])
def test_a_ladder_reach_past_2_30_is_refused_naming_the_flag_and_the_limit(capsys, monkeypatch, tmp_path, option,
                                                                           value):
    monkeypatch.setattr(engines, "live_engine", must_not_start)
    assert cli.main(["snapshot", "record", GPT2, "-o", str(tmp_path / "s.json"), option, value]) == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert f"argument {option}: '{value}': must be at most {2**30} (2**30" in line and "Traceback" not in err
    assert not (tmp_path / "s.json").exists()


def test_a_ladder_reach_of_2_30_is_taken_and_recorded_as_asked(capsys, monkeypatch, suite_file, tmp_path,
                                                               recording_engine):
    monkeypatch.setattr(engines, "live_engine", lambda: (recording_engine, ""))
    out = tmp_path / "s.json"
    assert cli.main(["snapshot", "record", str(suite_file), "-o", str(out), "--ladder-max-batch", "1",
                     "--ladder-max-seqlen", str(2**30)]) == 3
    data = json.loads(out.read_text())
    assert data["ladder"]["max_seqlen"] == 2**30
    assert max(rung[2] for group in data["buckets"] for rung in group["rungs"]) == 2**30


def test_the_summary_counts_ladder_groups_and_rungs(capsys, monkeypatch, suite_file, tmp_path, recording_engine):
    monkeypatch.setattr(engines, "live_engine", lambda: (recording_engine, ""))
    out = tmp_path / "s.json"
    assert cli.main(["snapshot", "record", str(suite_file), "-o", str(out), "--ladder-max-batch", "4",
                     "--ladder-max-seqlen", "512"]) == 3
    summary = capsys.readouterr().out
    groups = json.loads(out.read_text())["buckets"]
    rungs = sum(len(group["rungs"]) for group in groups)
    assert len(groups) < rungs
    assert f"(and their classes' ladders: {len(groups)} groups, {rungs} rungs)" in summary
    assert "bucket rows" not in summary
