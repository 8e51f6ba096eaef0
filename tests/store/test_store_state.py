"""What a store says about itself: degraded, switched off, plans refused, read-only; and the
library's answer to a FUSEDATTN_SELECT_CACHE value it does not take."""

import logging
import os

import pytest
from cache_dirs import unusable_cache_dir
from store_samples import H100, KEY, SUPPORTED_FULL, warnings_of

from fusedattn_select.errors import ConfigError
from fusedattn_select.store import CACHE_DIR_ENV, CACHE_SWITCH_ENV, MemoryStore, PersistentStore, open_default_store
from fusedattn_select.store.protocol import STATE_KEYS
from fusedattn_select.store.store_settings import check_cache_switch
from fusedattn_select.types import ProbeDepth


@pytest.fixture
def unusable_dir(tmp_path, monkeypatch):
    with unusable_cache_dir(tmp_path, monkeypatch) as target:
        yield target


def test_every_store_reports_its_state_keys(cache_dir):
    for store in (PersistentStore(cache_dir), MemoryStore()):
        assert set(STATE_KEYS) <= set(store.info())


def test_default_store_in_an_unusable_directory_is_memory_that_says_why(unusable_dir):
    info = open_default_store().info()
    assert (info["kind"], info["persistent"]) == ("memory", False)
    assert str(unusable_dir) in info["degraded"] and info["switched_off"] is None


def test_read_only_default_store_is_degraded_exactly_when_a_writer_would_be(unusable_dir):
    info = open_default_store(read_only=True).info()
    assert info["degraded"] and str(unusable_dir) in info["degraded"]
    assert not unusable_dir.exists()


def test_read_only_store_of_a_missing_directory_is_empty_and_creates_nothing(tmp_path):
    store = PersistentStore(tmp_path / "not-yet", read_only=True)
    assert (store.info()["entries"], store.info()["read_only"]) == (0, True)
    assert store.get(H100, KEY) is None
    assert not (tmp_path / "not-yet").exists()


def test_switched_off_store_says_so_and_is_not_degraded(monkeypatch):
    monkeypatch.setenv(CACHE_SWITCH_ENV, "off")
    info = open_default_store().info()
    assert (info["switched_off"], info["degraded"]) == ("FUSEDATTN_SELECT_CACHE=off", None)


def test_group_writable_directory_reports_plans_refused(cache_dir):
    os.chmod(cache_dir, 0o770)
    info = PersistentStore(cache_dir).info()
    assert info["plans_enabled"] is False and "mode 770" in info["plans_refused"]


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_a_log_file_writable_by_others_refuses_plans_and_is_named(cache_dir, suffix):
    # SQLite reads committed rows from the -wal file (through the -shm index): a plan planted there loads.
    store = PersistentStore(cache_dir)
    assert store.put_plan(H100, "plan-fwd", b"native code")
    log_file = cache_dir / f"decisions.sqlite3{suffix}"
    os.chmod(log_file, 0o666)
    try:
        assert store.get_plan(H100, "plan-fwd") is None
        info = store.info()
        assert info["plans_enabled"] is False
        assert info["plans_refused"] == f"{log_file} is writable by group or others (mode 666)"
    finally:
        os.chmod(log_file, 0o600)
    assert store.get_plan(H100, "plan-fwd") == b"native code"


def test_unknown_cache_switch_warns_once_and_means_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(CACHE_SWITCH_ENV, "perhaps")
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        first, second = open_default_store(), open_default_store()
    assert isinstance(first, PersistentStore) and isinstance(second, PersistentStore)
    messages = [r.getMessage() for r in warnings_of(caplog)]
    assert len(messages) == 1
    assert "FUSEDATTN_SELECT_CACHE='perhaps': must be one of on, 1, true, yes" in messages[0]
    assert messages[0].endswith("using the persistent cache")
    assert first.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)


def test_check_cache_switch_raises_a_config_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(CACHE_SWITCH_ENV, "maybe")
    with pytest.raises(ConfigError, match=r"^FUSEDATTN_SELECT_CACHE='maybe': must be one of on, 1, true, yes"):
        check_cache_switch()
    for value in ("on", "OFF", " yes ", "0", ""):
        monkeypatch.setenv(CACHE_SWITCH_ENV, value)
        check_cache_switch()
