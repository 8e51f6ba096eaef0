"""The -v line of a new answer words a failed probe (out of memory) as `why` and `matrix` do: no answer,
never "-> NONE" (a refusal). A snapshot row whose recorded probe failed is replayed through the selector;
RecordingTestEngine (tests/conftest.py, a test double) fails the probe of seqlen_q == 999."""

from __future__ import annotations

import logging

from fusedattn_select import AttnConfig
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.selector import Selector

OUT_OF_MEMORY = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=999, seqlen_kv=1024,
                           head_dim_qk=128, is_training=False)


def answer_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and " ms -> " in r.getMessage()]


def test_a_replayed_failed_probe_is_logged_as_no_answer_not_none(caplog, recorded_snapshot):
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    selection = Selector(SnapshotEngine.load(recorded_snapshot)).select(OUT_OF_MEMORY)
    assert not selection.selected
    (line,) = answer_lines(caplog)
    assert "-> no answer (probe failed) (F16 forward probe failed at build_plans: CUDA out of memory)" in line
    assert "-> NONE" not in line


def test_a_failed_probe_here_is_logged_as_no_answer_too(caplog, recording_engine):
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    Selector(recording_engine, bucket_forms=False).select(OUT_OF_MEMORY)  # its own graphs
    (line,) = answer_lines(caplog)
    assert line.startswith("fusedattn_select: probed ") and "-> no answer (probe failed)" in line


def test_a_refusal_and_a_selection_keep_their_backend(caplog, recording_engine):
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    selector = Selector(recording_engine, bucket_forms=False)
    selector.select(AttnConfig(batch_size=1, num_heads_q=8, num_heads_kv=8, seqlen_q=128, seqlen_kv=128, head_dim_qk=512))
    selector.select(AttnConfig(batch_size=1, num_heads_q=8, num_heads_kv=8, seqlen_q=128, seqlen_kv=128, head_dim_qk=64))
    refused, selected = answer_lines(caplog)
    assert "-> NONE (F16 forward and backward not supported at check_support: head dim above 256" in refused
    assert selected.endswith("-> F16")
