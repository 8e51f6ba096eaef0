"""offpath: how far the calling thread may go to answer a question now (first contact), and the
FUSEDATTN_SELECT_FIRST_CALLS setting that turns first contact off. Torch-free."""

from __future__ import annotations

import threading

import pytest

from fusedattn_select import offpath, settings
from fusedattn_select.errors import ConfigError

STORE_READ = offpath.STORED  # what a store read or a plan load needs
PROBE = None                 # what a probe or a build needs


# ----- require under each limit -----------------------------------------------------------------
def test_without_a_limit_everything_is_allowed():
    assert offpath.limit() is None
    offpath.require("a store read", STORE_READ)
    offpath.require("a probe", PROBE)


def test_stored_allows_store_reads_and_refuses_probes_and_builds():
    with offpath.only(offpath.STORED):
        assert offpath.limit() == offpath.STORED
        offpath.require("a store read", STORE_READ)
        with pytest.raises(offpath.NotReady, match="^a probe of X$"):
            offpath.require("a probe of X", PROBE)
    assert offpath.limit() is None


def test_memory_refuses_store_reads_and_probes_naming_what_was_asked():
    with offpath.only(offpath.MEMORY):
        assert offpath.limit() == offpath.MEMORY
        with pytest.raises(offpath.NotReady) as read:
            offpath.require("the selection of K", STORE_READ)
        with pytest.raises(offpath.NotReady) as probe:
            offpath.require("a build of K", PROBE)
    assert str(read.value) == "the selection of K" and str(probe.value) == "a build of K"
    assert offpath.limit() is None


def test_not_ready_is_an_ordinary_exception_not_a_library_error():
    # attention() catches it where it limits a decision; nothing else should mistake it for a failure.
    from fusedattn_select.errors import FusedAttnSelectError

    assert issubclass(offpath.NotReady, Exception)
    assert not issubclass(offpath.NotReady, FusedAttnSelectError)


# ----- nesting and restoring -------------------------------------------------------------------
def test_nested_only_sets_the_inner_limit_and_restores_the_outer_one():
    with offpath.only(offpath.STORED):
        with offpath.only(offpath.MEMORY):
            assert offpath.limit() == offpath.MEMORY
            with pytest.raises(offpath.NotReady):
                offpath.require("a store read", STORE_READ)
        assert offpath.limit() == offpath.STORED
        offpath.require("a store read", STORE_READ)  # allowed again
        with offpath.only(offpath.STORED):
            assert offpath.limit() == offpath.STORED
        assert offpath.limit() == offpath.STORED
    assert offpath.limit() is None


def test_the_previous_limit_comes_back_when_the_block_raises():
    with offpath.only(offpath.MEMORY):
        with pytest.raises(offpath.NotReady), offpath.only(offpath.STORED):
            offpath.require("a probe", PROBE)
        assert offpath.limit() == offpath.MEMORY
        with pytest.raises(RuntimeError), offpath.only(offpath.STORED):
            raise RuntimeError("boom")
        assert offpath.limit() == offpath.MEMORY
    assert offpath.limit() is None


def test_a_limit_holds_for_the_calling_thread_only():
    seen: dict[str, object] = {}
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        seen["before"] = offpath.limit()
        try:
            offpath.require("a probe", PROBE)
            seen["probe"] = "allowed"
        except offpath.NotReady:
            seen["probe"] = "refused"
        with offpath.only(offpath.STORED):
            entered.set()
            leave.wait(5)
            seen["inside"] = offpath.limit()
        seen["after"] = offpath.limit()

    with offpath.only(offpath.MEMORY):
        thread = threading.Thread(target=other)
        thread.start()
        assert entered.wait(5)
        assert offpath.limit() == offpath.MEMORY  # the other thread's STORED is not ours
        leave.set()
        thread.join(5)
        assert offpath.limit() == offpath.MEMORY
    assert seen == {"before": None, "probe": "allowed", "inside": offpath.STORED, "after": None}
    assert offpath.limit() is None


def test_a_new_thread_starts_unlimited_even_when_its_parent_is_limited():
    found: list[object] = []
    with offpath.only(offpath.STORED):
        thread = threading.Thread(target=lambda: found.append(offpath.limit()))
        thread.start()
        thread.join(5)
    assert found == [None]


# ----- FUSEDATTN_SELECT_FIRST_CALLS ----------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("torch", "torch"), ("wait", "wait"), ("TORCH", "torch"), ("Wait", "wait"),
    (" wait ", "wait"), ("\ttorch\n", "torch"), ("  WaIt", "wait"),
])
def test_first_calls_takes_torch_or_wait_in_any_case_with_blanks_around(text, expected):
    assert settings.parse_first_calls(text) == expected


@pytest.mark.parametrize("text", ["later", "torch,wait", "0", "1", "t", "wai t", "", "   ", "cudnn"])
def test_first_calls_refuses_anything_else_naming_the_variable(text):
    with pytest.raises(ConfigError) as raised:
        settings.parse_first_calls(text)
    assert raised.value.field == settings.FIRST_CALLS == "FUSEDATTN_SELECT_FIRST_CALLS"
    assert raised.value.value == text
    assert str(raised.value).startswith("FUSEDATTN_SELECT_FIRST_CALLS=")
    assert "'torch'" in str(raised.value) and "'wait'" in str(raised.value)


def test_first_calls_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(settings.FIRST_CALLS, raising=False)
    assert settings.value(settings.FIRST_CALLS) == "torch"  # the default
    monkeypatch.setenv(settings.FIRST_CALLS, "")
    assert settings.value(settings.FIRST_CALLS) == "torch"  # empty: the default
    monkeypatch.setenv(settings.FIRST_CALLS, " WAIT ")
    assert settings.value(settings.FIRST_CALLS) == "wait"
    monkeypatch.setenv(settings.FIRST_CALLS, "soon")
    with pytest.raises(ConfigError, match="FUSEDATTN_SELECT_FIRST_CALLS"):
        settings.value(settings.FIRST_CALLS)
    with pytest.raises(ConfigError, match="FUSEDATTN_SELECT_FIRST_CALLS"):
        settings.check_all()
    settings.check_all(skip=(settings.FIRST_CALLS,))  # nothing else is wrong
