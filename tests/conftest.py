"""Test isolation: every test gets its own cache directory, no snapshot from the environment and a
fresh process-wide selector, so no test sees another test's (or the user's) decisions."""

from __future__ import annotations

import pytest

from fusedattn_select.selector import set_default_selector


@pytest.fixture(autouse=True)
def isolated_selector(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FUSEDATTN_SELECT_SNAPSHOT", raising=False)
    set_default_selector(None)
    yield
    set_default_selector(None)
