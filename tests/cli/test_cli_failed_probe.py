"""A recorded failed probe (out of memory) is no answer, not a refusal: `why` classes it as `matrix`
does (exit 3, text and JSON saying the probe failed), never "-> NONE" (exit 1)."""

from __future__ import annotations

import json

from fusedattn_select import cli


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_why_answers_a_failed_probe_as_no_answer_with_exit_3(capsys, recorded_snapshot, suite_file):
    code, out, err = run(capsys, "why", suite_file, "--name", "out-of-memory", "--snapshot", recorded_snapshot)
    assert code == 3, err
    last = out.rstrip().splitlines()[-1]
    assert last == ("  -> no answer: the recorded probe failed (not a refusal; record it again on a GPU): "
                    "F16 forward probe failed at build_plans: CUDA out of memory")
    assert "-> NONE" not in out and "what would work instead" not in out


def test_why_json_names_the_failed_probe_as_matrix_counts_it(capsys, recorded_snapshot, suite_file):
    code, out, _ = run(capsys, "why", suite_file, "--name", "out-of-memory", "--snapshot", recorded_snapshot, "--json")
    [result] = json.loads(out)["results"]
    assert code == 3
    assert result["answer"] == "failed" and result["alternatives"] is None
    assert result["selection"]["backend"] == "NONE" and result["selection"]["no_data"] is False
    code, out, _ = run(capsys, "matrix", suite_file, "--snapshot", recorded_snapshot, "--json")
    problems = {p["name"]: p for p in json.loads(out)["problems"]}
    assert problems["out-of-memory"]["answer"] == "failed"


def test_why_json_answer_is_the_backend_none_or_no_data(capsys, recorded_snapshot, suite_file):
    code, out, _ = run(capsys, "why", suite_file, "--snapshot", recorded_snapshot, "--json")
    answers = {r["name"]: r["answer"] for r in json.loads(out)["results"]}
    assert code == 1  # head-dim-512 is refused: 1 wins over the failed probe's 3
    assert answers["train-causal"] == "F16" and answers["head-dim-512"] == "NONE"
    assert answers["out-of-memory"] == "failed"


def test_matrix_and_why_agree_on_the_failed_probe_exit_code(capsys, recorded_snapshot, suite_file):
    why, _, _ = run(capsys, "why", suite_file, "--name", "out-of-memory", "--snapshot", recorded_snapshot)
    matrix, out, _ = run(capsys, "matrix", suite_file, "--snapshot", recorded_snapshot)
    assert why == 3 and "!1" in out


def test_a_replayed_failed_probe_is_logged_as_the_recording_s_not_as_a_probe_here(caplog, recorded_snapshot,
                                                                                suite_file, capsys):
    import logging

    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        run(capsys, "why", suite_file, "--name", "out-of-memory", "--snapshot", recorded_snapshot)
    said = [r.getMessage() for r in caplog.records if "probe failed" in r.getMessage()]
    assert said and all(m.endswith("(as recorded in the snapshot)") for m in said), said
