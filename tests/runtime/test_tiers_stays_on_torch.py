"""Defect 5: a re-decision on the caller's geometry that fails keeps torch, says why once and counts it."""
import logging

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime import tiers
from fusedattn_select.runtime.dispatcher import Job, dispatcher
from fusedattn_select.runtime.entries import Entry
from test_tiers_cpu import CFG, opts_of


def test_a_failed_redecision_on_the_callers_strides_keeps_torch_says_why_and_counts(monkeypatch, caplog):
    # The real entries.new_entry under offpath.MEMORY: on a CPU nothing of it is in memory.
    monkeypatch.setitem(dispatcher.counters, "stays_on_torch", 0)
    q = torch.randn(2, 16, 4, 64, dtype=torch.bfloat16)
    k = v = torch.randn(2, 4096, 4, 64, dtype=torch.bfloat16)[:, :16]  # rows of a longer cache
    waiting, job = Entry(opts_of(q, k, v), cfg=CFG), Job()
    waiting.waiting = job
    job.set_result(Entry(opts_of(q, k, v), cfg=CFG))  # fused, decided on compact dummies
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    found = tiers.swap(waiting, job, q, k, v, run_decided=None)
    assert found is waiting and "caller's strides" in waiting.torch_because
    said = [r.getMessage() for r in caplog.records if "stays on torch" in r.getMessage()]
    assert len(said) == 1 and "(no reason given)" not in said[0]
    assert dispatcher.counters["stays_on_torch"] == 1
    assert tiers.swap(waiting, job, q, k, v, run_decided=None) is waiting  # once: no second line
    assert dispatcher.counters["stays_on_torch"] == 1
