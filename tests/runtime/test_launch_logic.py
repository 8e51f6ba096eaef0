"""Plan binding logic on CPU: which frontend graphs bind in order (by uid), how uids are read from
graph tensors, and when the direct launch is allowed (FUSEDATTN_SELECT_DIRECT_LAUNCH)."""

from __future__ import annotations

import types

import pytest

pytest.importorskip("torch")

from fusedattn_select import settings  # noqa: E402
from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime import plans  # noqa: E402
from fusedattn_select.runtime.run_settings import run_settings  # noqa: E402


class _Graph:
    """Stand-ins for graph classes with and without ordered binding (signature only, never run)."""

    def execute(self, tensor_dict, workspace=None, handle=None, tensor_uids=None):
        raise AssertionError("not run")


class _OldGraph:
    def execute(self, tensor_dict, workspace=None, handle=None):
        raise AssertionError("not run")


def test_binds_in_order_reads_the_execute_signature():
    assert plans._binds_in_order(_Graph())
    assert not plans._binds_in_order(_OldGraph())
    # A compiled method with no signature (older pybind frontends): map binding.
    assert not plans._binds_in_order(types.SimpleNamespace(execute=len))


def test_uids_come_from_ints_attributes_or_getters_and_none_when_any_is_missing():
    with_attr = types.SimpleNamespace(uid=7)
    with_getter = types.SimpleNamespace(get_uid=lambda: 9)
    assert plans._uids((3, with_attr, with_getter)) == (3, 7, 9)
    assert plans._uids((3, types.SimpleNamespace(name="q"))) is None
    assert plans._uids((types.SimpleNamespace(uid="7"),)) is None


@pytest.mark.parametrize("value,expected", [("", True), ("1", True), ("0", False)])
def test_direct_launch_setting(monkeypatch, value, expected):
    monkeypatch.setenv(settings.DIRECT_LAUNCH, value)
    assert run_settings.get().direct_launch is expected


def test_a_bad_direct_launch_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(settings.DIRECT_LAUNCH, "yes")
    with pytest.raises(ConfigError, match=settings.DIRECT_LAUNCH):
        run_settings.get().direct_launch


def test_no_direct_launcher_when_turned_off_or_the_frontend_lacks_its_internals(monkeypatch):
    monkeypatch.setenv(settings.DIRECT_LAUNCH, "0")
    assert plans.direct_launcher(_Graph(), (1, 2)) is None
    monkeypatch.setenv(settings.DIRECT_LAUNCH, "1")
    assert plans.direct_launcher(_Graph(), (1, 2)) is None  # no _lowered_graph: feature detection says no
    not_built = types.SimpleNamespace(_lowered_graph=object(), _is_built=False, selected_engine=None)
    assert plans.direct_launcher(not_built, (1, 2)) is None
    python_engine = types.SimpleNamespace(_lowered_graph=object(), _is_built=True, selected_engine=object())
    assert plans.direct_launcher(python_engine, (1, 2)) is None
