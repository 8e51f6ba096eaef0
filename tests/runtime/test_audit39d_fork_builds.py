"""A process forked while another thread of its parent was inside the compiled module's background
build or the plan worker's job table: the child starts its build and hands its jobs to a worker of its
own (DataLoader workers, pre-fork servers).

A thread lock held by another thread at fork() stays held in the child for ever (that thread does not
exist there): the child's first attention() call that started the build or asked the worker waited for
good.
"""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("torch")

from fusedattn_select.runtime import dense_builds  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.native.autobuild import BackgroundBuild  # noqa: E402
from tests.forking import forked_while_held  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                                reason="fork() with threads: POSIX (Linux) only")


def test_a_child_forked_while_a_thread_starts_the_background_build_starts_its_own(tmp_path):
    build = BackgroundBuild()

    def child() -> bool:
        # No CUDA here: the build's own thread finds it cannot start and says so; start() returns at once.
        build.start(tmp_path / "module.so", lambda: [], lambda: None, device=0)
        return build.started

    status = forked_while_held(build._lock, child)  # a thread starting the build, or counting it built, at fork()
    assert status == 0
    assert not build.started  # the parent's build is the parent's own


class _Held:
    """Several locks held as one (by the thread forked_while_held starts)."""

    def __init__(self, *locks) -> None:
        self.locks = locks

    def __enter__(self) -> None:
        for lock in self.locks:
            lock.acquire()

    def __exit__(self, *exc) -> None:
        for lock in reversed(self.locks):
            lock.release()


def test_a_child_forked_while_a_thread_uses_the_worker_hands_its_job_to_a_worker_of_its_own(monkeypatch):
    worker = dense_builds._Worker()
    monkeypatch.setattr(dispatcher, "worker", worker)
    job = {"kind": "fork test: not a job the worker knows", "store_dir": "", "device": 0}
    try:
        # At fork() a thread of the parent submits a job (the worker's lock) while its reader waits for the
        # worker process (Popen's wait lock: poll() in the child cannot tell that the worker is not its own).
        status = forked_while_held(_Held(worker.lock, worker.process._waitpid_lock),
                                   lambda: dense_builds._submit(job) is not None and dispatcher.worker is not worker)
    finally:
        worker.close()
        worker.process.wait(30)
    assert status == 0
