"""Both stores implement the Store protocol, with the attributes callers decide on."""

import os

from fusedattn_select.store import MemoryStore, PersistentStore, Store


def test_both_stores_satisfy_the_protocol(store):
    assert isinstance(store, Store)


def test_persistent_store_is_persistent_and_keeps_plans_in_a_private_directory(cache_dir):
    store = PersistentStore(cache_dir)
    assert (store.kind, store.persistent, store.plans_enabled) == ("sqlite", True, True)
    assert store.path == cache_dir / "decisions.sqlite3"


def test_persistent_store_disables_plans_while_its_directory_is_group_writable(cache_dir):
    store = PersistentStore(cache_dir)
    os.chmod(cache_dir, 0o770)
    try:
        assert store.plans_enabled is False
    finally:
        os.chmod(cache_dir, 0o700)
    assert store.plans_enabled is True


def test_memory_store_keeps_plans_for_this_process_only():
    store = MemoryStore()
    assert (store.kind, store.persistent, store.plans_enabled, store.path) == ("memory", False, True, None)
