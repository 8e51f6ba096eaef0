"""stdout that cannot be written (a full disk, /dev/full) is one `error: cannot write output: <reason>` line
and exit 2, for every command (a reader that closes the pipe early, `| head`, stays a quiet 141:
test_cli_hostile_input.py)."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusedattn_select import cli

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "llama-3-8b.yaml")


class FullDisk(io.StringIO):
    """A stdout every write to fails as a full disk does."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def child_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEDATTN_SELECT_")}
    env["FUSEDATTN_SELECT_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def assert_one_error_line(stderr: str) -> None:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert lines == [f"error: cannot write output: {os.strerror(errno.ENOSPC)}"], stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr


@pytest.mark.parametrize("argv", [
    ["info"], ["info", "--json"], ["native", "status"],
    ["why", CONFIG, "--target", "h100"], ["why", CONFIG, "--target", "h100", "--json"],
    ["matrix", CONFIG, "--target", "h100"], ["matrix", CONFIG, "--target", "h100", "--json"],
])
def test_a_stdout_that_cannot_be_written_is_one_error_line_and_exit_2(capsys, monkeypatch, argv):
    monkeypatch.setattr(sys, "stdout", FullDisk())
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert_one_error_line(err)


def test_stdout_is_given_back_after_a_command(capsys):
    before = sys.stdout
    assert cli.main(["info", "--json"]) == 0
    assert sys.stdout is before


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device every write to fails)")
@pytest.mark.parametrize("argv", [["info"], ["native", "status", "--json"]])
def test_a_command_writing_to_dev_full_exits_2_with_one_error_line(tmp_path, argv):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "fusedattn_select.cli", *argv], cwd=ROOT, stdout=full,
                              stderr=subprocess.PIPE, text=True, env=child_env(tmp_path), timeout=120)
    assert done.returncode == 2, done.stderr
    assert_one_error_line(done.stderr)

