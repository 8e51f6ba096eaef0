"""attention() on CPU tensors falls back because no fused kernel runs CPU tensors: its warning leads with
that, whether the bundled snapshot records the problem ("F16 selected") or not ("no data"), once."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime.api import attention  # noqa: E402

CPU_LEAD = "falls back to torch SDPA for {key}: the tensors are on cpu, where no fused kernel runs; "


def fallback_messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "fusedattn_select" and "falls back" in r.getMessage()]


def run_twice(batch, heads, seqlen, head_dim, mask):
    q = torch.randn(batch, seqlen, heads, head_dim, dtype=torch.bfloat16)
    with torch.no_grad():
        attention(q, q, q, mask=mask)
        attention(q, q, q, mask=mask)


def test_a_problem_the_snapshot_does_not_record_falls_back_for_the_cpu_not_for_no_data(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    run_twice(1, 2, 17, 64, "causal")
    (message,) = fallback_messages(caplog)
    assert CPU_LEAD.format(key="467b4b6502aa8301fad5c7d3c943e352") in message
    # select()'s answer is context after the reason, labelled as select()'s, never the reason it falls back.
    assert "select() answers: F16 forward no data at snapshot" in message
    assert ": F16 forward no data" not in message.split("; ")[0]


def test_a_recorded_problem_falls_back_for_the_cpu_and_says_what_select_answers(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    run_twice(8, 12, 512, 64, "no_mask")  # bert-base infer-nomask in h100-configs.json: F16 supported
    (message,) = fallback_messages(caplog)
    assert CPU_LEAD.format(key="e8da03558d07fa2df45b1bda0d57ba8b") in message
    assert message.endswith("select() answers: F16 (snapshot:h100-configs.json+h100-hopper-suite.json+"
                            "h100-models.json)")
