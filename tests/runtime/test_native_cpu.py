"""The optional compiled lean path's logic on CPU: its switch, where builds live and what names them,
that an unbuilt or unloadable module means the Python path (never an error at call time), and the
`native` command's answers and exit codes."""

from __future__ import annotations

import json
import logging
import types

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.cli.main import main  # noqa: E402
from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime import native  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402


@pytest.mark.parametrize("value, on", [("", True), ("auto", True), (" AUTO ", True), ("1", True), ("0", False)])
def test_switch_values(monkeypatch, value, on):
    monkeypatch.setenv(native.ENV_VAR, value)
    assert native.enabled() is on


@pytest.mark.parametrize("value", ["yes", "off", "2", "on"])
def test_switch_rejects_other_values_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(native.ENV_VAR, value)
    with pytest.raises(ConfigError) as err:
        native.enabled()
    assert native.ENV_VAR in str(err.value) and "0" in str(err.value) and "1" in str(err.value)


def test_build_dir_follows_its_variable_else_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(native.DIR_ENV, str(tmp_path / "x"))
    assert native.build_dir() == tmp_path / "x"
    monkeypatch.delenv(native.DIR_ENV)
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(tmp_path / "cache"))
    assert native.build_dir() == tmp_path / "cache" / "native"


def test_module_name_is_stable_and_names_the_source(tmp_path, monkeypatch):
    first = native.module_name()
    assert first == native.module_name() and first.startswith("fusedattn_select_native_")
    changed = tmp_path / "lean.cpp"
    changed.write_bytes(native.SOURCE.read_bytes() + b"\n// changed\n")
    monkeypatch.setattr(native, "SOURCE", changed)
    assert native.module_name() != first


def test_the_source_ships_with_the_package():
    text = native.SOURCE.read_text()
    assert "PYBIND11_MODULE" in text and "LeanBackward" in text and '#include "graphs.h"' in text
    assert "load_graph" in native.SOURCE.with_name("graphs.h").read_text()
    assert not list(native.SOURCE.parent.glob("*.cu"))  # lean.cpp is the module's one source
    assert not any((native.SOURCE.parent / h).exists() for h in ("fp8.h", "fp8_plan.h"))


def test_module_name_follows_the_headers_too(tmp_path, monkeypatch):
    source = tmp_path / "lean.cpp"
    source.write_bytes(native.SOURCE.read_bytes())
    (tmp_path / "graphs.h").write_text("// one\n")
    monkeypatch.setattr(native, "SOURCE", source)
    monkeypatch.setattr(dispatcher, "native_names", {})
    first = native.module_name()
    dispatcher.native_names.clear()
    (tmp_path / "graphs.h").write_text("// two\n")
    assert native.module_name() != first


def test_nothing_built_means_the_python_path(native_dir):
    assert native.load() is None
    assert native.lean_plan(_Entry(training=False), _Lean()) is None
    info = native.status()
    assert info["built"] is False and info["module"].startswith(str(native_dir))


def test_switched_off_loads_nothing_even_where_built(native_dir, monkeypatch):
    path = native_dir / native.module_name() / f"{native.module_name()}.so"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared object")
    monkeypatch.setenv(native.ENV_VAR, "0")
    assert native.load() is None
    assert dispatcher.native_loaded == {}  # not even tried


def test_a_module_that_does_not_load_is_the_python_path_with_a_warning(native_dir, caplog):
    path = native_dir / native.module_name() / f"{native.module_name()}.so"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared object")
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        assert native.load() is None
        assert native.load() is None  # remembered: tried and warned once
    warnings = [r for r in caplog.records if "did not load" in r.getMessage()]
    assert len(warnings) == 1


def test_training_entry_without_lean_grads_never_gets_a_compiled_plan(native_dir):
    # Training calls whose backward is not lean keep the general path: a compiled forward alone
    # would drop their gradients.
    assert native.lean_plan(_Entry(training=True), _Lean(grads=None)) is None


