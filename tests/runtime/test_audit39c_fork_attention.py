"""attention() on CPU in a process forked while another thread of its parent was inside the runtime:
the child runs its calls (torch DataLoader workers fork on Linux, as pre-fork servers do).

A thread lock, or a single-flight build, that another thread held at fork() stays held in the child
for ever (that thread does not exist there). Answers come from the bundled H100 snapshots, held
open in the parent by SlowSnapshotEngine (tests/core/test_audit39c_fork.py: a timing double).
"""

from __future__ import annotations

import os
import sys
import threading

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.reference.autograd_reference import reference_attention_bshd  # noqa: E402
from fusedattn_select.runtime import api as dispatch  # noqa: E402
from fusedattn_select.runtime.api import attention  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.run_settings import run_settings  # noqa: E402
from fusedattn_select.selection.selector import Selector, set_default_selector  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core"))
from test_audit39c_fork import SlowSnapshotEngine  # noqa: E402
from tests.forking import forked_while_held, in_forked_child  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                                reason="fork() with threads: POSIX (Linux) only")


@pytest.fixture
def one_cpu_thread():
    # The child's torch runs on one thread: no intra-op pool to start after fork().
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tensors():
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 6, h, 8, generator=gen, dtype=torch.bfloat16) for h in (4, 2, 2))


def test_a_child_forked_while_a_thread_decides_a_call_runs_that_call(one_cpu_thread):
    engine = SlowSnapshotEngine()
    old = set_default_selector(Selector(engine))
    dispatch.clear_plans()
    q, k, v = _tensors()
    expected = reference_attention_bshd(q.float(), k.float(), v.float(), mask="causal")
    thread = threading.Thread(target=attention, args=(q, k, v), kwargs={"mask": "causal"})
    thread.start()
    try:
        assert engine.entered.wait(10)  # the thread is deciding the call signature, inside its replay
        status = in_forked_child(
            lambda: torch.allclose(attention(q, k, v, mask="causal").float(), expected, atol=2e-2, rtol=2e-2))
    finally:
        engine.release.set()
        thread.join()
        dispatch.clear_plans()
        set_default_selector(old)
    assert status == 0


LOCKS = ("lock", "choices_lock", "plan_stats_lock", "workspace_lock", "worker_lock", "ahead_lock", "native_lock",
         "log_lock")


@pytest.mark.parametrize("name", LOCKS)
def test_a_child_forked_while_a_thread_holds_a_dispatcher_lock_can_take_it(name):
    assert forked_while_held(getattr(dispatcher, name), lambda: getattr(dispatcher, name).acquire(timeout=5)) == 0


def test_a_child_forked_while_a_thread_submits_a_job_can_submit_one():
    assert forked_while_held(dispatcher.preparer._lock,
                             lambda: dispatcher.preparer.submit(lambda: 7).result(timeout=5) == 7) == 0


def test_a_child_forked_while_a_thread_changes_the_settings_can_change_them():
    assert forked_while_held(run_settings._lock,
                             lambda: run_settings.replace(first_calls="wait").first_calls == "wait") == 0
