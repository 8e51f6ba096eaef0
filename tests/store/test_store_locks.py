"""Key locks: one prober per key across processes, re-entrant in one thread, independent per key."""

import multiprocessing
import time

from store_samples import H100, KEY

from fusedattn_select.store import PersistentStore


def _hold_key_lock(directory, holder_locked, waiter_trying, times):
    store = PersistentStore(directory)
    with store.key_lock(H100, KEY) as exclusive:
        holder_locked.set()
        waiter_trying.wait(60)
        time.sleep(0.3)  # the waiter is blocked on the lock now
        times["holder_released"] = time.time()
    times["holder_exclusive"] = exclusive


def _wait_for_key_lock(directory, holder_locked, waiter_trying, times):
    store = PersistentStore(directory)
    holder_locked.wait(60)
    waiter_trying.set()
    times["waiter_tried"] = time.time()
    with store.key_lock(H100, KEY) as exclusive:
        times["waiter_acquired"] = time.time()
    times["waiter_exclusive"] = exclusive


def test_key_lock_excludes_a_second_process(cache_dir):
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        times = manager.dict()
        holder_locked, waiter_trying = context.Event(), context.Event()
        args = (str(cache_dir), holder_locked, waiter_trying, times)
        processes = [context.Process(target=_hold_key_lock, args=args),
                     context.Process(target=_wait_for_key_lock, args=args)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
        times = dict(times)
    assert [p.exitcode for p in processes] == [0, 0]
    assert times["holder_exclusive"] and times["waiter_exclusive"]
    assert times["waiter_acquired"] >= times["holder_released"]
    assert times["waiter_acquired"] - times["waiter_tried"] >= 0.25


def test_key_lock_is_reentrant_in_one_thread(store):
    with store.key_lock(H100, KEY, timeout=2) as outer:
        with store.key_lock(H100, KEY, timeout=2) as inner:
            assert outer and inner


def test_key_lock_of_another_key_does_not_wait(store):
    with store.key_lock(H100, KEY, timeout=2):
        started = time.monotonic()
        with store.key_lock(H100, "another-key", timeout=2) as exclusive:
            assert exclusive
        assert time.monotonic() - started < 1
