"""`info` reports an invalid cache setting once: in its INVALID row, with no warning on stderr as well (the
store info opens only to look is quiet about it); exit 0 as docs/cli.md says. A process that uses the store
still warns, once."""

from __future__ import annotations

import logging

import pytest

from fusedattn_select import cli
from fusedattn_select.store import open_default_store, store_settings

SETTINGS = [("FUSEDATTN_SELECT_CACHE", "bogus"), ("FUSEDATTN_SELECT_CACHE_MAX_BYTES", "many bytes")]


@pytest.fixture(autouse=True)
def own_warnings(monkeypatch):
    """The store warns once per invalid value per process: these tests' warnings are their own."""
    monkeypatch.setattr(store_settings, "_warned", store_settings._InvalidValuesWarned())


def warnings_about(caplog, name):
    return [r for r in caplog.records if r.name == "fusedattn_select" and r.levelno >= logging.WARNING
            and name in r.getMessage()]


@pytest.mark.parametrize("name, value", SETTINGS)
def test_info_reports_an_invalid_cache_setting_in_its_row_only(capsys, caplog, monkeypatch, name, value):
    caplog.set_level(logging.DEBUG, logger="fusedattn_select")
    monkeypatch.setenv(name, value)
    code = cli.main(["info"])
    out, err = capsys.readouterr()
    assert code == 0
    [row] = [line for line in out.splitlines() if line.startswith(f"{name} ")]
    assert f"INVALID: {name}={value!r}: " in row
    assert name not in err
    assert warnings_about(caplog, name) == []


@pytest.mark.parametrize("name, value", SETTINGS)
def test_a_process_that_uses_the_store_still_warns_once(caplog, monkeypatch, name, value):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    monkeypatch.setenv(name, value)
    open_default_store(read_only=True)  # a command that only looks: quiet, and it does not use up the warning
    open_default_store()
    open_default_store()
    assert len(warnings_about(caplog, name)) == 1
