"""Shared setup of the reference tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_platform():
    """A selector without a probing engine: CPU calls run torch SDPA or the reference."""
    from fusedattn_select.runtime import api as dispatch
    from fusedattn_select.selection.selector import Selector, set_default_selector

    old = set_default_selector(Selector(None, unavailable_reason="no GPU in this test"))
    dispatch.clear_plans()
    yield
    dispatch.clear_plans()
    set_default_selector(old)
