"""Runtime test setup: `no_platform`, the selector of a machine without a GPU or snapshots.

Not autouse: tests that need it say so (`pytestmark = pytest.mark.usefixtures("no_platform")`).
The runtime is imported inside the fixture because some runtime tests run without torch.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def no_platform():
    """A selector without a probing engine (what a machine without a GPU or snapshots gets), and no
    plans from earlier tests; the previous selector and an empty plan cache afterwards."""
    from fusedattn_select.runtime import api as dispatch
    from fusedattn_select.selection.selector import Selector, set_default_selector

    old = set_default_selector(Selector(None, unavailable_reason="no GPU in this test"))
    dispatch.clear_plans()
    yield
    dispatch.clear_plans()
    set_default_selector(old)
