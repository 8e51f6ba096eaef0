"""A snapshot holding a number beyond any float or JSON nested past Python's recursion limit is a
SnapshotError naming the file (and the entry, where the file decodes), never a traceback."""

import json

import pytest

from fusedattn_select.errors import SnapshotError
from fusedattn_select.probing.snapshot import SnapshotEngine

HUGE = 10 ** 400  # fewer digits than int() reads (4300), more than any float holds


def _with_placeholder(path, replacement):
    path.write_text(path.read_text().replace('"PLACEHOLDER"', replacement))
    return path


def test_a_timing_beyond_any_float_names_the_file_and_entry(recorded_snapshot):
    data = json.loads(recorded_snapshot.read_text())
    data["entries"][2]["verdicts"][0]["timings_ms"] = {"check_support": "PLACEHOLDER"}
    recorded_snapshot.write_text(json.dumps(data))
    _with_placeholder(recorded_snapshot, str(HUGE))
    with pytest.raises(SnapshotError, match=rf"snapshot {recorded_snapshot}: entries\[2\]: malformed entry "
                                            r"\(ValueError: timings_ms\['check_support'\]: an integer of \d+ bits"):
        SnapshotEngine.load(recorded_snapshot)


def test_a_config_field_beyond_any_float_names_the_file_and_entry(recorded_snapshot):
    data = json.loads(recorded_snapshot.read_text())
    data["entries"][1]["config"]["dropout"] = "PLACEHOLDER"
    recorded_snapshot.write_text(json.dumps(data))
    _with_placeholder(recorded_snapshot, str(HUGE))
    with pytest.raises(SnapshotError, match=rf"snapshot {recorded_snapshot}: entries\[1\]"):
        SnapshotEngine.load(recorded_snapshot)


def test_a_snapshot_nested_past_the_recursion_limit_names_the_file(recorded_snapshot):
    data = json.loads(recorded_snapshot.read_text())
    data["entries"][0]["verdicts"][0]["message"] = "PLACEHOLDER"
    recorded_snapshot.write_text(json.dumps(data))
    _with_placeholder(recorded_snapshot, "[" * 100_000 + "]" * 100_000)
    with pytest.raises(SnapshotError, match=rf"snapshot {recorded_snapshot}: nested too deeply to decode"):
        SnapshotEngine.load(recorded_snapshot)


def test_a_verdict_field_of_the_wrong_type_names_the_entry(recorded_snapshot):
    data = json.loads(recorded_snapshot.read_text())
    data["entries"][0]["verdicts"][0]["message"] = [[["not a message"]]]
    recorded_snapshot.write_text(json.dumps(data))
    with pytest.raises(SnapshotError, match=r"entries\[0\]: malformed entry \(TypeError: message: must be a string"):
        SnapshotEngine.load(recorded_snapshot)
