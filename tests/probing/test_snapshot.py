"""Snapshots: the recorder writes every verdict; SnapshotEngine replays them and nothing else.

Snapshots here are recorded with RecordingTestEngine (tests/conftest.py), a test double: it
checks the recording/replay machinery, not what cuDNN supports.
"""

from __future__ import annotations

import json

import pytest

from fusedattn_select import AttnConfig, Backend
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import SnapshotError
from fusedattn_select.probing import choose_engine
from fusedattn_select.probing.snapshot import SCHEMA, SnapshotEngine, read_header
from fusedattn_select.selection.recorder import record_snapshot, summarize, write_snapshot
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Outcome, Phase, ProbeDepth, Provenance


def entries_by_name(path):
    return {entry["name"]: entry for entry in json.loads(path.read_text())["entries"]}


# ----- recording -------------------------------------------------------------------------------
def test_recorded_snapshot_has_the_schema_fields(recorded_snapshot, suite_file, recording_engine):
    data = json.loads(recorded_snapshot.read_text())
    assert data["schema"] == SCHEMA
    assert data["recorder_version"] and data["recorded_at"][:4].isdigit()
    assert data["fingerprint"] == recording_engine.fingerprint().to_dict()
    assert data["suites"] == [suite_file.name]
    names = [e.name for e in load_config_file(suite_file).entries]
    assert [entry["name"] for entry in data["entries"]] == names
    for entry in data["entries"]:
        assert set(entry) == {"suite", "name", "cache_key", "config", "verdicts"}
        assert entry["cache_key"] == AttnConfig.from_dict(entry["config"]).cache_key()


def test_recorder_keeps_the_full_live_verdict(recorded_snapshot):
    (forward,) = entries_by_name(recorded_snapshot)["head-dim-512"]["verdicts"]
    assert forward["outcome"] == "unsupported" and forward["stage"] == "check_support"
    assert forward["detail"] == "[cudnn_frontend] Error: No valid engine configs for SDPA (scripted raw text)"
    assert forward["timings_ms"] == {"validate": 0.25, "check_support": 2.5}
    assert forward["provenance"] == "live_probe"


def test_recorder_records_failed_probes_as_failed(recorded_snapshot):
    (forward,) = entries_by_name(recorded_snapshot)["out-of-memory"]["verdicts"]
    assert forward["outcome"] == "failed" and forward["message"] == "CUDA out of memory"


def test_recorder_records_rule_rejections_with_their_rule(recorded_snapshot, recording_engine):
    verdicts = entries_by_name(recorded_snapshot)["pre-scale-bias"]["verdicts"]
    assert {v["stage"] for v in verdicts} == {"rule:pre-scale-bias"}
    assert {v["phase"] for v in verdicts} == {"forward", "backward"}


def test_recorder_probes_training_problems_in_both_phases(recorded_snapshot):
    verdicts = entries_by_name(recorded_snapshot)["train-causal"]["verdicts"]
    assert [v["phase"] for v in verdicts] == ["forward", "backward"]


def test_summary_counts_selected_none_and_failed(recorded_snapshot):
    counts = summarize(json.loads(recorded_snapshot.read_text()))
    assert counts == {"entries": 7, "selected": 4, "none": 2, "failed": 1}


def test_recorder_refuses_a_snapshot_engine(recorded_snapshot, suite_file):
    with pytest.raises(SnapshotError, match="live device only"):
        record_snapshot([suite_file], SnapshotEngine.load(recorded_snapshot))


def test_recorder_with_jobs_keeps_file_order_and_reports_progress(suite_file, recording_engine):
    seen = []
    data = record_snapshot([suite_file], recording_engine, jobs=4,
                           progress=lambda done, total, entry: seen.append((done, total, entry["name"])))
    serial = record_snapshot([suite_file], recording_engine)
    assert [e["name"] for e in data["entries"]] == [e["name"] for e in serial["entries"]]
    assert [(done, total) for done, total, _ in seen] == [(i, 7) for i in range(1, 8)]


def test_recorder_full_depth_is_written_into_each_verdict(suite_file, recording_engine):
    data = record_snapshot([suite_file], recording_engine, depth="full")
    assert data["depth"] == "full"
    probed = [v for e in data["entries"] for v in e["verdicts"] if not v["stage"].startswith("rule:")]
    assert {v["depth"] for v in probed} == {"full"}


