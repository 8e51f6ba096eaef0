"""The compiled module's identity: its name changes with each thing the binary depends on (interpreter
ABI, torch's build, the headers' versions, the flags) and is the same in every process that has the
same ones; a module compiled against newer cuDNN headers than the cuDNN the process loaded is refused
at load with one log line (a real shared library that leaves a mark when it is loaded)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import logging
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime import native  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from test_native_trust_cpu import _compile_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _write_headers(root: Path, frontend: str | None, cudnn: str) -> list[Path]:
    """cudnn-frontend's and cuDNN's include directories as their wheels lay them out, of these versions
    (frontend None: a frontend without its version header)."""
    frontend_dir, cudnn_dir = root / "include", root / "nvidia" / "cudnn" / "include"
    for directory in (frontend_dir, cudnn_dir):
        directory.mkdir(parents=True, exist_ok=True)
    (frontend_dir / "cudnn_frontend.h").write_text(f"// frontend {frontend}\n")
    version_file = frontend_dir / "cudnn_frontend_version.h"
    if frontend is None:
        version_file.unlink(missing_ok=True)
    else:
        major, minor, patch = frontend.split(".")
        version_file.write_text(f"#pragma once\n#define CUDNN_FRONTEND_MAJOR_VERSION {major}\n"
                                f"#define CUDNN_FRONTEND_MINOR_VERSION {minor}\n"
                                f"#define CUDNN_FRONTEND_PATCH_VERSION {patch}\n")
    (cudnn_dir / "cudnn.h").write_text('#include "cudnn_version.h"\n')
    major, minor, patch = cudnn.split(".")
    (cudnn_dir / "cudnn_version.h").write_text(f"#define CUDNN_MAJOR {major}\n#define CUDNN_MINOR {minor}\n"
                                               f"#define CUDNN_PATCHLEVEL {patch}\n#define CUDNN_VERSION 0\n")
    return [frontend_dir, cudnn_dir]


@pytest.fixture
def headers(tmp_path, monkeypatch):
    """The packages whose directories hold the headers (importlib finds them) hold headers of the
    versions given to the returned function."""
    root = tmp_path / "site"
    packages = {"cudnn": root / "cudnn", "nvidia.cudnn": root / "nvidia" / "cudnn"}
    real_find_spec = importlib.util.find_spec

    def find_spec(name, package=None):
        if name not in packages:
            return real_find_spec(name, package)
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(packages[name])]
        return spec

    def install(frontend: str | None = "1.28.0", cudnn: str = "9.1.0") -> None:
        _write_headers(root, frontend, cudnn)

    install()
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(dispatcher, "native_names", {})
    return install


def _fresh_name() -> str:
    dispatcher.native_names.clear()  # worked out again, not the name this process remembered
    return native.module_name()


def _interpreter(monkeypatch, ext_suffix: str, abiflags: str, gil_disabled: int) -> None:
    real = sysconfig.get_config_var
    values = {"EXT_SUFFIX": ext_suffix, "Py_GIL_DISABLED": gil_disabled}
    monkeypatch.setattr(sysconfig, "get_config_var", lambda key: values[key] if key in values else real(key))
    monkeypatch.setattr(sys, "abiflags", abiflags, raising=False)


def _flags(monkeypatch, flags: tuple[str, ...]) -> None:
    from fusedattn_select.runtime.native import identity

    monkeypatch.setattr(identity, "CFLAGS", flags)


# Each ingredient as (before, after): sys.implementation.cache_tag stays the same in each.
CHANGES = {
    "free-threaded interpreter (3.13 and 3.13t)": lambda mp, h, i: _interpreter(
        mp, [".cpython-313-x86_64-linux-gnu.so", ".cpython-313t-x86_64-linux-gnu.so"][i], ["", "t"][i], i),
    "debug interpreter": lambda mp, h, i: _interpreter(
        mp, [".cpython-313-x86_64-linux-gnu.so", ".cpython-313d-x86_64-linux-gnu.so"][i], ["", "d"][i], 0),
    "another platform": lambda mp, h, i: _interpreter(
        mp, [".cpython-313-x86_64-linux-gnu.so", ".cpython-313-aarch64-linux-gnu.so"][i], "", 0),
    "torch version": lambda mp, h, i: mp.setattr(torch, "__version__", ["2.5.0", "2.6.0"][i]),
    "torch build commit": lambda mp, h, i: mp.setattr(torch.version, "git_version", ["a" * 40, "b" * 40][i]),
    "torch CUDA version": lambda mp, h, i: mp.setattr(torch.version, "cuda", ["12.4", "12.8"][i]),
    "torch C++ ABI": lambda mp, h, i: mp.setattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", bool(i), raising=False),
    "cudnn-frontend headers": lambda mp, h, i: h(frontend=["1.28.0", "1.29.0"][i]),
    "cudnn-frontend headers of no version": lambda mp, h, i: h(frontend=None) if i == 0 else (
        h(frontend=None), (native.include_dirs()[0] / "cudnn_frontend.h").write_text("// other\n")),
    "cuDNN headers": lambda mp, h, i: h(cudnn=["9.1.0", "9.5.0"][i]),
    "compiler flags": lambda mp, h, i: _flags(mp, [("-O3",), ("-O2",)][i]),
}


@pytest.mark.parametrize("ingredient", list(CHANGES))
def test_the_name_changes_with_each_thing_the_module_depends_on(ingredient, headers, monkeypatch):
    CHANGES[ingredient](monkeypatch, headers, 0)
    before = _fresh_name()
    CHANGES[ingredient](monkeypatch, headers, 1)
    assert _fresh_name() != before, f"a module built for another {ingredient} would be loaded"
    CHANGES[ingredient](monkeypatch, headers, 0)
    assert _fresh_name() == before


def test_the_name_is_the_same_in_this_process_and_in_a_fresh_one(monkeypatch):
    monkeypatch.setattr(dispatcher, "native_names", {})
    first = native.module_name()
    assert native.module_name() == first and _fresh_name() == first
    code = "from fusedattn_select.runtime import native; print(native.module_name())"
    env = dict(os.environ, PYTHONHASHSEED="12345")  # no set or dict order of this process leaks in
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300, check=True)
    assert child.stdout.strip() == first


def test_the_module_is_compiled_with_the_flags_its_name_holds(headers, monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    from fusedattn_select.runtime.native import identity

    got = {}

    def load(**kwargs):
        got.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setenv(native.DIR_ENV, str(tmp_path / "native"))
    with pytest.raises(native.NativeBuildError, match="stop here"):
        native._build(native.module_name(), verbose=False)
    assert got["extra_cflags"] == list(identity.CFLAGS)
    assert got["extra_cuda_cflags"] == list(identity.CUDA_CFLAGS)


@pytest.mark.parametrize("cudnn, loaded, refused", [
    ("9.1.0", 90100, ""), ("9.1.0", 90500, ""), ("9.1.0", 91002, ""), ("9.1.0", None, ""),
    ("9.1.2", 90100, ""),  # patch releases of one minor are compatible both ways (cuDNN's rule)
    ("9.1.0", 90000, "it was compiled against cuDNN 9.1.0's headers and this process loaded cuDNN 9.0.0 (older)"),
    ("9.1.0", 8907, "it was compiled against cuDNN 9.1.0's headers and this process loaded cuDNN 8.9.7 "
                    "(another major version)"),
    ("9.1.0", 100000, "it was compiled against cuDNN 9.1.0's headers and this process loaded cuDNN 10.0.0 "
                      "(another major version)"),
])
def test_the_cudnn_the_process_loaded_is_checked_against_the_headers(headers, cudnn, loaded, refused):
    from fusedattn_select.runtime.native import identity

    headers(cudnn=cudnn)
    assert identity.cudnn_refusal(loaded) == refused


@pytest.fixture
def planted(headers, native_dir, tmp_path, monkeypatch):
    """A real module, in a private directory, under the name for cuDNN 9.1.0's headers; its mark."""
    if not hasattr(os, "geteuid"):
        pytest.skip("POSIX owners and modes")
    name = native.module_name()
    (native_dir / name).mkdir(parents=True)
    os.chmod(tmp_path, 0o700)
    monkeypatch.setenv("PLANTED_MODULE_MARK", str(tmp_path / "mark"))
    module = _compile_module(name, native_dir / name)
    for path in (native_dir, native_dir / name, module):
        os.chmod(path, 0o700)
    yield module, tmp_path / "mark"
    sys.modules.pop(name, None)


