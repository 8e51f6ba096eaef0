"""The FUSEDATTN_SELECT_* settings (issue 33, item 15): one rule per variable, in one torch-free
module; every command refuses an invalid value before doing anything (exit 2, one `error:` line
naming the variable, the value and what it takes); the library keeps one warning for an invalid
cache size."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fusedattn_select import settings
from fusedattn_select.cli import main
from fusedattn_select.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
INVALID = {
    settings.SNAPSHOT: "/no/such/snapshot.json",
    settings.CACHE: "maybe",
    settings.CACHE_MAX_BYTES: "a lot",
    settings.DENSE_AFTER: "sixteen",
    settings.DENSE_BUILDS: "thread",
    settings.FIRST_CALLS: "later",
    settings.DIRECT_LAUNCH: "2",
    settings.NATIVE: "2",
    settings.FP8_KERNELS: "cuda",
}
WHY_ONE_PROBLEM = ["why", "--set", "batch_size=1", "--set", "num_heads_q=1", "--set", "num_heads_kv=1",
                   "--set", "seqlen_q=8", "--set", "seqlen_kv=8", "--set", "head_dim_qk=64"]
COMMANDS = {
    "why": WHY_ONE_PROBLEM,
    "matrix": ["matrix", str(ROOT / "probes" / "hopper-suite-sample.yaml")],
    "warmup": ["warmup", str(ROOT / "configs" / "gpt2.yaml")],
    "cache info": ["cache", "info"],
    "native status": ["native", "status"],
}


@pytest.fixture(autouse=True)
def no_settings_from_outside(monkeypatch):
    for name in os.environ:
        if name.startswith("FUSEDATTN_SELECT_") and name != settings.CACHE_DIR:
            monkeypatch.delenv(name)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", INVALID)
def test_every_command_refuses_an_invalid_setting_before_doing_anything(monkeypatch, capsys, name, command):
    monkeypatch.setenv(name, INVALID[name])
    assert main(COMMANDS[command]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: {name}={INVALID[name]!r}: must ") and err.count("\n") == 1, err


def test_info_reports_an_invalid_setting_in_its_row_where_other_commands_refuse_it(monkeypatch, capsys):
    monkeypatch.setenv(settings.NATIVE, "2")
    assert main(["info"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(settings.NATIVE))
    assert f"INVALID: {settings.NATIVE}='2': " in row
    assert main(["cache", "info"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {settings.NATIVE}='2': ")


def test_the_command_line_checks_the_settings_without_torch(tmp_path):
    script = textwrap.dedent("""
        import sys
        for name in ("torch", "cudnn", "cuda", "cuda.bindings"):
            sys.modules[name] = None
        from fusedattn_select.cli import main
        sys.exit(main(["cache", "info"]))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEDATTN_SELECT_")}
    env.update({settings.CACHE_DIR: str(tmp_path / "cache"), settings.DENSE_AFTER: "soon"})
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith(f"error: {settings.DENSE_AFTER}='soon': must be a whole number")


def test_every_variable_the_package_reads_has_one_rule_here():
    read = set()
    for path in (ROOT / "fusedattn_select").rglob("*.py"):
        read |= set(re.findall(r"FUSEDATTN_SELECT_[A-Z0-9_]+", path.read_text()))
    assert read == {setting.name for setting in settings.SETTINGS}


def test_the_docs_table_says_what_an_invalid_value_does_for_each_variable():
    table = (ROOT / "docs" / "environment.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines()
            if line.startswith("| `FUSEDATTN_SELECT_")}
    assert set(rows) == {setting.name for setting in settings.SETTINGS}
    assert all(len([c for c in row.split("|") if c.strip()]) == 3 for row in rows.values())


@pytest.mark.parametrize("name, text, value", [
    (settings.CACHE, " OFF ", False), (settings.CACHE, "yes", True),
    (settings.CACHE_MAX_BYTES, "64M", 64 * 1024**2), (settings.CACHE_MAX_BYTES, "2 GiB", 2 * 1024**3),
    (settings.DENSE_AFTER, "0", 0), (settings.DENSE_BUILDS, "inline", "inline"),
    (settings.DIRECT_LAUNCH, "0", False), (settings.NATIVE, "1", "1"), (settings.NATIVE, " Auto ", "auto"), (settings.FP8_KERNELS, " Torch ", "torch"),
])
def test_valid_values_parse(monkeypatch, name, text, value):
    monkeypatch.setenv(name, text)
    assert settings.value(name) == value


