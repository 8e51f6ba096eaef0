"""The compiled lean path's build on first use (runtime/native/autobuild.py) on a CPU machine: when it
does not start (and says why once), what a failed build leaves behind, and that `native status` and
later processes read it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.cli.main import main  # noqa: E402
from fusedattn_select.runtime import native  # noqa: E402
from fusedattn_select.runtime.native import autobuild  # noqa: E402
from fusedattn_select.runtime.run_settings import run_settings  # noqa: E402


def _module(native_dir):
    return native_dir / native.module_name() / f"{native.module_name()}.so"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU machine's answer")
def test_without_a_gpu_the_first_lookup_says_once_why_no_build_starts(native_dir, caplog):
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    assert run_settings.get().native == "auto"
    assert native.load() is None and native.load() is None
    native.background().start(_module(native_dir), native.include_dirs, lambda: None)  # a second start: nothing
    native.background().thread.join(30)  # the check runs on the build's thread, not the caller's
    said = [r.getMessage() for r in caplog.records if "not built" in r.getMessage()]
    assert said == ["fusedattn_select: compiled lean path not built (no CUDA device); calls run the Python lean path"]
    assert native.background().started and not native.background().thread.is_alive() and native.generation() == 0


def test_start_returns_at_once_and_checks_on_the_build_thread(native_dir, monkeypatch):
    """Whether a build can start imports torch's C++ extension tools: never on the caller's call."""
    gate, checked_on = threading.Event(), []

    def slow_check(module, include_dirs):
        checked_on.append(threading.current_thread().name)
        gate.wait(10)
        return "checked"

    monkeypatch.setattr(autobuild, "cannot_start", slow_check)
    build = autobuild.BackgroundBuild()
    started = time.monotonic()
    build.start(_module(native_dir), native.include_dirs, lambda: None)
    assert time.monotonic() - started < 5 and build.thread.is_alive()
    assert not build.building  # checking is not building (native status says "building": false)
    gate.set()
    build.thread.join(10)
    assert checked_on == ["fusedattn-select-native-build"] and build.generation == 0


def test_a_check_that_raises_is_said_once_and_builds_nothing(native_dir, monkeypatch, caplog):
    """An import the check needs failing (torch's C++ tools without setuptools) ends the build thread
    with one log line naming it, not a thread traceback; calls stay on the Python path."""
    caplog.set_level(logging.INFO, logger="fusedattn_select")

    def broken_check(module, include_dirs):
        raise ModuleNotFoundError("No module named 'setuptools'")

    monkeypatch.setattr(autobuild, "cannot_start", broken_check)
    build = autobuild.BackgroundBuild()
    build.start(_module(native_dir), native.include_dirs, lambda: None)
    build.thread.join(10)
    said = [r.getMessage() for r in caplog.records if "not built" in r.getMessage()]
    assert said == ["fusedattn_select: compiled lean path not built (ModuleNotFoundError: No module named "
                    "'setuptools'); calls run the Python lean path"]
    assert not build.building and build.generation == 0


@pytest.mark.parametrize("value", ["1", "0"])
def test_only_auto_builds(native_dir, monkeypatch, value):
    monkeypatch.setenv(native.ENV_VAR, value)
    assert native.load() is None
    assert not native.background().started


def test_a_remembered_failure_stops_later_builds_and_status_names_it(native_dir):
    module = _module(native_dir)
    assert autobuild.earlier_failure(module) == ""
    autobuild.remember_failure(module, "compiling lean.cpp failed: boom\nlast line")
    assert autobuild.earlier_failure(module) == "compiling lean.cpp failed: boom\nlast line"
    why = autobuild.cannot_start(module, native.include_dirs)
    if torch.cuda.is_available():
        assert why.startswith("an earlier build failed (last line)") and "native build" in why
    info = native.status()
    assert not info["built"] and info["problem"].startswith("an earlier build failed: compiling lean.cpp failed")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the build fails only where it cannot run")
def test_a_failed_background_build_is_logged_once_remembered_and_loads_nothing(native_dir, caplog):
    """The real child (`fusedattn-select native build`) fails here: no CUDA toolkit or headers."""
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    module = _module(native_dir)
    built = []
    native.background()._build(module, lambda: built.append(True), "0", time.monotonic())
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "could not be built in the background (exit code 1: error: native build:" in \
        warned[0].getMessage()
    assert built == [] and native.generation() == 0 and not module.exists()
    assert autobuild.earlier_failure(module)  # written by the child's build()
    log_text = (native_dir / f"{native.module_name()}.log").read_text()
    assert "error: native build:" in log_text
    assert oct((native_dir / f"{native.module_name()}.log").stat().st_mode & 0o777) == "0o600"


def test_native_status_json_reports_mode_and_building(native_dir, capsys, monkeypatch):
    monkeypatch.setenv(native.ENV_VAR, "1")
    assert main(["native", "status", "--json"]) == 1
    info = json.loads(capsys.readouterr().out)
    assert info["mode"] == "1" and info["enabled"] is True and info["building"] is False and not info["built"]


HOLDER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
what = sys.stdin.readline().strip()  # then write the module, or a failure, and let go of the lock
os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
with open(sys.argv[2] if what == "built" else sys.argv[3], "w") as out:
    out.write("compiling lean.cpp failed: boom" if what == "failed" else "")
"""


def _hold_the_lock(module):
    module.parent.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(autobuild.lock_path(module)), str(module),
                               str(autobuild.failed_marker(module))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


@pytest.mark.parametrize("outcome", ["built", "failed"])
def test_a_process_that_finds_another_building_waits_for_it_and_starts_no_build(native_dir, monkeypatch, caplog,
                                                                               outcome):
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    monkeypatch.setattr(autobuild, "POLL_S", 0.02)
    module = _module(native_dir)
    assert not autobuild.building_elsewhere(module)  # no lock file yet
    holder = _hold_the_lock(module)
    assert autobuild.building_elsewhere(module)
    built = []
    waiter = threading.Thread(target=native.background()._wait_or_build, args=(module, lambda: built.append(True), "0"))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and built == []  # waiting on the other build
    holder.communicate(outcome + "\n", timeout=30)
    waiter.join(30)
    assert not waiter.is_alive() and not autobuild.building_elsewhere(module)
    said = [r.getMessage() for r in caplog.records]
    assert not any("building the compiled lean path in the background" in m for m in said)  # no child of its own
    assert sum("another process is building" in m for m in said) == 1
    if outcome == "built":
        assert built == [True] and native.generation() == 1
    else:
        assert built == [] and native.generation() == 0
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
            "fusedattn_select: the compiled lean path could not be built (compiling lean.cpp failed: boom); calls "
            "run the Python lean path"]


@pytest.mark.parametrize("visible, index, expected", [("", 3, "3"), ("4,5,6", 1, "5"), (" 2 , 7", 1, "7")])
def test_the_build_is_tested_on_the_device_this_process_uses(monkeypatch, visible, index, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert autobuild.visible_device(index) == expected
