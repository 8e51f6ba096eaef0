"""The process's default store: where it lives, when it is memory, and the one warning when it must be."""

import logging
from pathlib import Path

from cache_dirs import unusable_cache_dir
from store_samples import H100, KEY, SUPPORTED_FULL, warnings_of

from fusedattn_select.store import (
    CACHE_DIR_ENV,
    CACHE_SWITCH_ENV,
    DATABASE_NAME,
    MemoryStore,
    PersistentStore,
    default_cache_dir,
    open_default_store,
)
from fusedattn_select.types import ProbeDepth


# ----- default store ----------------------------------------------------------------------------
def test_unwritable_directory_degrades_to_memory_with_one_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr("fusedattn_select.store.default._fallback_warning.given", False)
    with unusable_cache_dir(tmp_path, monkeypatch) as target:
        with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
            first, second = open_default_store(), open_default_store()
    assert isinstance(first, MemoryStore) and isinstance(second, MemoryStore)
    assert len(warnings_of(caplog)) == 1
    assert str(target) in warnings_of(caplog)[0].getMessage()
    first.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    assert first.info()["kind"] == "memory" and first.info()["entries"] == 1


def test_cache_off_keeps_decisions_in_memory(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "never-created"))
    monkeypatch.setenv(CACHE_SWITCH_ENV, "off")
    assert isinstance(open_default_store(), MemoryStore)
    assert not (tmp_path / "never-created").exists()


def test_default_store_is_sqlite_in_the_configured_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "configured"))
    monkeypatch.delenv(CACHE_SWITCH_ENV, raising=False)
    store = open_default_store()
    assert isinstance(store, PersistentStore)
    assert store.info()["path"] == str(tmp_path / "configured" / DATABASE_NAME)
    assert store.info()["kind"] == "sqlite"


def test_default_directory_is_under_the_user_cache_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "fusedattn-select"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "fusedattn-select"
