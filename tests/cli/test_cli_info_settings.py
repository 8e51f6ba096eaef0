"""`info` with an invalid setting still reports every fact and shows the setting as INVALID in its row (text
and --json), exit 0, as it does for the cache switch; every other command refuses the setting (exit 2)."""

from __future__ import annotations

import json

import pytest

from fusedattn_select import cli
from fusedattn_select.store import store_settings

INVALID = [
    ("FUSEDATTN_SELECT_SNAPSHOT", "/nonexist.json", "snapshot_env"),
    ("FUSEDATTN_SELECT_DENSE_AFTER", "abc", "FUSEDATTN_SELECT_DENSE_AFTER"),
    ("FUSEDATTN_SELECT_CACHE_MAX_BYTES", "many bytes", "FUSEDATTN_SELECT_CACHE_MAX_BYTES"),
    ("FUSEDATTN_SELECT_NATIVE", "maybe", "FUSEDATTN_SELECT_NATIVE"),
    ("FUSEDATTN_SELECT_DIRECT_LAUNCH", "2", "FUSEDATTN_SELECT_DIRECT_LAUNCH"),
]


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def own_warnings(monkeypatch):
    """The store warns once per invalid value per process: these tests' warnings are their own."""
    monkeypatch.setattr(store_settings, "_warned", store_settings._InvalidValuesWarned())


@pytest.fixture
def clean_facts(capsys, monkeypatch):
    for name, _, _ in INVALID:
        monkeypatch.delenv(name, raising=False)
    code, out, _ = run(capsys, "info", "--json")
    assert code == 0
    return json.loads(out)


@pytest.mark.parametrize("name, value, key", INVALID)
def test_info_reports_every_fact_and_the_invalid_setting_in_its_row(capsys, monkeypatch, clean_facts, name, value, key):
    monkeypatch.setenv(name, value)
    code, out, err = run(capsys, "info", "--json")
    facts = json.loads(out)
    assert code == 0 and "error:" not in err
    assert set(clean_facts) <= set(facts) and set(facts) - set(clean_facts) <= {key}
    assert facts[key].startswith(f"INVALID: {name}={value!r}: ")
    code, out, err = run(capsys, "info")
    [row] = [line for line in out.splitlines() if line.startswith(f"{name} ")]
    assert code == 0 and f"INVALID: {name}={value!r}: " in row
    assert "bundled snapshots" in out and "cache directory" in out


@pytest.mark.parametrize("name, value, key", INVALID[:2])
def test_other_commands_still_refuse_the_invalid_setting(capsys, monkeypatch, name, value, key):
    monkeypatch.setenv(name, value)
    code, out, err = run(capsys, "why", "--target", "h100", "--set", "batch_size=1")
    assert code == 2 and out == "" and err.startswith(f"error: {name}={value!r}: ")


def test_a_valid_setting_that_is_set_is_shown_with_its_value(capsys, monkeypatch, clean_facts):
    monkeypatch.setenv("FUSEDATTN_SELECT_DENSE_AFTER", "32")
    code, out, _ = run(capsys, "info", "--json")
    assert code == 0 and json.loads(out)["FUSEDATTN_SELECT_DENSE_AFTER"] == "32"
    assert "FUSEDATTN_SELECT_DENSE_AFTER" not in clean_facts
