"""`native build`'s lifecycle on CPU with real files, permissions and processes: a build is refused
before compiling where others could write, a module is tested in staging/ and renamed into place (no
process can load an untested or half-written one), the directories it makes are private, and a rank
queued behind a failed build does not compile again. The compiler is a test double (gcc building a
small C module that passes check.self_test's CPU part); everything after it is the real pipeline."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.cli.main import main  # noqa: E402
from fusedattn_select.runtime import native  # noqa: E402
from fusedattn_select.runtime.native import autobuild  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")

# What check.self_test() asks of a module on a machine without a GPU.
MODULE_SOURCE = """
#include <Python.h>
static PyObject *kinds(PyObject *self, PyObject *arg) { Py_RETURN_NONE; }
static PyObject *call(PyObject *self, PyObject *args) { Py_RETURN_NONE; }
static PyObject *stream_check(PyObject *self, PyObject *arg) {
    return PyUnicode_FromFormat("eng%ld", PyLong_AsLong(arg));
}
static PyMethodDef methods[] = {
    {"set_argument_kinds", kinds, METH_O, NULL}, {"call", call, METH_VARARGS, NULL},
    {"stream_check", stream_check, METH_O, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&definition); }
"""


def _module(native_dir: Path) -> Path:
    return native_dir / native.module_name() / f"{native.module_name()}.so"


@pytest.fixture
def compiler(native_dir, monkeypatch, tmp_path):
    """cpp_extension.load replaced by gcc building MODULE_SOURCE (or `broken` bytes) where it was told;
    the calls it got."""
    from torch.utils import cpp_extension

    gcc, include = shutil.which("gcc") or shutil.which("cc"), sysconfig.get_paths()["include"]
    if gcc is None or not (Path(include) / "Python.h").is_file():
        pytest.skip("needs a C compiler and Python's headers to build a real module")
    os.chmod(tmp_path, 0o700)
    calls: list[str] = []
    state = {"broken": None}

    def load(name, sources, build_directory, **kwargs):
        calls.append(build_directory)
        target = Path(build_directory) / f"{name}.so"
        if state["broken"] is not None:
            target.write_bytes(state["broken"])
            return
        source = tmp_path / "module.c"
        source.write_text(MODULE_SOURCE.replace("NAME", name))
        subprocess.run([gcc, "-shared", "-fPIC", f"-I{include}", str(source), "-o", str(target)], check=True)

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(native, "include_dirs", lambda: [])
    return calls, state


@pytest.mark.parametrize("shared", ["native dir", "its parent"])
def test_a_build_where_others_can_write_is_refused_before_compiling(compiler, native_dir, tmp_path, shared, capsys):
    calls, _ = compiler
    target = native_dir if shared == "native dir" else tmp_path
    native_dir.mkdir(mode=0o700)
    os.chmod(target, 0o777)  # not sticky: anyone could swap the module torch loads right after linking it
    assert main(["native", "build"]) == 1
    err = capsys.readouterr().err
    assert f"{target} is writable by group or others (mode 777)" in err and "chmod 700" in err
    assert calls == [] and not autobuild.failed_marker(_module(native_dir)).exists()


def test_a_module_is_tested_in_staging_and_renamed_into_place(compiler, native_dir, monkeypatch, capsys):
    calls, _ = compiler
    module, seen = _module(native_dir), []
    real_test = native._test_in_child

    def watched(path):
        seen.append((path, module.exists()))
        real_test(path)  # the real child: check.self_test() loads it and checks it

    monkeypatch.setattr(native, "_test_in_child", watched)
    assert main(["native", "build"]) == 0
    assert f"built and tested {module}" in capsys.readouterr().out
    assert calls == [str(native_dir / native.STAGING / native.module_name())]
    assert seen == [(Path(calls[0]) / module.name, False)]  # while tested, nothing where processes load from
    assert module.is_file() and not (Path(calls[0]) / module.name).exists()
    assert main(["native", "status"]) == 0


def test_a_module_failing_its_test_never_reaches_the_path_processes_load_from(compiler, native_dir, capsys):
    _, state = compiler
    state["broken"] = b"half-linked"
    assert main(["native", "build"]) == 1
    assert "failed its test" in capsys.readouterr().err
    assert not _module(native_dir).exists() and autobuild.earlier_failure(_module(native_dir))


def test_a_builder_killed_before_its_test_leaves_no_module_that_counts_as_built(compiler, native_dir, monkeypatch,
                                                                                capsys):
    def killed(path):
        raise KeyboardInterrupt  # the job ends (or Ctrl-C) between linking and testing

    monkeypatch.setattr(native, "_test_in_child", killed)
    with pytest.raises(KeyboardInterrupt):
        native.build()
    monkeypatch.undo()
    assert not _module(native_dir).exists()
    assert main(["native", "status"]) == 1  # not "built": the next build compiles and tests it


def test_what_the_build_makes_is_private_under_umask_002(compiler, tmp_path, monkeypatch):
    where = tmp_path / "a" / "b" / "native"
    monkeypatch.setenv(native.DIR_ENV, str(where))
    old = os.umask(0o002)  # Debian's and Ubuntu's default for users with a group of their own
    try:
        path = native.build()
    finally:
        os.umask(old)
    for made in (tmp_path / "a", tmp_path / "a" / "b", where, where / native.STAGING, path.parent, path):
        assert oct(made.stat().st_mode & 0o777) == "0o700", made
    assert native.status()["refused"] is None


def test_a_background_build_never_starts_where_others_can_write(native_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    os.chmod(tmp_path, 0o700)
    native_dir.mkdir()
    os.chmod(native_dir, 0o777)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (native_dir / f"{native.module_name()}.log").symlink_to(victim)  # planted by another user
    build = autobuild.BackgroundBuild()
    build.start(_module(native_dir), native.include_dirs, lambda: None)
    build.thread.join(30)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and f"not built ({native_dir} is writable by group or others (mode 777)" in said[0]
    assert victim.read_text() == "precious\n" and build.generation == 0


def test_the_background_log_does_not_follow_a_link_planted_where_it_goes(native_dir, tmp_path):
    os.chmod(tmp_path, 0o700)
    native_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (native_dir / f"{native.module_name()}.log").symlink_to(victim)
    autobuild.BackgroundBuild()._build(_module(native_dir), lambda: None, "0", time.monotonic())
    assert victim.read_text() == "precious\n"


HOLDER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
with open(sys.argv[2], "w") as out:
    out.write("compiling lean.cpp failed: boom")
"""


