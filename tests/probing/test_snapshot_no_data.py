"""No data is its own answer: a problem a snapshot does not hold is NO_DATA, never UNSUPPORTED.

Issue 13, findings 2 and 5: "not recorded in the snapshot" looked exactly like "cuDNN refuses it",
and a "yes" recorded at depth fast answered a question at depth full. Snapshots here are recorded
with RecordingTestEngine (tests/conftest.py), a test double; the merge rules are the library's.
"""

from __future__ import annotations

import json
import logging

import pytest

from fusedattn_select import AttnConfig, Backend
from fusedattn_select.config_files import load_config_file
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.result import Selection
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store import MemoryStore
from fusedattn_select.types import Outcome, Phase, ProbeDepth, Provenance, Verdict, rejection_line


@pytest.fixture
def engine(recorded_snapshot):
    return SnapshotEngine.load(recorded_snapshot)


@pytest.fixture
def suite(suite_file):
    return load_config_file(suite_file)


def full_recorded(snapshot_path, tmp_path):
    """The same snapshot with every verdict marked as recorded at depth full."""
    data = json.loads(snapshot_path.read_text())
    for entry in data["entries"]:
        for verdict in entry["verdicts"]:
            verdict["depth"] = "full"
    path = tmp_path / "full.json"
    path.write_text(json.dumps(data))
    return SnapshotEngine.load(path)


def test_fast_recorded_yes_asked_at_full_is_no_data_at_its_recorded_depth(engine, suite):
    cfg = suite.get("infer").config
    verdict = engine.probe(cfg, Backend.F16, Phase.FORWARD, ProbeDepth.FULL)
    assert verdict.outcome is Outcome.NO_DATA and verdict.depth is ProbeDepth.FAST
    assert verdict.message.startswith("recorded at depth fast in test-gpu.json (check_support passed")
    assert verdict.timings_ms == (("validate", 0.25), ("check_support", 2.5))  # as recorded


def test_fast_recorded_no_answers_a_question_at_full(engine, suite):
    verdict = engine.probe(suite.get("head-dim-512").config, Backend.F16, Phase.FORWARD, ProbeDepth.FULL)
    assert verdict.outcome is Outcome.UNSUPPORTED and verdict.message == "head dim above 256"


def test_full_recorded_yes_answers_both_depths(recorded_snapshot, tmp_path, suite):
    engine = full_recorded(recorded_snapshot, tmp_path)
    for depth in (ProbeDepth.FAST, ProbeDepth.FULL):
        verdict = engine.probe(suite.get("infer").config, Backend.F16, Phase.FORWARD, depth)
        assert verdict.outcome is Outcome.SUPPORTED and verdict.depth is ProbeDepth.FULL
    # Built is not verified: a full-recorded yes is no data at depth verify.
    verdict = engine.probe(suite.get("infer").config, Backend.F16, Phase.FORWARD, ProbeDepth.VERIFY)
    assert verdict.outcome is Outcome.NO_DATA and "recorded at depth full" in verdict.message
    assert "only a live probe at depth verify" in verdict.message


def test_selector_keeps_the_fast_yes_after_a_full_question_found_no_data(engine, suite):
    selector = Selector(engine)
    cfg = suite.get("infer").config
    assert selector.select(cfg, "fast").backend is Backend.F16
    full = selector.select(cfg, "full")
    assert full.backend is Backend.NONE and full.no_data
    assert selector.select(cfg, "fast").backend is Backend.F16
    assert selector.select(cfg, "full").no_data and selector.select(cfg, "full").from_cache


def test_no_data_is_never_written_to_the_store(engine, suite):
    store = MemoryStore()
    selector = Selector(engine, store=store)
    selector.select(suite.get("infer").config.replace(batch_size=3))
    selector.select(suite.get("infer").config, "full")
    assert store.info()["entries"] == 0
    selector.select(suite.get("infer").config, "fast")
    assert store.info()["entries"] == 1


def test_a_refusal_and_no_data_together_are_a_refusal():
    # One refusal decides the answer (NONE) whatever else is unknown: the selection is not "no data".
    refused = Verdict(Backend.F16, Phase.FORWARD, Outcome.UNSUPPORTED, "check_support", "no")
    unknown = Verdict(Backend.F16, Phase.BACKWARD, Outcome.NO_DATA, "snapshot", "not recorded")
    assert not Selection(Backend.NONE, "", verdicts=(refused, unknown)).no_data
    assert Selection(Backend.NONE, "", verdicts=(unknown,)).no_data
    assert not Selection(Backend.F16, "", verdicts=(Verdict(Backend.F16, Phase.FORWARD, Outcome.SUPPORTED, "x"),)).no_data


def test_no_data_reads_as_no_data_never_as_not_supported():
    line = rejection_line(Backend.F16, (Phase.FORWARD, Phase.BACKWARD), Outcome.NO_DATA, "snapshot", "not recorded")
    assert line == "F16 forward and backward no data at snapshot: not recorded"


def test_selection_json_says_no_data(engine, suite):
    document = Selector(engine).select(suite.get("infer").config.replace(batch_size=3)).to_dict()
    assert document["no_data"] is True and {v["outcome"] for v in document["verdicts"]} == {"no_data"}


def test_no_engine_at_all_is_no_data():
    selection = Selector(None, unavailable_reason="no NVIDIA driver").select(
        AttnConfig(batch_size=1, num_heads_q=4, num_heads_kv=4, seqlen_q=64, seqlen_kv=64, head_dim_qk=64))
    assert selection.no_data and {v.provenance for v in selection.verdicts} == {Provenance.RULE}


def test_snapshot_lookups_are_logged_at_debug(engine, suite, caplog):
    caplog.set_level(logging.DEBUG, logger="fusedattn_select")
    Selector(engine).select(suite.get("infer").config)
    lookups = [r.getMessage() for r in caplog.records if "snapshot lookup" in r.getMessage()]
    assert len(lookups) == 1 and lookups[0].endswith("in test-gpu.json: supported (recorded at depth fast)")
    assert all(r.levelno == logging.DEBUG for r in caplog.records if "snapshot lookup" in r.getMessage())
    replayed = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert replayed and replayed[0].startswith("fusedattn_select: replayed ") and "probed" not in replayed[0]
