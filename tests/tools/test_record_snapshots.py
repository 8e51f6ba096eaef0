"""tools/gen_model_suite.py and tools/record_snapshots.py on CPU: the model suite is what the corpus
reads to, and a suite recorded in shards merges into the file one recording writes.

Recordings use RecordingTestEngine (a test double standing in for a device, tests/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusedattn_select.config_files import load_config_file
from fusedattn_select.selection.recorder import Ladder, record_snapshot
from tests.conftest import RecordingTestEngine
from tools import gen_model_suite
from tools.record_snapshots import SUITES, merge_parts, shard

ROOT = Path(__file__).resolve().parents[2]


def test_the_model_suite_is_what_the_corpus_reads_to():
    assert gen_model_suite.main(["--check"]) == 0, "run python3 tools/gen_model_suite.py"
    entries = load_config_file(gen_model_suite.OUTPUT).entries
    names = {e.name for e in entries}
    assert {"gpt2/full_attention/train", "gpt2/full_attention/infer", "whisper-small/cross_attention/train",
            "gemma-2-9b-it/sliding_attention+softcap/train"} <= names


def test_check_says_when_the_file_is_stale(tmp_path, capsys):
    stale = tmp_path / "hf-models.yaml"
    stale.write_text("name: old\n")
    assert gen_model_suite.main(["--check", "-o", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err


def _record(suite, files):
    options = dict(zip(suite.options[::2], suite.options[1::2]))
    return record_snapshot(files, RecordingTestEngine(), depth=options["--depth"], ask_torch=False,
                           ladder=Ladder(depth=options.get("--ladder-depth")))


@pytest.mark.parametrize("suite", [s for s in SUITES if s.name != "hopper-suite"], ids=lambda s: s.name)
def test_shards_merge_into_what_one_recording_writes(tmp_path, suite):
    units = shard(suite, tmp_path)
    assert len(units) == suite.shards
    merged = merge_parts([_record(suite, unit) for unit in units], [Path(f).name for f in suite.files])
    whole = _record(suite, [ROOT / f for f in suite.files])
    for data in (merged, whole):
        data.pop("recorded_at")
    assert json.dumps(merged) == json.dumps(whole)


def test_shards_of_other_devices_are_not_merged(tmp_path):
    suite = next(s for s in SUITES if s.name == "models")
    parts = [_record(suite, unit) for unit in shard(suite, tmp_path)]
    parts[1]["fingerprint"] = {**parts[1]["fingerprint"], "device_name": "another GPU"}
    with pytest.raises(ValueError, match="shards disagree on 'fingerprint'"):
        merge_parts(parts, ["hf-models.yaml"])