def test_a_rank_queued_behind_a_failed_build_takes_its_failure_and_compiles_nothing(native_dir, caplog):
    """Eight ranks that look at once all find no one building (the first one's child has not taken the
    lock yet) and each start a `native build`; those queued behind a failed one must not compile again."""
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    module = _module(native_dir)
    native_dir.mkdir(mode=0o700)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(autobuild.lock_path(module)),
                               str(autobuild.failed_marker(module))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "locked"
    rank = threading.Thread(target=autobuild.BackgroundBuild()._build, args=(module, lambda: None, "0",
                                                                             time.monotonic()))
    rank.start()
    time.sleep(3)  # its child is queued on the lock
    holder.communicate("\n", timeout=30)
    rank.join(120)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "the build this one waited for failed: compiling lean.cpp failed: boom" in warned[0]
    assert "CUDA toolkit" not in (native_dir / f"{native.module_name()}.log").read_text()  # it never went on


def test_a_module_at_the_load_path_that_does_not_load_is_built_again_not_called_built(compiler, native_dir, capsys,
                                                                                      caplog):
    """A module that fails to load (left half-written by a builder of an older version, or damaged) was
    answered 'built and tested' by `native build` and never built again."""
    calls, _ = compiler
    module = _module(native_dir)
    autobuild.private_dirs(module.parent)
    module.write_bytes(b"half-linked")
    os.chmod(module, 0o700)
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        assert main(["native", "build"]) == 0
    assert len(calls) == 1 and f"built and tested {module}" in capsys.readouterr().out
    assert module.read_bytes() != b"half-linked"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and f"{module} is removed and built again: the built module failed its test" in warned[0]
    assert main(["native", "build"]) == 0 and len(calls) == 1  # built and passing: tested, not compiled again
