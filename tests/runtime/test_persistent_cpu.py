"""streams.persistent off CUDA, and the allocating thread's guard against waiting on itself."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.streams import persistent  # noqa: E402


def test_a_cpu_tensor_is_made_on_the_calling_thread():
    made_on = []
    out = persistent(lambda: made_on.append(threading.current_thread()) or torch.ones(3), torch.device("cpu"))
    assert made_on == [threading.current_thread()] and out.tolist() == [1.0, 1.0, 1.0]


def test_a_job_of_the_allocating_thread_that_asks_it_again_does_not_wait_for_ever():
    inner = torch.device("cuda", 0)  # never used: the guard answers before any CUDA call

    def job():
        assert dispatcher.allocator.runs_here()
        return persistent(lambda: torch.zeros(2), inner)

    done = dispatcher.allocator.submit(job)
    assert done.result(timeout=30).tolist() == [0.0, 0.0]
    assert not dispatcher.allocator.runs_here()