def test_problem_listed_in_two_suites_is_recorded_in_both(tmp_path, suite_file, recording_engine):
    copy = tmp_path / "copy.yaml"
    copy.write_text(suite_file.read_text())
    data = record_snapshot([suite_file, copy], recording_engine)
    twice = [e for e in data["entries"] if e["name"] == "infer"]
    assert [e["suite"] for e in twice] == ["test-suite.yaml", "copy.yaml"]
    assert twice[0]["verdicts"] == twice[1]["verdicts"]
    assert twice[1]["verdicts"][0]["provenance"] == "live_probe"


def test_engine_that_raises_is_recorded_as_failed(suite_file, recording_engine):
    def broken(cfg, backend, phase, depth):
        raise RuntimeError("driver went away")

    recording_engine.probe = broken
    data = record_snapshot([suite_file], recording_engine)
    verdict = next(e for e in data["entries"] if e["name"] == "infer")["verdicts"][0]
    assert verdict["outcome"] == "failed" and verdict["stage"] == "recorder"
    assert "driver went away" in verdict["message"]


# ----- replaying -------------------------------------------------------------------------------
def test_snapshot_answers_match_the_recorded_engine(recorded_snapshot, suite_file, recording_engine):
    # A snapshot holds each problem's own graphs (the recorder never asks for bucket forms).
    live = Selector(recording_engine, bucket_forms=False)
    replay = Selector(SnapshotEngine.load(recorded_snapshot))
    for entry in load_config_file(suite_file).entries:
        expected, got = live.select(entry.config), replay.select(entry.config)
        assert (got.backend, got.message) == (expected.backend, expected.message), entry.name
        assert [(v.phase, v.outcome, v.stage, v.detail, v.timings_ms) for v in got.verdicts] == [
            (v.phase, v.outcome, v.stage, v.detail, v.timings_ms) for v in expected.verdicts], entry.name


def test_replayed_probe_verdicts_have_snapshot_provenance(recorded_snapshot, suite_file):
    replay = Selector(SnapshotEngine.load(recorded_snapshot))
    train = load_config_file(suite_file).get("train-causal").config
    selection = replay.select(train)
    assert selection.backend is Backend.F16
    assert {v.provenance for v in selection.verdicts} == {Provenance.SNAPSHOT}


def test_snapshot_engine_reports_the_recorded_fingerprint_and_file(recorded_snapshot, recording_engine):
    engine = SnapshotEngine.load(recorded_snapshot)
    assert engine.name == "snapshot:test-gpu.json"
    assert engine.provenance is Provenance.SNAPSHOT
    assert engine.fingerprint() == recording_engine.fingerprint()


def test_problem_not_in_the_snapshot_is_no_data_not_unsupported(recorded_snapshot, suite_file):
    engine = SnapshotEngine.load(recorded_snapshot)
    cfg = load_config_file(suite_file).get("infer").config.replace(batch_size=3)
    verdict = engine.probe(cfg, Backend.F16, Phase.FORWARD, ProbeDepth.FAST)
    assert verdict.outcome is Outcome.NO_DATA and verdict.stage == "snapshot"
    assert verdict.message == "not recorded in test-gpu.json; only a live probe on a GPU can answer it"
    assert verdict.provenance is Provenance.SNAPSHOT
    selection = Selector(engine).select(cfg)
    assert selection.backend is Backend.NONE and selection.no_data
    assert "not recorded in test-gpu.json" in selection.message and "not supported" not in selection.message


def test_recorded_training_problem_does_not_answer_its_inference_twin(recorded_snapshot, suite_file):
    engine = SnapshotEngine.load(recorded_snapshot)
    cfg = load_config_file(suite_file).get("train-causal").config.replace(is_training=False)
    selection = Selector(engine).select(cfg)
    assert selection.backend is Backend.NONE and "not recorded in" in selection.message


def test_read_header_reports_device_date_and_count(recorded_snapshot):
    header = read_header(recorded_snapshot)
    assert header.fingerprint.device_name == "Test GPU H100"
    assert header.entry_count == 7 and len(header.recorded_on) == 10