def test_build_without_a_cuda_toolkit_says_so(native_dir, monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    with pytest.raises(native.NativeBuildError, match="CUDA toolkit"):
        native.build()
    assert not native_dir.exists() or not any(native_dir.rglob("*.so"))


def test_a_module_that_fails_its_test_is_removed_and_the_build_says_why(native_dir):
    path = native_dir / native.module_name() / f"{native.module_name()}.so"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared object")  # what a broken build leaves: the child cannot load it
    with pytest.raises(native.NativeBuildError, match="(?s)failed its test.*exit code 1.*no module loads.*set CXX"):
        native._test_in_child(path)
    assert not path.exists()


def test_missing_headers_are_named(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cudnn" else real(name, *a))
    with pytest.raises(native.NativeBuildError, match="cudnn_frontend.h.*nvidia-cudnn-frontend"):
        native.include_dirs()


def test_cli_status_exit_codes_and_json(native_dir, capsys):
    assert main(["native", "status", "--json"]) == 1
    out, err = capsys.readouterr()
    info = json.loads(out)
    assert info["built"] is False and info["enabled"] is True and "not built" in err
    path = native_dir / native.module_name() / f"{native.module_name()}.so"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    assert main(["native", "status"]) == 0


def test_cli_rejects_an_invalid_switch(native_dir, monkeypatch, capsys):
    monkeypatch.setenv(native.ENV_VAR, "maybe")
    assert main(["native", "status"]) == 2
    assert native.ENV_VAR in capsys.readouterr().err


def test_cli_build_failure_is_exit_1_with_the_reason(native_dir, monkeypatch, capsys):
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    assert main(["native", "build"]) == 1
    assert "CUDA toolkit" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["under a file", "in /proc"])
def test_cli_build_in_a_directory_it_cannot_make_is_exit_1_naming_it_without_a_traceback(tmp_path, monkeypatch,
                                                                                          capsys, where):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    directory = str(a_file / "native") if where == "under a file" else "/proc/fusedattn-select-native"
    monkeypatch.setenv(native.DIR_ENV, directory)
    assert main(["native", "build"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: native build: cannot build in {directory} (") and native.DIR_ENV in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


class _Opts:
    def __init__(self, training):
        self.training = training


class _Entry:
    def __init__(self, training):
        self.opts = _Opts(training)
        self.forward = types.SimpleNamespace(device=torch.device("cuda", 0))  # a plan's device, not touched


class _Lean:
    def __init__(self, grads=((), (), ())):
        self.grads = grads


def test_no_module_means_an_empty_table(native_dir, monkeypatch):
    monkeypatch.setattr(dispatcher, "native_table", None)
    monkeypatch.setattr(dispatcher, "native_call", None)
    native.remember(None, None, None, (), None)  # nothing to file into: no error
    native.forget_calls()
    assert native.table_calls() == 0


def test_forgetting_the_table_keeps_its_count_until_clear_plans(monkeypatch):
    class Table:  # the module's count of calls, which its forget() zeroes
        n = 5

        def calls(self):
            return self.n

        def forget(self):
            self.n = 0

    table = Table()
    monkeypatch.setattr(dispatcher, "native_table", table)
    monkeypatch.setattr(dispatcher, "native_forgotten_calls", 0)
    native.forget_calls()
    assert native.table_calls() == 5
    table.n = 2
    assert native.table_calls() == 7
    monkeypatch.setattr(dispatcher, "entries", type(dispatcher.entries)())  # clear() empties these too
    monkeypatch.setattr(dispatcher, "by_call", {})
    dispatcher.clear()  # clear_plans: every counter starts again
    assert native.table_calls() == 0


def test_every_source_of_the_module_is_in_the_package_data():
    """An installed (not editable) package must carry every file the build compiles or includes."""
    import fnmatch
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")
    root = native.SOURCE.parent.parent.parent  # the fusedattn_select package
    pyproject = root.parent / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("not a source checkout")
    patterns = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["fusedattn_select"]
    sources = [p for p in native.SOURCE.parent.iterdir() if p.suffix in (".cpp", ".h")]
    assert {p.name for p in sources} >= {"lean.cpp", "graphs.h"}
    for source in sources:
        name = str(Path(source).relative_to(root))
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name


def test_the_compiled_source_knows_every_argument_kind_python_declares():
    # lean.cpp maps kind names to its checks; a kind runtime/args.py declares that the C++ does not
    # know would make every module refuse its table (load() then runs the Python path).
    import re
    from importlib import resources

    from fusedattn_select.runtime.args import TABLE_ARGUMENTS

    source = resources.files("fusedattn_select.runtime.native").joinpath("lean.cpp").read_text()
    known = source[source.index("void set_argument_kinds"):]
    known = set(re.findall(r'\{"([^"]+)", ArgumentKind::', known[:known.index("};")]))
    assert known and set(TABLE_ARGUMENTS.values()) <= known


def test_a_module_that_refuses_the_argument_kinds_is_the_python_path_with_a_warning(native_dir, monkeypatch,
                                                                                      caplog):
    def refuse(kinds):
        raise ValueError(f"unknown argument kind {kinds[0]!r}")

    fake = types.SimpleNamespace(set_argument_kinds=refuse, call=lambda *args: None)
    monkeypatch.setattr(native, "_import", lambda name: fake)
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        assert native.load() is None
        assert native.load() is None  # remembered: refused once
    assert dispatcher.native_call is not fake.call
    refused = [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()]
    assert len(refused) == 1 and refused[0].endswith("unknown argument kind 'str?'")
