"""`fusedattn-select matrix`: the support matrix from the bundled snapshots (text, JSON, PNG), exit
codes for no data, and `--compare torch` on recorded torch answers (and without them)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from fusedattn_select import cli
from fusedattn_select.config import AttnConfig
from fusedattn_select.probing import bundled_snapshot
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.types import Backend, Outcome, Phase, ProbeDepth

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "probes" / "hopper-suite.yaml"
BUNDLED = bundled_snapshot("h100", "hopper-suite")


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _accepted_in_snapshot(path: Path) -> tuple[int, int]:
    entries = json.loads(path.read_text())["entries"]
    accepted = sum({v["outcome"] for v in e["verdicts"]} == {"supported"} for e in entries)
    return accepted, len(entries)


def _row(out: str, label: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(label + "  "))
    return line[len(label):].split()


def test_text_matrix_of_the_hopper_suite_counts_every_recorded_answer(capsys):
    code, out, err = run(capsys, "matrix", SUITE, "--target", "h100")
    assert code == 0, err
    accepted, total = _accepted_in_snapshot(BUNDLED)
    assert f"total: {accepted}/{total}" in out
    assert "NVIDIA H100 80GB HBM3" in out and "cuDNN 9.19.0" in out and "verify (" in out
    header = next(line for line in out.splitlines() if line.startswith("dtype / pass / head_dim \\ mask"))
    assert header.split()[-6:] == ["no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
                                   "padding_causal_bottom_right"]
    # cuDNN 9.19 builds bf16 head-dim-512 inference on Hopper, not its backward.
    assert _row(out, "bf16 infer d512") == ["1/1", "v1"]  # and its output matched the reference
    assert _row(out, "bf16 train d512") == ["0/1", "0/1"]


def test_rows_and_columns_are_chosen_by_axes(capsys):
    code, out, err = run(capsys, "matrix", SUITE, "--target", "h100", "--rows", "dtype", "--columns", "pass")
    assert code == 0, err
    assert re.search(r"^dtype \\ pass +train +infer$", out, re.MULTILINE)
    fp8 = [e for e in json.loads(BUNDLED.read_text())["entries"] if e["config"]["qkv_dtype"] == "fp8_e5m2"]
    # One cell per pass column: "accepted/asked", with " vN" where N of them were verified.
    assert re.search(r"^fp8_e5m2 +\d/\d( v\d)? +\d/\d( v\d)?$", out, re.MULTILINE), out
    assert len(fp8) == 4


def test_json_holds_every_problem_and_cell(capsys):
    code, out, err = run(capsys, "matrix", SUITE, "--target", "h100", "--json")
    assert code == 0, err
    document = json.loads(out)
    accepted, total = _accepted_in_snapshot(BUNDLED)
    assert len(document["problems"]) == total
    assert sum(c["accepted"] for c in document["cells"]) == accepted
    assert sum(c["accepted"] + c["none"] for c in document["cells"]) == total
    d512 = next(p for p in document["problems"] if p["name"] == "bf16-d512-causal-mha-infer")
    assert d512["answer"] == "F16"
    assert document["fingerprint"]["device_name"] == "NVIDIA H100 80GB HBM3"
    assert document["compare_torch"] is None


def test_png_heatmap_is_written(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "m.png"
    code, out, err = run(capsys, "matrix", SUITE, "--target", "h100", "--png", png)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert f"heatmap -> {png}" in out


def test_png_without_matplotlib_exits_2_naming_the_flag_and_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    code, out, err = run(capsys, "matrix", SUITE, "--target", "h100", "--png", tmp_path / "m.png")
    assert code == 2 and out == ""
    assert err.startswith("error: --png=") and "fusedattn-select[plot]" in err
    assert not (tmp_path / "m.png").exists()


def test_unknown_axis_exits_2_listing_the_axes(capsys):
    code, _, err = run(capsys, "matrix", SUITE, "--target", "h100", "--rows", "dtype,colour")
    assert code == 2
    assert "--rows='dtype,colour'" in err and "head_dim" in err


def test_problems_not_in_the_snapshot_are_no_data_not_rejections(capsys, tmp_path):
    recorded = _config("bf16-d512-causal-mha-infer")
    other_shape = {**recorded, "seqlen_q": 4242, "seqlen_kv": 4242}  # its class is recorded over a ladder
    other_class = {**other_shape, "num_heads_q": 24, "num_heads_kv": 24}  # the suite records no 24-head class
    engine = SnapshotEngine.load(BUNDLED)
    bucket = engine.bucket_for(AttnConfig(**other_shape))
    assert bucket is not None
    assert engine.probe(bucket, Backend.F16, Phase.FORWARD, ProbeDepth.FAST).outcome is Outcome.SUPPORTED
    assert engine.bucket_for(AttnConfig(**other_class)) is None
    assert engine.probe(AttnConfig(**other_class), Backend.F16, Phase.FORWARD, ProbeDepth.FAST).outcome is Outcome.NO_DATA
    suite = tmp_path / "new.yaml"
    suite.write_text(yaml.safe_dump({"configs": [
        {"name": "recorded", **recorded},
        {"name": "answered-from-its-bucket", **other_shape},
        {"name": "never-recorded", **other_class},
    ]}))
    code, out, err = run(capsys, "matrix", suite, "--snapshot", BUNDLED)
    assert code == 3, out
    # The recorded shape (verified) and its bucket (a rung: support checked) are answered; the other class
    # is no data.
    assert _row(out, "bf16 infer d512") == ["2/2", "v1", "?1"]
    assert "total: 2/2 v1 ?1" in out


def test_compare_torch_on_snapshots_without_torch_answers_says_not_recorded(capsys, tmp_path):
    # A snapshot as the recorder wrote it before it recorded torch's answers: the bundled one without them.
    data = json.loads(BUNDLED.read_text())
    data.pop("torch", None)
    for entry in data["entries"]:
        entry.pop("torch", None)
    older = tmp_path / "older.json"
    older.write_text(json.dumps(data))
    code, out, err = run(capsys, "matrix", SUITE, "--snapshot", older, "--compare", "torch")
    total = _accepted_in_snapshot(BUNDLED)[1]
    assert code == 3, err
    assert f"torch not recorded: {total}" in out and "disagree: 0" in out
    assert "recorded before snapshots held torch's answers" in out
    assert "re-record the snapshot" in out


def test_compare_torch_on_the_bundled_h100_snapshot_counts_recorded_disagreements(capsys):
    code, out, err = run(capsys, "matrix", SUITE, "--target", "h100", "--compare", "torch")
    counts = dict(re.findall(r"(disagree|agree|torch not recorded): (\d+)", out))
    assert int(counts["disagree"]) > 0 and int(counts["agree"]) > 0, out[-600:]
    assert counts["torch not recorded"] == "0"


# ----- --compare torch on a format fixture -------------------------------------------------------
# FORMAT FIXTURE, not device data: cuDNN's verdicts are the bundled H100 snapshot's; the "torch"
# answers are written by this test in the recorder's format to exercise the comparison on CPU.
FIXTURE_TORCH = {
    "bf16-d512-causal-mha-infer": {"status": "evaluated", "cudnn": False, "sdpa_choice": "MATH",
                                   "cudnn_reasons": ["head_dim should be no more than 128"], "expressed_as": "fixture"},
    "bf16-d128-causal-mha-train": {"status": "evaluated", "cudnn": True, "sdpa_choice": "CUDNN_ATTENTION",
                                   "cudnn_reasons": [], "expressed_as": "fixture"},
    "bf16-d512-causal-mha-train": {"status": "failed", "error": "RuntimeError: fixture"},
    "fp8e4m3-delayed-d128-causal-mha-infer": {"status": "not_expressible", "reason": "qkv_dtype='fp8_e4m3': fixture"},
}


def _bundled_entries() -> dict[str, dict]:
    return {e["name"]: e for e in json.loads(BUNDLED.read_text())["entries"]}


def _config(name: str) -> dict:
    return {k: v for k, v in _bundled_entries()[name]["config"].items() if v is not None}


@pytest.fixture
def torch_fixture(tmp_path):
    entries = _bundled_entries()
    names = [n for n in FIXTURE_TORCH if n in entries] + ["bf16-d128-causal-mha-infer"]
    assert len(names) == 5, "the bundled snapshot lost an entry this test relies on"
    data = json.loads(BUNDLED.read_text())
    data["torch"] = {"version": "fixture", "cudnn_version": 0, "device_name": "format fixture"}
    # The last entry keeps no torch answer (as if recorded before torch's answers were).
    old_index = {e["name"]: i for i, e in enumerate(data["entries"])}
    data["entries"] = [{**{k: v for k, v in entries[n].items() if k != "torch"},
                        **({"torch": FIXTURE_TORCH[n]} if n in FIXTURE_TORCH else {})} for n in names]
    # The ladders of the kept entries, their "entry" index renumbered to the entry's new place.
    new_index = {old_index[n]: i for i, n in enumerate(names)}
    data["buckets"] = [{**g, "entry": new_index[g["entry"]]} for g in data.get("buckets", []) if g["entry"] in new_index]
    snapshot = tmp_path / "format-fixture.json"
    snapshot.write_text(json.dumps(data))
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"configs": [{"name": n, **_config(n)} for n in names]}))
    return suite, snapshot


def test_compare_torch_lists_the_head_dim_512_disagreement(capsys, torch_fixture):
    suite, snapshot = torch_fixture
    code, out, err = run(capsys, "matrix", suite, "--snapshot", snapshot, "--compare", "torch")
    assert code == 1, err
    line = next(line for line in out.splitlines() if "suite.yaml:bf16-d512-causal-mha-infer" in line)
    assert "bf16 infer d512 causal" in line and "F16" in line and "refuses cuDNN" in line
    assert "MATH" in line and "head_dim should be no more than 128" in line
    assert ("disagree: 1, agree: 1, not expressible in SDPA: 1, torch rule failed: 1, torch not recorded: 1, "
            "cuDNN no data: 0") in out
    assert "torch fixture" in out


def test_compare_torch_json_names_each_problem_kind(capsys, torch_fixture):
    suite, snapshot = torch_fixture
    code, out, _ = run(capsys, "matrix", suite, "--snapshot", snapshot, "--compare", "torch", "--json")
    assert code == 1
    kinds = {p["name"]: p["kind"] for p in json.loads(out)["compare_torch"]["problems"]}
    assert kinds == {
        "bf16-d512-causal-mha-infer": "disagree",
        "bf16-d128-causal-mha-train": "agree",
        "bf16-d512-causal-mha-train": "torch rule failed",
        "fp8e4m3-delayed-d128-causal-mha-infer": "not expressible in SDPA",
        "bf16-d128-causal-mha-infer": "torch not recorded",
    }


def test_live_with_a_snapshot_source_exits_2(capsys):
    code, _, err = run(capsys, "matrix", SUITE, "--live", "--target", "h100")
    assert code == 2 and err.startswith("error: --live=True")


def test_compare_torch_disagreement_exits_1_even_with_no_data_problems(capsys, torch_fixture):
    # docs/cli.md, exit codes: 1 (torch and cuDNN disagree) wins over 3 (some problem has no data).
    suite, snapshot = torch_fixture
    data = yaml.safe_load(suite.read_text())
    never = {**_config("bf16-d512-causal-mha-infer"), "num_heads_q": 24, "num_heads_kv": 24}  # no class recorded
    data["configs"].append({"name": "never-recorded", **never})
    suite.write_text(yaml.safe_dump(data))
    for extra in ((), ("--json",)):
        code, out, err = run(capsys, "matrix", suite, "--snapshot", snapshot, "--compare", "torch", *extra)
        assert code == 1, err
    code, out, _ = run(capsys, "matrix", suite, "--snapshot", snapshot, "--compare", "torch")
    assert "disagree: 1," in out and "cuDNN no data: 1" in out and "?1" in out
