"""Snapshots recorded on one device on different days may be merged (docs/snapshots.md); where the
answers come from then names every recording date, not only the first file's: a row of the later file
was labelled with the earlier date."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

from fusedattn_select.cli.main import main
from fusedattn_select.probing.snapshot import SnapshotEngine

SNAPSHOTS = Path(__file__).resolve().parents[2] / "fusedattn_select" / "snapshots"
CONFIGS, MODELS = SNAPSHOTS / "h100-configs.json", SNAPSHOTS / "h100-models.json"
LATER = "2026-12-30T10:00:00+00:00"
LLAMA = {"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
         "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "num_hidden_layers": 32}


def later_models(tmp_path: Path) -> Path:
    data = json.loads(MODELS.read_text())
    data["recorded_at"] = LATER
    path = tmp_path / "h100-models-later.json"
    path.write_text(json.dumps(data))
    return path


def test_merged_files_of_two_days_name_both_days(tmp_path):
    first = json.loads(CONFIGS.read_text())["recorded_at"][:10]
    engine = SnapshotEngine.load_many([CONFIGS, later_models(tmp_path)])
    assert engine.describe().endswith(f" on {first} and {LATER[:10]}")


def test_one_day_is_named_once():
    assert SnapshotEngine.load(CONFIGS).describe().count(" on ") == 1


def test_why_labels_an_answer_of_the_later_file_with_its_day(tmp_path):
    # Llama 3's layer problem at why's defaults is recorded only in the models file (the later one).
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["why", "--hf-config", json.dumps(LLAMA), "--snapshot", str(CONFIGS),
                     "--snapshot", str(later_models(tmp_path)), "--json"])
    document = json.loads(out.getvalue())
    assert code == 0 and document["results"][0]["answer"] == "F16"
    assert LATER[:10] in document["results"][0]["answered_from"]
    assert LATER[:10] in document["timings_recorded_on"]
