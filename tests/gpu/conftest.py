"""GPU test setup: one live cuDNN engine per session; GPU tests skip cleanly where there is none.

A test here is marked `gpu` (module-level `pytestmark`). Where cudnn-frontend or cuda-python cannot
be imported, no CUDA device exists or libcudnn cannot be loaded, every such test is skipped with
the engine's own reason instead of failing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
_state: dict[str, object] = {}


def _engine_or_reason() -> tuple[object | None, str]:
    if "engine" not in _state:
        try:
            from fusedattn_select.errors import PlatformError
            from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine
        except ImportError as err:
            _state.update(engine=None, reason=f"cannot import the cuDNN engine: {err}")
        else:
            try:
                _state.update(engine=CudnnEngine(), reason="")
            except PlatformError as err:
                _state.update(engine=None, reason=str(err))
    return _state["engine"], str(_state["reason"])


@pytest.hookimpl(trylast=True)  # after `-m` deselection: a CPU-only run never touches CUDA
def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if item.get_closest_marker("gpu") and _HERE in Path(str(item.fspath)).resolve().parents]
    if not ours:
        return
    engine, reason = _engine_or_reason()
    if engine is None:
        skip = pytest.mark.skip(reason=f"no GPU platform for cuDNN probing: {reason}")
        for item in ours:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cudnn_engine():
    """The session's live CudnnEngine (device 0 or the current device)."""
    engine, reason = _engine_or_reason()
    if engine is None:
        pytest.skip(f"no GPU platform for cuDNN probing: {reason}")
    return engine


@pytest.fixture(autouse=True)
def _cudnn_from_the_first_call(request, monkeypatch):
    """Every GPU test but `first_contact` ones runs the cuDNN path from a signature's first call
    (wait), in this process and in the processes it starts; `first_contact` ones test the default.
    None starts a background build of the compiled module."""
    if request.node.get_closest_marker("gpu") is None:
        return
    mode = "torch" if request.node.get_closest_marker("first_contact") else "wait"
    monkeypatch.setenv("FUSEDATTN_SELECT_FIRST_CALLS", mode)
    # No compiled module is built in the background under the suite (test_native_autobuild.py
    # tests that build in a process of its own): one built mid-session would change the path of
    # the tests after it.
    import os

    if os.environ.get("FUSEDATTN_SELECT_NATIVE", "").strip().lower() in ("", "auto"):
        monkeypatch.setenv("FUSEDATTN_SELECT_NATIVE", "1")
    from fusedattn_select.runtime.run_settings import run_settings

    run_settings.reread()  # the runtime's settings from this environment
