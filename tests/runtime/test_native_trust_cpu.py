"""A compiled module planted in a directory others can write is never loaded; the same module in a
private directory is (a real shared library that leaves a mark when it is loaded)."""

import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytest.importorskip("torch")

from fusedattn_select.runtime import native  # noqa: E402

MODULE_SOURCE = """
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>
static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, "%(name)s", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_%(name)s(void) {
    FILE *mark = fopen(getenv("PLANTED_MODULE_MARK"), "w");
    if (mark) { fputs("loaded", mark); fclose(mark); }
    return PyModule_Create(&definition);
}
"""


def _compile_module(name: str, where: Path) -> Path:
    compiler = shutil.which("gcc") or shutil.which("cc")
    include = sysconfig.get_paths()["include"]
    if compiler is None or not (Path(include) / "Python.h").is_file():
        pytest.skip("needs a C compiler and Python's headers to build a real module")
    source = where.parent / "planted.c"
    source.write_text(MODULE_SOURCE % {"name": name})
    target = where / f"{name}.so"
    subprocess.run([compiler, "-shared", "-fPIC", f"-I{include}", str(source), "-o", str(target)], check=True)
    return target


@pytest.fixture
def planted(tmp_path, monkeypatch):
    native_dir = tmp_path / "native"
    name = native.module_name()
    (native_dir / name).mkdir(parents=True)
    os.chmod(tmp_path, 0o700)
    monkeypatch.setenv(native.DIR_ENV, str(native_dir))
    monkeypatch.setenv("PLANTED_MODULE_MARK", str(tmp_path / "mark"))
    module = _compile_module(name, native_dir / name)
    for path in (native_dir, native_dir / name):
        os.chmod(path, 0o700)
    os.chmod(module, 0o700)
    yield module, tmp_path / "mark"
    sys.modules.pop(name, None)


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")
@pytest.mark.parametrize("shared", ["native dir", "module dir", "module"])
def test_a_module_others_can_write_is_refused_with_one_warning(planted, shared, caplog):
    module, mark = planted
    target = {"native dir": module.parent.parent, "module dir": module.parent, "module": module}[shared]
    os.chmod(target, 0o777)
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        assert native._import(native.module_name()) is None
    assert not mark.exists()  # its code never ran
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not loading the compiled lean path" in warnings[0]
    assert f"{target} is writable by group or others (mode 777)" in warnings[0]
    assert native.status()["refused"].startswith(str(target))


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")
def test_the_same_module_in_a_private_directory_loads(planted):
    module, mark = planted
    loaded = native._import(native.module_name())
    assert loaded is not None and mark.read_text() == "loaded"
    assert native.status()["refused"] is None


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")
def test_native_status_exits_1_naming_the_path_others_can_write(planted, capsys):
    from fusedattn_select.cli import main

    module, _ = planted
    os.chmod(module.parent, 0o775)
    assert main(["native", "status", "--json"]) == 1
    err = capsys.readouterr().err
    assert f"built but never loaded: {module.parent} is writable by group or others (mode 775)" in err
