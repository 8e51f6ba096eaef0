"""Answers that another thread changes meanwhile: a build failure recorded after a clear_cache(), and
a bucket forgotten while a lookup of a shape it holds runs. Answers come from the bundled H100
snapshots (a recorded problem cuDNN selects F16 for); the failures are what a plan build reports."""

from __future__ import annotations

import logging

from fusedattn_select import AttnConfig, Backend
from fusedattn_select.planning.bucket_index import BucketIndex
from fusedattn_select.probing.choice import bundled_engine
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store import MemoryStore
from fusedattn_select.types import Fingerprint, Outcome, Phase, ProbeDepth, Verdict

CFG = AttnConfig(batch_size=4, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128,
                 mask="causal")
NO_KERNEL = Verdict(Backend.F16, Phase.BACKWARD, Outcome.UNSUPPORTED, "build_plans", "no kernel for this graph",
                    depth=ProbeDepth.FULL)


def _selector(store=None) -> Selector:
    return Selector(bundled_engine("h100"), store=store, bucket_forms=False)


def test_a_build_failure_after_the_memory_was_cleared_is_stored_and_said(caplog):
    store = MemoryStore()
    selector = _selector(store)
    assert selector.select(CFG).backend is Backend.F16
    selector.clear()  # clear_cache() while the graph was building
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        selector.record_build_failure(CFG, NO_KERNEL)
    assert [r.getMessage() for r in caplog.records] == [
        "fusedattn_select: F16 backward not supported at build_plans: no kernel for this graph; "
        "cached answer flipped to NONE"]
    flipped = selector.select(CFG)
    assert flipped.backend is Backend.NONE and flipped.reasons == (NO_KERNEL.reason(),)
    assert {v.phase: v.supported for v in flipped.verdicts} == {Phase.FORWARD: True, Phase.BACKWARD: False}
    assert _selector(store).select(CFG).backend is Backend.NONE  # another process, the same store


def test_a_build_failure_with_no_answer_held_anywhere_answers_none_from_then_on():
    selector = _selector()
    assert selector.select(CFG).backend is Backend.F16
    selector.clear()
    selector.record_build_failure(CFG, NO_KERNEL)
    assert selector.select(CFG).reasons == (NO_KERNEL.reason(),)


def test_a_bucket_forgotten_while_a_lookup_runs_is_not_remembered_as_its_answer():
    index = BucketIndex(None, Fingerprint(platform="cuda"))
    shape = CFG.replace(batch_size=3, seqlen_q=100, seqlen_kv=100)
    large = index.find(CFG.replace(batch_size=8, seqlen_q=2048, seqlen_kv=2048))
    index.remember(large)
    look = index._find

    def forgotten_meanwhile(cfg, scan=True):
        # The lookup read the buckets; another thread's failed build forgets the one it found.
        found = look(cfg, scan)
        index.forget(large)
        return found

    index._find = forgotten_meanwhile
    assert index.find(shape) is large  # what this lookup read
    index._find = look
    assert index.find(shape) is not large and index.find(shape).batch_size == 4  # its own bucket now
