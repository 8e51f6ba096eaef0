"""What `why` and `warmup` say about their answers: no data (exit 3), depths, replayed, recorded times.

Issue 13, findings 2, 5, 6 and 9: "not recorded" looked like "unsupported" (exit 1); headers and
labels claimed depths, probes and timings that were not this run's; warmup had no snapshots and
no --target; `--target H100` was rejected. Snapshots here are recorded with RecordingTestEngine
(a test double, tests/conftest.py), except where the real bundled ones are named.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fusedattn_select import cli
from fusedattn_select.cli.exit_codes import EXIT_NO_DATA, EXIT_NONE, EXIT_SELECTED, answers_exit_code
from fusedattn_select.config import AttnConfig
from fusedattn_select.probing import choice
from fusedattn_select.selection.recorder import record_snapshot, write_snapshot
from fusedattn_select.types import Backend, Outcome, ProbeDepth

PROBLEM = ["--set", "batch_size=2", "--set", "num_heads_q=16", "--set", "num_heads_kv=4",
           "--set", "seqlen_q=1024", "--set", "seqlen_kv=1024", "--set", "head_dim_qk=128"]
INFER = [*PROBLEM, "--set", "is_training=false"]  # recorded ("infer" in the test suite)
NOT_RECORDED = ["batch_size=3" if arg == "batch_size=2" else arg for arg in PROBLEM]
NO_DEVICE = "test: no GPU here"
SMALL_DEFAULTS = {"batch_size": 2, "num_heads_q": 16, "num_heads_kv": 4, "seqlen_q": 1024, "seqlen_kv": 1024,
                  "head_dim_qk": 128}
ROOT = Path(__file__).resolve().parents[2]
SMALL_SUITE = """
name: small
defaults: {batch_size: 2, num_heads_q: 16, num_heads_kv: 4, seqlen_q: 1024, seqlen_kv: 1024, head_dim_qk: 128}
configs:
  - {name: infer, is_training: false}
  - {name: train-causal, mask: causal}
