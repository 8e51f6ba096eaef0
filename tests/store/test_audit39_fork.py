"""A process forked while another thread of its parent was inside the store: the child's store works.

A thread lock held by another thread at fork() stays held in the child for ever (that thread does
not exist there): a child that then used the store waited for ever on the database connection's
lock, or the key lock's timeout.
"""

import os
import subprocess
import sys
import threading
import time

import pytest

from fusedattn_select.store import MemoryStore, PersistentStore
from fusedattn_select.types import ProbeDepth
from store_samples import H100, verdicts
from tests.forking import in_forked_child

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                                reason="fork() with threads: POSIX (Linux) only")


# Holds the database's write lock for a while in another process (argv: the database file).
_BLOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(1.5)
conn.execute("COMMIT")
"""


def test_a_child_forked_while_a_thread_writes_can_write(cache_dir):
    store = PersistentStore(cache_dir)
    assert store.put(H100, "before", verdicts(), ProbeDepth.FULL)
    # While another process holds the write lock, the parent's writing thread waits inside its write
    # (holding the store's connection lock) when the main thread forks.
    blocker = subprocess.Popen([sys.executable, "-c", _BLOCKER, str(store.path)], stdout=subprocess.PIPE, text=True)
    assert blocker.stdout.readline().strip() == "held"
    writer = threading.Thread(target=store.put, args=(H100, "parent", verdicts(), ProbeDepth.FULL))
    writer.start()
    time.sleep(0.3)
    status = in_forked_child(lambda: store.put(H100, "child", verdicts(), ProbeDepth.FULL))
    writer.join()
    assert blocker.wait(10) == 0
    assert status == 0
    assert store.get(H100, "child") is not None and store.get(H100, "parent") is not None


def test_a_child_forked_while_a_thread_holds_a_key_lock_does_not_wait_for_that_thread(cache_dir):
    store = PersistentStore(cache_dir)
    held, release = threading.Event(), threading.Event()

    def probe():
        with store.key_lock(H100, "probe"):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=probe)
    thread.start()
    held.wait(10)

    def child() -> bool:
        # The parent's flock on the key still excludes this process until the parent's probe ends
        # (a second later); the thread that held the key in the parent does not exist here.
        with store.key_lock(H100, "probe", timeout=8) as exclusive:
            return exclusive

    threading.Timer(1.0, release.set).start()  # the parent's probe ends: its flock is released
    status = in_forked_child(child)
    thread.join()
    assert status == 0


def test_a_child_forked_while_a_thread_holds_the_memory_store_lock_can_use_it():
    store = MemoryStore()
    assert store.put(H100, "before", verdicts(), ProbeDepth.FULL)
    entered, release = threading.Event(), threading.Event()

    def hold():
        with store._lock:  # a thread inside a store operation at fork() (a short window, widened here)
            entered.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    entered.wait(10)
    status = in_forked_child(lambda: store.put(H100, "child", verdicts(), ProbeDepth.FULL)
                              and store.get(H100, "before") is not None, limit_s=10)
    release.set()
    thread.join()
    assert status == 0
