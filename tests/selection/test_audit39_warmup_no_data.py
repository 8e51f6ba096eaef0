"""warmup() through the library (not the CLI): a problem the answering source holds no data for is
marked no_data in its row (and its JSON), and the log line says how many; a refusal is not."""

from __future__ import annotations

import json
import logging

from fusedattn_select import AttnConfig, warmup
from fusedattn_select.selection.local_warmup import WarmupOutcome
from fusedattn_select.selection.selector import Selector, selector_for

SUITE = "fusedattn_select/snapshots/h100-hopper-suite.json"


def _recorded(name: str) -> AttnConfig:
    with open(SUITE) as handle:
        entry = next(e for e in json.load(handle)["entries"] if e["name"] == name)
    return AttnConfig.from_dict(entry["config"])


REFUSED = _recorded("bf16-d60-causal-mha-infer")  # cuDNN: hidden_dim should be multiple of 8
UNRECORDED = AttnConfig(batch_size=3, num_heads_q=7, num_heads_kv=7, seqlen_q=77, seqlen_kv=99, head_dim_qk=40,
                        mask="causal", is_training=False)


def test_a_problem_the_snapshot_did_not_record_is_no_data_and_a_refusal_is_not(caplog):
    selector = selector_for(SUITE)
    with caplog.at_level(logging.INFO, logger="fusedattn_select"):
        report = warmup([("refused", REFUSED), ("unrecorded", UNRECORDED)], selector=selector, depth="fast")
    rows = {row.name: row for row in report.rows}
    assert selector.select(UNRECORDED).no_data and not selector.select(REFUSED).no_data
    assert rows["unrecorded"].no_data and rows["unrecorded"].to_dict()["no_data"] is True
    assert not rows["refused"].no_data and rows["refused"].to_dict()["no_data"] is False
    assert {row.outcome for row in report.rows} == {WarmupOutcome.REJECTED}
    summary = [r.getMessage() for r in caplog.records if "warmup (fast" in r.getMessage()]
    assert len(summary) == 1 and summary[0].endswith("; 1 of the rejected have no data (only a live probe can answer them)")


def test_without_any_engine_every_row_is_no_data():
    report = warmup([UNRECORDED, REFUSED], selector=Selector(None, unavailable_reason="no GPU here"), depth="fast")
    assert [row.no_data for row in report.rows] == [True, True]