@pytest.mark.parametrize(("name", "text", "value"), [
    (settings.DENSE_AFTER, " 16 ", 16), (settings.DENSE_BUILDS, " Inline", "inline"),
    (settings.DIRECT_LAUNCH, "0 ", False), (settings.FIRST_CALLS, "WAIT", "wait"), (settings.CACHE, " Off", False),
])
def test_every_variable_ignores_blanks_around_its_value_and_case(monkeypatch, name, text, value):
    monkeypatch.setenv(name, text)
    assert settings.value(name) == value


def test_unset_or_empty_means_the_default(monkeypatch):
    for setting in settings.SETTINGS:
        monkeypatch.setenv(setting.name, "")
        assert settings.value(setting.name) == setting.default
        monkeypatch.delenv(setting.name)
        assert settings.value(setting.name) == setting.default


@pytest.mark.parametrize("text", ["²", "-1", "1.5", "1 6"])
def test_dense_after_takes_only_ascii_digits(monkeypatch, text):
    monkeypatch.setenv(settings.DENSE_AFTER, text)
    with pytest.raises(ConfigError, match=settings.DENSE_AFTER):
        settings.value(settings.DENSE_AFTER)


def test_the_runtime_reads_each_setting_through_its_one_rule(monkeypatch):
    pytest.importorskip("torch")
    from fusedattn_select.runtime import dense_builds, entries, fp8_kernels, native, plans, tiers  # noqa: F401
    from fusedattn_select.runtime.run_settings import run_settings

    readers = {settings.DENSE_AFTER: lambda: run_settings.get().dense_after,
               settings.DENSE_BUILDS: lambda: run_settings.get().dense_builds,
               settings.FIRST_CALLS: lambda: run_settings.get().first_calls,
               settings.DIRECT_LAUNCH: lambda: run_settings.get().direct_launch, settings.NATIVE: native.enabled,
               settings.FP8_KERNELS: fp8_kernels.configured_choice}
    assert set(readers) == set(settings.RUNTIME_VARIABLES.values())
    for name, read in readers.items():
        monkeypatch.setenv(name, INVALID[name])
        run_settings.reread()
        with pytest.raises(ConfigError) as from_runtime:
            read()
        with pytest.raises(ConfigError) as from_settings:
            settings.value(name)
        assert str(from_runtime.value) == str(from_settings.value)
        monkeypatch.delenv(name)
        run_settings.reread()


def test_the_runtime_settings_are_read_once_and_changed_only_through_use(monkeypatch):
    from fusedattn_select.runtime.run_settings import RunSettings

    holder = RunSettings()
    monkeypatch.setenv(settings.DENSE_AFTER, "7")
    first = holder.get()
    monkeypatch.setenv(settings.DENSE_AFTER, "9")
    assert holder.get() is first and first.dense_after == 7  # read once
    with holder.use(dense_after=3, first_calls="WAIT") as changed:
        assert holder.get() is changed and (changed.dense_after, changed.first_calls) == (3, "wait")
    assert holder.get() is first
    for bad, message in (({"dense_after": "x"}, "dense_after='x': must be a whole number"),
                         ({"first_calls": "later"}, "first_calls='later': must be"),
                         ({"colour": 1}, "unknown runtime setting 'colour'")):
        with pytest.raises(ValueError, match=message):
            with holder.use(**bad):
                pass
    assert holder.get() is first
    holder.reread()
    assert holder.get().dense_after == 9


def test_the_library_warns_once_about_an_invalid_cache_size(monkeypatch, caplog):
    from fusedattn_select.store import DEFAULT_MAX_BYTES, MemoryStore

    monkeypatch.setenv(settings.CACHE_MAX_BYTES, "plenty")
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        assert MemoryStore().max_bytes == DEFAULT_MAX_BYTES
        assert MemoryStore().max_bytes == DEFAULT_MAX_BYTES
    warnings = [r.getMessage() for r in caplog.records if settings.CACHE_MAX_BYTES in r.getMessage()]
    assert len(warnings) == 1 and "'plenty'" in warnings[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_warns_of_a_misspelled_variable_it_ignores_naming_the_closest(monkeypatch, capsys, command):
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHEDIR", "/somewhere")
    monkeypatch.setenv("FUSEDATTN_SELECT_COLOUR", "1")
    main(COMMANDS[command])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: FUSEDATTN_SELECT_")]
    assert warnings == [
        "warning: FUSEDATTN_SELECT_CACHEDIR is not a variable of fusedattn-select: it is ignored (did you mean "
        "FUSEDATTN_SELECT_CACHE_DIR?)",
        "warning: FUSEDATTN_SELECT_COLOUR is not a variable of fusedattn-select: it is ignored (they are: "
        + ", ".join(s.name for s in settings.SETTINGS) + ")"], warnings


def test_no_warning_for_the_variables_it_reads(monkeypatch):
    for setting in settings.SETTINGS:
        monkeypatch.setenv(setting.name, "")
    assert settings.unknown_variables() == []
