"""A process forked while another thread of its parent held the lock of a once-per-process warning
about the store (the cache switch's invalid value, the fall back to memory): the child opens its store.

A thread lock held by another thread at fork() stays held in the child for ever (that thread does not
exist there): the child's first open_default_store() waited for good.
"""

from __future__ import annotations

import os
import sys

import pytest
from cache_dirs import unusable_cache_dir

from fusedattn_select.store import CACHE_SWITCH_ENV, MemoryStore, default, open_default_store, store_settings
from tests.forking import forked_while_held

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                                reason="fork() with threads: POSIX (Linux) only")


def test_a_child_forked_while_a_thread_warns_of_the_memory_fallback_opens_its_store(tmp_path, monkeypatch):
    with unusable_cache_dir(tmp_path, monkeypatch):
        # a thread deciding whether to warn of the fall back to memory at fork()
        status = forked_while_held(default._fallback_warning.lock,
                                   lambda: isinstance(open_default_store(), MemoryStore))
    assert status == 0


def test_a_child_forked_while_a_thread_warns_of_an_invalid_cache_switch_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_SWITCH_ENV, "fork-test-not-a-value")  # a value it does not take: on, warned once
    # a thread deciding whether an invalid value was warned about at fork()
    status = forked_while_held(store_settings._warned._lock, lambda: store_settings.cache_switched_off() == "")
    assert status == 0