"""


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def snapshot(recorded_snapshot):
    return ["--snapshot", recorded_snapshot]


@pytest.fixture
def small_suite(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL_SUITE)
    return path


# ----- no data: its own answer and exit code ----------------------------------------------------
def test_exit_codes_combine_as_is_every_problem_fused():
    assert answers_exit_code([True, True], [False, False]) == EXIT_SELECTED
    assert answers_exit_code([True, False], [False, True]) == EXIT_NO_DATA == 3
    assert answers_exit_code([False, False], [False, True]) == EXIT_NONE  # one NONE answers "no"


def test_why_problem_not_in_the_snapshot_is_no_data_and_exits_3(capsys, snapshot):
    code, out, _ = run(capsys, "why", *snapshot, *NOT_RECORDED)
    assert code == 3
    assert re.search(r"\n  F16 +forward +no_data +snapshot +snapshot +- +- +not recorded in test-gpu.json", out)
    answer = out.split("\n  nearest recorded problems")[0]  # then other problems (test_cli_why_nearest.py)
    assert answer.rstrip().endswith("-> no data (only a live probe can answer): F16 forward and backward no data at "
                                    "snapshot: not recorded in test-gpu.json; only a live probe on a GPU can answer it")
    assert "not supported" not in answer and "-> NONE" not in out


def test_why_json_marks_no_data(capsys, snapshot):
    code, out, _ = run(capsys, "why", "--json", *snapshot, *NOT_RECORDED)
    selection = json.loads(out)["results"][0]["selection"]
    assert code == 3 and selection["no_data"] is True and selection["backend"] == "NONE"


def test_why_a_refusal_beside_no_data_exits_1(capsys, snapshot, tmp_path):
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(SMALL_SUITE.split("configs:")[0] + "configs:\n"
                     "  - {name: refused, head_dim_qk: 512, is_training: false}\n"
                     "  - {name: unknown, batch_size: 3}\n")
    code, out, _ = run(capsys, "why", mixed, *snapshot)
    assert code == 1
    assert "-> NONE: F16 forward not supported at check_support: head dim above 256" in out
    assert "-> no data (only a live probe can answer): " in out


def test_help_documents_exit_code_3(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "3 no problem has NONE but some has no data" in " ".join(out.split())


# ----- labels that are true ---------------------------------------------------------------------
def test_why_full_against_a_fast_snapshot_says_what_was_asked_and_what_was_recorded(capsys, snapshot):
    code, out, _ = run(capsys, "why", "--full", *snapshot, *INFER)
    assert code == 3
    assert out.splitlines()[0].endswith("; depth asked: full")
    assert re.search(r"\n  F16 +forward +no_data +snapshot +snapshot +fast +2\.75 +recorded at depth fast", out)
    assert "-> F16" not in out


def test_why_at_fast_selects_from_the_same_snapshot(capsys, snapshot):
    code, out, _ = run(capsys, "why", *snapshot, *INFER)
    assert code == 0 and out.splitlines()[0].endswith("; depth asked: fast") and "-> F16" in out


def test_why_labels_snapshot_times_as_recorded_on_their_device(capsys, snapshot):
    _, out, _ = run(capsys, "why", *snapshot, *INFER)
    assert out.splitlines()[1].startswith("answers replayed from test-gpu.json, recorded on Test GPU H100, cuDNN 9.19.0 on ")
    assert re.search(r"\n  backend +phase +verdict +stage +provenance +depth +recorded ms +reason\n", out)


def test_why_live_answers_have_plain_ms_and_no_replay_line(capsys, monkeypatch, recording_engine):
    monkeypatch.setattr(choice, "live_engine", lambda: (recording_engine, ""))
    _, out, _ = run(capsys, "why", *INFER)
    assert "recorded ms" not in out and "replayed" not in out
    assert re.search(r"\n  backend +phase +verdict +stage +provenance +depth +ms +reason\n", out)


def test_verbose_twice_adds_debug_lines(capsys, snapshot):
    _, _, once = run(capsys, "-v", "why", *snapshot, *INFER)
    _, _, twice = run(capsys, "-vv", "why", *snapshot, *INFER)
    assert "DEBUG" not in once
    assert "DEBUG fusedattn_select: engine snapshot:test-gpu.json (snapshot files named by the caller)" in twice
    assert re.search(r"DEBUG fusedattn_select: snapshot lookup \w+ F16 forward at depth fast in test-gpu.json: "
                     r"supported \(recorded at depth fast\)", twice)


# ----- choosing snapshots -----------------------------------------------------------------------
def test_target_is_case_insensitive(capsys):
    code, out, err = run(capsys, "why", "--target", "H100", *INFER)
    assert code in (EXIT_SELECTED, EXIT_NONE, EXIT_NO_DATA), err
    assert out.startswith("engine: snapshot:h100-configs.json+h100-hopper-suite.json+h100-models.json ")


def test_unknown_target_is_bad_input_naming_the_choices(capsys):
    code, _, err = run(capsys, "why", "--target", "a100", *INFER)
    assert code == 2 and "--target" in err and "'h100', 'h200'" in err


def test_snapshot_may_be_repeated_to_merge_files(capsys, snapshot, tmp_path, recording_engine):
    suite = tmp_path / "other.yaml"
    suite.write_text("configs:\n  - {name: other, batch_size: 3, num_heads_q: 16, num_heads_kv: 4, seqlen_q: 1024,"
                     " seqlen_kv: 1024, head_dim_qk: 128}\n")
    other = write_snapshot(record_snapshot([suite], recording_engine), tmp_path / "other.json")
    code, out, _ = run(capsys, "why", *snapshot, "--snapshot", other, *NOT_RECORDED)
    assert code == 0 and out.startswith("engine: snapshot:test-gpu.json+other.json")


# ----- warmup from snapshots --------------------------------------------------------------------
def test_warmup_from_a_snapshot_says_replayed_not_probed(capsys, snapshot, small_suite):
    code, out, _ = run(capsys, "warmup", small_suite, *snapshot, "--depth", "fast")
    assert code == 0
    rows = out.splitlines()[1:3]
    assert all(re.search(r" accepted +\d+\.\d{3} +replayed$", row) for row in rows), out
    assert "replayed from test-gpu.json (recorded on Test GPU H100, cuDNN 9.19.0 on " in out
    assert "nothing was probed, built or stored" in out


def test_warmup_at_full_from_a_fast_snapshot_is_no_data_and_exits_3(capsys, snapshot, small_suite):
    code, out, _ = run(capsys, "warmup", small_suite, *snapshot)  # --depth full is warmup's default
    assert code == 3
    assert re.search(r"small/infer +NONE +no_data ", out)
    assert "2 of the rejected have no data (only a live probe can answer them)" in out


def test_warmup_json_reports_no_data_and_the_snapshot_files(capsys, snapshot, small_suite, recorded_snapshot):
    code, out, _ = run(capsys, "warmup", small_suite, *snapshot, "--json")
    document = json.loads(out)
    assert code == 3 and {row["outcome"] for row in document["rows"]} == {"no_data"}
    assert document["totals"]["no_data"] == 2 and document["replayed_from"] == [str(recorded_snapshot)]
    assert document["engine"] == "snapshot:test-gpu.json"


def test_warmup_target_plans_a_job_without_a_gpu(capsys):
    code, out, err = run(capsys, "warmup", ROOT / "configs" / "llama-3-8b.yaml", "--target", "H100")
    assert code == 0, err
    assert ("replayed from h100-configs.json+h100-hopper-suite.json+h100-models.json (recorded on NVIDIA H100 "
            "80GB HBM3") in out


def test_warmup_target_answers_unrecorded_shapes_from_their_bucket(capsys, monkeypatch, small_suite):
    # Without --target a warmup on a machine without a GPU stores nothing and exits 1
    # (tests/cli/test_cli_warmup_inputs.py); --target replays the same bundled snapshots.
    monkeypatch.setattr(choice, "live_engine", lambda: (None, NO_DEVICE))
    code, out, err = run(capsys, "warmup", small_suite, "--depth", "fast", "--json", "--target", "h100")
    document = json.loads(out)
    assert document["engine"] == "snapshot:h100-configs.json+h100-hopper-suite.json+h100-models.json"
    assert "error:" not in err
    # The small suite's shapes are not recorded, but their classes are, over bucket ladders: each answers
    # from the row of its bucket, as the bundled snapshots recorded it.
    engine = choice.bundled_engine("h100")
    rows = {row["name"]: row for row in document["rows"]}
    for name, overrides in (("small/infer", {"is_training": False}), ("small/train-causal", {"mask": "causal"})):
        cfg = AttnConfig(**{**SMALL_DEFAULTS, **overrides})
        form = engine.bucket_for(cfg)
        assert form is not None, name
        recorded = {engine.probe(form, Backend.F16, phase, ProbeDepth.FAST).outcome for phase in form.phases}
        assert rows[name]["outcome"] == ("accepted" if recorded == {Outcome.SUPPORTED} else "rejected"), name
    assert code == (EXIT_SELECTED if document["totals"]["accepted"] == 2 else EXIT_NONE)


def test_warmup_worker_processes_with_a_snapshot_use_threads_and_say_so(capsys, snapshot, small_suite):
    code, out, err = run(capsys, "warmup", small_suite, *snapshot, "--depth", "fast", "--workers", "processes",
                         "--jobs", "2")
    assert code == 0
    assert "--workers processes: answers are replayed from test-gpu.json, nothing is built; using threads" in err


def test_warmup_snapshot_and_target_together_are_a_usage_error(capsys, snapshot, small_suite):
    code, _, err = run(capsys, "warmup", small_suite, *snapshot, "--target", "h100")
    assert code == 2 and "not allowed with argument" in err