def test_load_many_merges_snapshots_of_one_device(tmp_path, recorded_snapshot, recording_engine):
    other_suite = tmp_path / "other.yaml"
    other_suite.write_text(
        "configs:\n  - {name: small, batch_size: 1, num_heads_q: 4, num_heads_kv: 4, seqlen_q: 64,"
        " seqlen_kv: 64, head_dim_qk: 64, is_training: false}\n")
    other = write_snapshot(record_snapshot([other_suite], recording_engine), tmp_path / "other.json")
    engine = SnapshotEngine.load_many([recorded_snapshot, other])
    assert engine.name == "snapshot:test-gpu.json+other.json"
    small = load_config_file(other_suite).get("small").config
    assert Selector(engine).select(small).backend is Backend.F16


def test_load_many_refuses_snapshots_of_different_devices(tmp_path, recorded_snapshot):
    data = json.loads(recorded_snapshot.read_text())
    data["fingerprint"]["cudnn_backend_version"] = 91000
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    with pytest.raises(SnapshotError, match="cudnn_backend_version"):
        SnapshotEngine.load_many([recorded_snapshot, other])


def test_environment_variable_selects_a_snapshot_engine(monkeypatch, recorded_snapshot):
    monkeypatch.setenv("FUSEDATTN_SELECT_SNAPSHOT", str(recorded_snapshot))
    choice = choose_engine()
    assert isinstance(choice.engine, SnapshotEngine) and choice.notice == ""


# ----- malformed snapshots ---------------------------------------------------------------------
def _corrupt(recorded_snapshot, change):
    data = json.loads(recorded_snapshot.read_text())
    change(data)
    recorded_snapshot.write_text(json.dumps(data))
    return recorded_snapshot


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(schema="fusedattn-select-snapshot/0"), "schema"),
    (lambda d: d.pop("schema"), "schema"),
    (lambda d: d.pop("fingerprint"), "malformed header"),
    (lambda d: d.update(entries={}), "malformed header"),
    (lambda d: d["entries"][0].pop("verdicts"), r"entries\[0\]: malformed entry"),
    (lambda d: d["entries"][0]["verdicts"][0].update(outcome="maybe"), r"entries\[0\]: malformed entry"),
    (lambda d: d["entries"][1]["config"].update(head_dim_qk=0), r"entries\[1\] \(infer\): config is not valid"),
    (lambda d: d["entries"].__setitem__(0, "x"), r"entries\[0\]: must be an object"),
])
def test_malformed_snapshot_raises_snapshot_error_naming_the_file(recorded_snapshot, change, message):
    path = _corrupt(recorded_snapshot, change)
    with pytest.raises(SnapshotError, match=message) as info:
        SnapshotEngine.load(path)
    assert str(path) in str(info.value)


def test_missing_snapshot_raises_snapshot_error(tmp_path):
    with pytest.raises(SnapshotError, match="missing.json: file not found"):
        SnapshotEngine.load(tmp_path / "missing.json")


def test_snapshot_that_is_not_json_raises_snapshot_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(SnapshotError, match="bad.json: not valid JSON"):
        SnapshotEngine.load(path)


def test_snapshot_that_is_a_list_raises_snapshot_error(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[]")
    with pytest.raises(SnapshotError, match="expected a JSON object"):
        SnapshotEngine.load(path)


def test_write_snapshot_leaves_no_temporary_files(tmp_path, suite_file, recording_engine):
    out = tmp_path / "nested" / "snap.json"
    write_snapshot(record_snapshot([suite_file], recording_engine), out)
    assert [p.name for p in out.parent.iterdir()] == ["snap.json"]
    assert read_header(out).entry_count == 7


def test_snapshot_path_that_is_a_directory_raises_snapshot_error(tmp_path):
    with pytest.raises(SnapshotError, match="cannot be read"):
        SnapshotEngine.load(tmp_path)


def test_snapshot_engine_needs_at_least_one_file():
    with pytest.raises(SnapshotError, match="at least one snapshot file"):
        SnapshotEngine.load_many([])


def test_recorder_rejects_zero_jobs(suite_file, recording_engine):
    with pytest.raises(ValueError, match="jobs=0: must be >= 1"):
        record_snapshot([suite_file], recording_engine, jobs=0)
