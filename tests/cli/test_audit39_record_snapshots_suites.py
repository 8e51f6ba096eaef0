"""tools/record_snapshots.py --suites: a name that is no bundled suite is refused naming --suites and the
suites there are (exit 2) before the device is asked, never dropped: `--suites modles` recorded nothing
and exited 0, `--suites configs,modles` recorded configs alone.

The device is RecordingTestEngine (a test double named "Test GPU H100", tests/conftest.py): with it the
script gets past its device check, as on an H100."""

from __future__ import annotations

import pytest

from fusedattn_select.probing import choice
from tests.conftest import RecordingTestEngine
from tools import record_snapshots


@pytest.fixture
def h100_double(monkeypatch):
    monkeypatch.setattr(choice, "live_engine", lambda: (RecordingTestEngine(), ""))


@pytest.mark.parametrize("suites", ["modles", "configs,modles", ","])
def test_an_unknown_suite_is_refused_naming_the_option_and_the_suites(tmp_path, capsys, h100_double, suites):
    with pytest.raises(SystemExit) as stopped:
        record_snapshots.main(["--out-dir", str(tmp_path / "out"), "--suites", suites])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --suites" in err and "configs, hopper-suite, models" in err, err
    assert not (tmp_path / "out").exists()


def test_known_suites_are_read_in_order_without_repeats():
    assert record_snapshots.suite_names(" models,configs,models ") == ("models", "configs")
