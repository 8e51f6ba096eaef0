"""The commit a bench records: a tree whose tracked files differ from the checkout's commit is marked."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tools.bench import environment


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    monkeypatch.setattr(environment, "ROOT", tmp_path)
    monkeypatch.delenv("FUSEDATTN_BENCH_REV", raising=False)
    return tmp_path


def test_a_clean_checkout_records_its_commit(checkout):
    assert environment._git_rev() == _git(checkout, "rev-parse", "--short", "HEAD")


def test_tracked_files_that_differ_from_the_commit_are_marked(checkout):
    (checkout / "a.txt").write_text("two\n")  # as a newer tree copied over an older .git
    (checkout / "untracked.txt").write_text("scratch\n")
    assert environment._git_rev() == _git(checkout, "rev-parse", "--short", "HEAD") + "+modified"


def test_the_named_revision_wins(checkout, monkeypatch):
    monkeypatch.setenv("FUSEDATTN_BENCH_REV", "abc1234")
    assert environment._git_rev() == "abc1234"
