"""OncePerKey: values built once per key under concurrency, other keys not blocked."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from fusedattn_select.single_flight import OncePerKey


def test_sixteen_threads_asking_one_missing_key_build_it_once():
    table: OncePerKey[int] = OncePerKey()
    calls = []

    def build():
        calls.append(1)
        time.sleep(0.05)
        return 42

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: table.get_or_build("k", build), range(16)))
    assert len(calls) == 1
    assert [value for value, _ in results] == [42] * 16
    assert sum(built for _, built in results) == 1


def test_a_slow_build_of_one_key_does_not_block_another_key():
    table: OncePerKey[str] = OncePerKey()
    release = threading.Event()
    slow = threading.Thread(target=table.get_or_build, args=("slow", lambda: release.wait(5) and "slow"))
    slow.start()
    started = time.perf_counter()
    value, built = table.get_or_build("fast", lambda: "fast")
    assert (value, built) == ("fast", True) and time.perf_counter() - started < 1.0
    release.set()
    slow.join()
    assert table.get("slow") == "slow" and len(table) == 2


def test_a_build_that_raises_leaves_the_key_missing_for_the_next_caller():
    table: OncePerKey[int] = OncePerKey()

    def fail():
        raise RuntimeError("no")

    try:
        table.get_or_build("k", fail)
    except RuntimeError:
        pass
    assert table.get("k") is None
    assert table.get_or_build("k", lambda: 7) == (7, True)


def test_clear_forgets_every_value():
    table: OncePerKey[int] = OncePerKey()
    table.get_or_build("a", lambda: 1)
    table.clear()
    assert table.get("a") is None and len(table) == 0
