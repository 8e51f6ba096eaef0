"""A process forked while another thread of its parent was inside the selector or a single-flight
table: the child answers (DataLoader workers, pre-fork servers and multiprocessing fork this way).

A thread lock or an in-flight answer that another thread held at fork() stays held in the child for
ever (that thread does not exist there): the child asking the same question waited for good.
Answers come from the bundled H100 snapshots; SlowSnapshotEngine only holds the parent's first
replay open until the test lets it go (a timing double: the verdicts are the recording's).
"""

from __future__ import annotations

import os
import sys
import threading

import pytest

from fusedattn_select import AttnConfig
from fusedattn_select.planning.bucket_index import BucketIndex
from fusedattn_select.probing.choice import bundled_engine
from fusedattn_select.selection import selector as selector_module
from fusedattn_select.selection.selector import Selector, default_selector, set_default_selector
from fusedattn_select.single_flight import OncePerKey
from fusedattn_select.types import Fingerprint
from tests.forking import forked_while_held, in_forked_child

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                                reason="fork() with threads: POSIX (Linux) only")

CFG = AttnConfig(batch_size=4, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128,
                 mask="causal")


class SlowSnapshotEngine:
    """TEST DOUBLE for timing only: the bundled snapshots' engine whose replays in the parent wait
    for `release` (after saying `entered`); in a forked child it replays at once."""

    def __init__(self) -> None:
        self._engine = bundled_engine("h100")
        self._parent = os.getpid()
        self.entered, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def probe(self, cfg, backend, phase, depth):
        if os.getpid() == self._parent:
            self.entered.set()
            self.release.wait(30)
        return self._engine.probe(cfg, backend, phase, depth)


def _while_a_thread_is_inside(start, engine: SlowSnapshotEngine, child) -> int:
    """Start `start` on a thread, fork once its replay waits, run `child` there; then let it finish."""
    thread = threading.Thread(target=start)
    thread.start()
    try:
        assert engine.entered.wait(10)
        return in_forked_child(child)
    finally:
        engine.release.set()
        thread.join()


def test_a_child_forked_while_a_thread_builds_a_key_builds_it_itself():
    table: OncePerKey[str] = OncePerKey()
    entered, release = threading.Event(), threading.Event()

    def slow() -> str:
        entered.set()
        release.wait(30)
        return "parent"

    thread = threading.Thread(target=table.get_or_build, args=("key", slow))
    thread.start()
    entered.wait(10)
    status = in_forked_child(lambda: table.get_or_build("key", lambda: "child") == ("child", True), limit_s=10)
    release.set()
    thread.join()
    assert status == 0
    assert table.get("key") == "parent"


def test_a_child_forked_while_a_thread_replays_a_problem_answers_it():
    engine = SlowSnapshotEngine()
    selector = Selector(engine)
    expected = Selector(bundled_engine("h100")).select(CFG)
    assert expected.selected  # a recorded problem: the child's answer is the recording's
    status = _while_a_thread_is_inside(lambda: selector.select(CFG), engine,
                                       lambda: selector.select(CFG).backend is expected.backend)
    assert status == 0
    assert selector.select(CFG).backend is expected.backend


def test_a_child_forked_while_a_thread_counts_a_cache_hit_answers_from_its_cache():
    selector = Selector(bundled_engine("h100"))
    selector.select(CFG)
    expected = selector.select(CFG)  # a cache hit, as the child's
    assert expected.from_cache
    # a thread counting a hit at fork() (a short window, widened here)
    status = forked_while_held(selector._lock, lambda: selector.select(CFG) == expected)
    assert status == 0


def test_a_child_forked_while_a_thread_makes_the_process_wide_selector_makes_its_own(monkeypatch):
    parent, entered, release = os.getpid(), threading.Event(), threading.Event()
    made = selector_module.selector_for

    def slow_selector_for(snapshots=None, target=None) -> Selector:
        if os.getpid() == parent:  # the parent's thread is inside, holding the lock that makes it
            entered.set()
            release.wait(30)
        return made(target="h100")

    old = set_default_selector(None)
    monkeypatch.setattr(selector_module, "selector_for", slow_selector_for)
    thread = threading.Thread(target=default_selector)
    thread.start()
    try:
        entered.wait(10)
        status = in_forked_child(lambda: default_selector().select(CFG).backend is not None)
    finally:
        release.set()
        thread.join()
        set_default_selector(old)
    assert status == 0


def test_a_child_forked_while_a_thread_learns_a_bucket_can_learn_one():
    index = BucketIndex(None, Fingerprint(platform="cuda"))
    form = index.find(CFG)

    def child() -> bool:
        index.remember(form)
        return index.find(CFG) is form

    status = forked_while_held(index._lock, child)  # a thread learning a bucket at fork()
    assert status == 0


def test_a_child_forked_while_a_thread_pins_an_answer_can_clear_and_answer():
    selector = Selector(bundled_engine("h100"))
    expected = selector.select(CFG)

    def child() -> bool:
        selector.clear()
        return selector.select(CFG).backend == expected.backend

    status = forked_while_held(selector.planner._lock, child)  # a thread pinning or clearing answers at fork()
    assert status == 0
