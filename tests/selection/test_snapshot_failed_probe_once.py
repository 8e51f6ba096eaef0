"""A snapshot's recorded failed probe is the same at every replay: select() warns of it once and answers
it from memory afterwards, as `why` does (no answer, not NONE); a live probe that failed is asked again."""

from __future__ import annotations

import logging

from fusedattn_select import AttnConfig
from fusedattn_select.types import Outcome
from fusedattn_select.selection.selector import Selector, selector_for

OOM = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=999, seqlen_kv=1024, head_dim_qk=128,
                 is_training=False)


def _failure_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "probe failed" in r.getMessage()]


def test_a_replayed_failure_warns_once_and_is_answered_from_memory(caplog, recorded_snapshot):
    selector = selector_for(recorded_snapshot)
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        answers = [selector.select(OOM) for _ in range(3)]
    assert _failure_warnings(caplog) == [
        "fusedattn_select: F16 forward probe failed at build_plans: CUDA out of memory (as recorded in the snapshot)"]
    assert [a.from_cache for a in answers] == [False, True, True]
    assert all(a.verdicts[0].outcome is Outcome.FAILED and not a.selected and not a.no_data for a in answers)
    assert selector.cache_info()["probe_failures"] == 1


def test_a_live_failure_is_probed_and_told_again(caplog, recording_engine):
    selector = Selector(recording_engine, bucket_forms=False)  # its own graphs, as a snapshot records
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        answers = [selector.select(OOM) for _ in range(2)]
    assert recording_engine.calls == 2 and len(_failure_warnings(caplog)) == 2
    assert not any(a.from_cache for a in answers)
