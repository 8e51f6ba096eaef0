"""Runtime test setup: `no_platform`, the selector of a machine without a GPU or snapshots, and
`native_dir`, an empty directory for the compiled module.

Not autouse: tests that need it say so (`pytestmark = pytest.mark.usefixtures("no_platform")`).
The runtime is imported inside the fixtures because some runtime tests run without torch.
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


@pytest.fixture
def native_dir(tmp_path, monkeypatch):
    """The compiled module's directory (empty) for this test, its setting unset (auto), nothing
    loaded and no background build started yet in this process."""
    from fusedattn_select.runtime import native
    from fusedattn_select.runtime.native import autobuild
    from fusedattn_select.runtime.dispatcher import dispatcher

    monkeypatch.setenv(native.DIR_ENV, str(tmp_path / "native"))
    monkeypatch.delenv(native.ENV_VAR, raising=False)
    monkeypatch.setattr(dispatcher, "native_loaded", {})
    monkeypatch.setattr(dispatcher, "native_build", autobuild.BackgroundBuild())
    return tmp_path / "native"