def _import_with_loaded_cudnn(monkeypatch, caplog, loaded: int):
    # The cuDNN this process loaded, as torch answers it (the module binds to that library).
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: loaded)
    with caplog.at_level(logging.INFO, logger="fusedattn_select"):
        imported = native._import(native.module_name())
    return imported, [r.getMessage() for r in caplog.records if "compiled lean path" in r.getMessage()]


def test_a_module_compiled_against_newer_cudnn_headers_is_refused_with_one_line(planted, monkeypatch, caplog):
    module, mark = planted
    imported, lines = _import_with_loaded_cudnn(monkeypatch, caplog, 90000)
    assert imported is None and not mark.exists()  # its code never ran
    assert lines == [f"fusedattn_select: not loading the compiled lean path {module}: it was compiled against "
                     "cuDNN 9.1.0's headers and this process loaded cuDNN 9.0.0 (older); using the Python path"]
    info = native.status()
    assert info["built"] and info["problem"].startswith("built, but not loaded: it was compiled against cuDNN 9.1.0")


def test_native_status_exits_1_naming_the_cudnn_it_was_built_for(planted, monkeypatch, capsys):
    from fusedattn_select.cli import main

    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90000)
    assert main(["native", "status", "--json"]) == 1
    assert ("native: built, but not loaded: it was compiled against cuDNN 9.1.0's headers and this process "
            "loaded cuDNN 9.0.0 (older)") in capsys.readouterr().err
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    assert main(["native", "status", "--json"]) == 0


def test_the_same_module_loads_with_the_cudnn_of_its_headers(planted, monkeypatch, caplog):
    module, mark = planted
    imported, lines = _import_with_loaded_cudnn(monkeypatch, caplog, 90100)
    assert imported is not None and mark.read_text() == "loaded"
    assert lines == [f"fusedattn_select: compiled lean path loaded from {module}"]
    assert native.status()["built"] and "problem" not in native.status()


def test_the_installed_headers_versions_name_the_module_in_every_process(tmp_path):
    """The wheels' layout on the path of fresh processes: the versions read from their headers, the same
    name twice, another name once cuDNN's headers are of another version."""
    site = tmp_path / "site"
    _write_headers(site, "1.28.0", "9.1.0")
    for package in (site / "cudnn", site / "nvidia" / "cudnn"):  # regular packages: found before any installed
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text("")
    code = ("import json; from fusedattn_select.runtime import native; from fusedattn_select.runtime.native "
            "import identity; print(json.dumps([native.module_name(), identity.ingredients(native.SOURCE)]))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))

    def child() -> tuple[str, dict]:
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300, check=True)
        name, parts = json.loads(done.stdout)
        return name, parts

    first, parts = child()
    assert parts["headers cudnn"] == "1.28.0" and parts["headers nvidia.cudnn"] == "9.1.0"
    assert child()[0] == first
    _write_headers(site, "1.28.0", "9.2.0")
    assert child()[0] != first
