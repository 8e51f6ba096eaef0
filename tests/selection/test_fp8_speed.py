"""selection/fp8_speed.py: parsing FP8-versus-bf16 speed records, their verdict, and the record
of the platform (the committed H100 record, and no data elsewhere)."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from importlib import resources

import pytest

from fusedattn_select.selection import fp8_speed
from fusedattn_select.selection.fp8_speed import SCHEMA, SpeedRecord, SpeedRow, parse, record_for
from fusedattn_select.types import Fingerprint

H100_FILE = "h100-fp8-speed.json"

# FORMAT FIXTURE (not device data): a record in the recorder's format with made-up numbers, to
# test parsing and the verdict. Only the committed snapshot file holds measurements of a GPU.
FIXTURE_FINGERPRINT = {
    "platform": "cuda", "device_name": "Format Fixture GPU", "compute_capability": "8.9", "sm_count": 10,
    "cudnn_backend_version": 90100, "cudnn_frontend_version": "1.0.0", "driver_version": "fixture",
    "library_version": "0.0.0",
}
FIXTURE = {
    "schema": SCHEMA,
    "recorded_at": "2000-01-02T03:04:05+00:00",
    "fingerprint": FIXTURE_FINGERPRINT,
    "rows": [
        {"problem": "p1", "phase": "forward", "bf16_ms": 2.0, "fp8_ms": 1.0},
        {"problem": "p1", "phase": "backward", "bf16_ms": 1.0, "fp8_ms": 2.0},
        {"problem": "p2", "phase": "backward", "bf16_ms": 3.0, "fp8_ms": 4.0},
    ],
}


def _fixture(**changes):
    data = copy.deepcopy(FIXTURE)
    data.update(changes)
    return data


def _record(rows, source="fixture.json"):
    # FORMAT FIXTURE: a record built from made-up rows (not device data).
    return SpeedRecord(source, Fingerprint.from_dict(FIXTURE_FINGERPRINT), "2000-01-02", tuple(rows))


def _h100() -> SpeedRecord:
    found = [r for r in fp8_speed.bundled_records() if r.source == H100_FILE]
    assert len(found) == 1, [r.source for r in fp8_speed.bundled_records()]
    return found[0]


@pytest.fixture(autouse=True)
def fresh_told():
    fp8_speed._told.clear()
    yield
    fp8_speed._told.clear()


# ----- parse -------------------------------------------------------------------------------------
def test_parse_reads_every_field_of_a_good_record():
    record = parse(_fixture(), "fixture.json")
    assert record.source == "fixture.json"
    assert record.recorded_at == "2000-01-02T03:04:05+00:00"
    assert record.fingerprint == Fingerprint.from_dict(FIXTURE_FINGERPRINT)
    assert record.rows == (SpeedRow("p1", "forward", 2.0, 1.0), SpeedRow("p1", "backward", 1.0, 2.0),
                           SpeedRow("p2", "backward", 3.0, 4.0))
    assert record.rows[0].speedup == pytest.approx(2.0)
    assert record.rows[2].speedup == pytest.approx(0.75)


@pytest.mark.parametrize("data", [_fixture(schema="fusedattn-select-fp8-speed/0"), {"rows": []}, [], "text"])
def test_parse_refuses_another_schema_naming_the_source(data):
    with pytest.raises(ValueError, match=r"elsewhere\.json.*schema"):
        parse(data, "elsewhere.json")


@pytest.mark.parametrize("missing", ["rows", "fingerprint", "recorded_at"])
def test_parse_refuses_a_missing_field_naming_the_source_and_the_field(missing):
    data = _fixture()
    del data[missing]
    with pytest.raises(ValueError, match=r"broken\.json: bad FP8 speed record \(KeyError") as err:
        parse(data, "broken.json")
    assert missing in str(err.value)


def test_parse_refuses_a_row_missing_its_timing_or_with_a_non_number():
    data = _fixture()
    del data["rows"][1]["fp8_ms"]
    with pytest.raises(ValueError, match=r"row\.json: .*fp8_ms"):
        parse(data, "row.json")
    data = _fixture()
    data["rows"][0]["bf16_ms"] = "fast"
    with pytest.raises(ValueError, match=r"num\.json: bad FP8 speed record \(ValueError"):
        parse(data, "num.json")


# ----- the verdict and its summary ----------------------------------------------------------------
def test_backward_slower_when_every_backward_row_is_slower_in_fp8():
    # FORMAT FIXTURE rows: the forward row being faster in FP8 does not matter.
    assert parse(_fixture(), "f.json").backward_slower is True


def test_backward_not_slower_when_one_backward_row_is_faster_in_fp8():
    rows = [SpeedRow("p1", "backward", 1.0, 2.0), SpeedRow("p2", "backward", 3.0, 2.5)]
    assert _record(rows).backward_slower is False


def test_backward_not_slower_when_fp8_ties_bf16():
    assert _record([SpeedRow("p1", "backward", 2.0, 2.0)]).backward_slower is False


def test_backward_not_slower_without_backward_rows():
    assert _record([SpeedRow("p1", "forward", 1.0, 5.0)]).backward_slower is False
    assert _record([]).backward_slower is False


def test_summary_gives_the_worst_speedup_and_every_row_of_the_phase():
    record = parse(_fixture(), "f.json")
    assert record.summary("backward") == "FP8 backward at 0.50x the bf16 speed (p1: 2 vs 1 ms; p2: 4 vs 3 ms)"
    assert record.summary("forward") == "FP8 forward at 2.00x the bf16 speed (p1: 1 vs 2 ms)"
    assert record.summary("other") == "FP8 other at 0.00x the bf16 speed ()"


# ----- record_for ----------------------------------------------------------------------------------
def test_record_for_matches_device_compute_capability_and_cudnn_version():
    record = parse(_fixture(), "f.json")
    same = dataclasses.replace(record.fingerprint, sm_count=999, driver_version="other", library_version="9.9",
                               cudnn_frontend_version="0.1", platform="cuda")
    assert record_for(same, (record,)) is record


@pytest.mark.parametrize("field, value", [("device_name", "Other GPU"), ("compute_capability", "9.0"),
                                          ("cudnn_backend_version", 90101)])
def test_record_for_is_none_when_a_matched_field_differs(field, value):
    record = parse(_fixture(), "f.json")
    other = dataclasses.replace(record.fingerprint, **{field: value})
    assert record_for(other, (record,)) is None


def test_record_for_picks_the_record_of_its_platform_among_several():
    first = parse(_fixture(), "a.json")
    fp_b = dict(FIXTURE_FINGERPRINT, cudnn_backend_version=91000)
    second = parse(_fixture(fingerprint=fp_b), "b.json")
    assert record_for(Fingerprint.from_dict(fp_b), (first, second)) is second
    assert record_for(Fingerprint.from_dict(FIXTURE_FINGERPRINT), (first, second)) is first
    assert record_for(Fingerprint.from_dict(FIXTURE_FINGERPRINT), ()) is None


# ----- the committed H100 record -------------------------------------------------------------------
def test_bundled_records_hold_the_committed_h100_file_as_it_is_on_disk():
    raw = json.loads((resources.files("fusedattn_select") / "snapshots" / H100_FILE).read_text())
    record = _h100()
    assert record == parse(raw, H100_FILE)
    assert len(record.rows) == len(raw["rows"]) > 0


def test_h100_record_fingerprint_is_h100_sm90_cudnn_9_19():
    fp = _h100().fingerprint
    assert "H100" in fp.device_name
    assert fp.compute_capability == "9.0"
    assert fp.cudnn_backend_version == 91900


def test_h100_record_backward_slower_follows_from_its_rows():
    record = _h100()
    backward = [r for r in record.rows if r.phase == "backward"]
    assert backward, "the H100 record has no backward rows"
    expected = all(r.fp8_ms > r.bf16_ms for r in backward)
    assert record.backward_slower is expected
    assert record.backward_slower is True


def test_record_for_finds_the_h100_record_and_not_another_cudnn():
    record = _h100()
    assert record_for(record.fingerprint) is record
    newer = dataclasses.replace(record.fingerprint, cudnn_backend_version=record.fingerprint.cudnn_backend_version + 100)
    assert record_for(newer) is None


# ----- f16_backward_reason -------------------------------------------------------------------------
def _warnings(caplog):
    return [r for r in caplog.records if r.name == "fusedattn_select" and r.levelno == logging.WARNING]


def test_no_reason_and_no_log_for_an_unknown_platform(caplog):
    caplog.set_level(logging.DEBUG, logger="fusedattn_select")
    unknown = Fingerprint("cuda", "Unknown GPU", "8.0", 108, 90100, "1.0.0", "x", "0.1.0")
    assert fp8_speed.f16_backward_reason(unknown) == ""
    assert fp8_speed.f16_backward_reason(Fingerprint("cpu")) == ""
    assert [r for r in caplog.records if r.name == "fusedattn_select"] == []


def test_h100_reason_names_the_device_and_is_logged_once(caplog):
    caplog.set_level(logging.DEBUG, logger="fusedattn_select")
    record = _h100()
    fp = record.fingerprint
    first = fp8_speed.f16_backward_reason(fp)
    assert fp.device_name in first
    assert str(fp.cudnn_backend_version) in first
    assert record.summary("backward") in first
    assert H100_FILE in first
    second = fp8_speed.f16_backward_reason(fp)
    assert second == first
    warnings = _warnings(caplog)
    assert len(warnings) == 1
    assert "bf16 backward" in warnings[0].getMessage() and first in warnings[0].getMessage()


# ----- forward_note ----------------------------------------------------------------------------------
def _quantized(bf16_ms: float, fp8_ms: float, problem: str = "p1") -> SpeedRow:
    return SpeedRow(problem, fp8_speed.FORWARD_QUANTIZED, bf16_ms, fp8_ms)  # FORMAT FIXTURE numbers


def test_forward_not_faster_when_one_quantized_row_is_under_the_margin():
    assert _record([_quantized(1.0, 0.5), _quantized(1.0, 0.99, "p2")]).forward_not_faster
    assert not _record([_quantized(1.0, 0.5), _quantized(1.0, 0.9, "p2")]).forward_not_faster  # 1.11x
    assert _record([_quantized(1.0, 0.945)]).forward_not_faster  # 1.06x: within the runs' spread
    assert not _record([SpeedRow("p1", "forward", 1.0, 2.0)]).forward_not_faster  # raw graphs only: no data


def test_forward_note_names_the_rows_and_is_logged_once(caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="fusedattn_select")
    record = _record([_quantized(0.911, 0.925, "b4 s4096"), _quantized(1.73, 1.53, "b2 s8192")])
    monkeypatch.setattr(fp8_speed, "bundled_records", lambda: (record,))
    first = fp8_speed.forward_note(record.fingerprint)
    assert "attention(fp8=True), quantization included, at 0.98x the bf16 speed" in first
    assert "b4 s4096: 0.925 vs 0.911 ms" in first and "b2 s8192: 1.53 vs 1.73 ms" in first
    assert fp8_speed.forward_note(record.fingerprint) == first
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "FP8History" in warnings[0].getMessage()
    fast = _record([_quantized(1.73, 1.33)])
    monkeypatch.setattr(fp8_speed, "bundled_records", lambda: (fast,))
    assert fp8_speed.forward_note(fast.fingerprint) == ""
