"""`why --platform rocm` answers from the declared ROCm tables on any machine, and says so."""

from __future__ import annotations

import json

import pytest

from fusedattn_select.cli import main

PROBLEM = ["--set", "batch_size=2", "--set", "num_heads_q=16", "--set", "num_heads_kv=16", "--set", "seqlen_q=1024",
           "--set", "seqlen_kv=1024", "--set", "head_dim_qk=128"]


def _why(capsys, *args: str) -> tuple[int, dict]:
    code = main(["why", "--platform", "rocm", *PROBLEM, "--json", *args])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201"])
def test_every_declared_arch_answers_declared_never_probed(capsys, arch):
    code, document = _why(capsys, "--arch", arch, "--set", "mask=causal")
    selection = document["results"][0]["selection"]
    assert document["engine"] == f"declared:rocm:{arch}"
    assert document["fingerprint"]["platform"] == "rocm"
    assert selection["verdicts"] and all(v["provenance"] == "declared" for v in selection["verdicts"])
    assert all(v["stage"].startswith("declared:") for v in selection["verdicts"])
    assert all("declared, not probed" in v["message"] for v in selection["verdicts"])
    assert code == (0 if selection["backend"] != "NONE" else 1)


def test_a_declared_rejection_exits_1_with_every_reason(capsys):
    code, document = _why(capsys, "--arch", "gfx1100", "--set", "head_dim_qk=1024", "--set", "is_training=false")
    selection = document["results"][0]["selection"]
    assert code == 1 and selection["backend"] == "NONE"
    message = selection["verdicts"][0]["message"]
    assert message.startswith("declared, not probed") and "1024" in message


def test_text_output_says_declared_not_probed(capsys):
    assert main(["why", "--platform", "rocm", "--arch", "gfx942", *PROBLEM]) in (0, 1)
    captured = capsys.readouterr()
    assert "declared, not probed" in captured.out + captured.err
    assert "live_probe" not in captured.out


@pytest.mark.parametrize("args, field", [
    (["--platform", "rocm", "--arch", "h100"], "--arch"),
    (["--arch", "gfx942"], "--arch"),
    (["--platform", "rocm", "--arch", "gfx942", "--target", "h100"], "--platform"),
])
def test_bad_rocm_arguments_exit_2_naming_the_flag(capsys, args, field):
    assert main(["why", *args, *PROBLEM]) == 2
    assert f"error: {field}=" in capsys.readouterr().err


def test_without_an_amd_gpu_the_arch_must_be_given(capsys):
    # This machine has no AMD GPU (CI never has one): the error says how to get declared answers.
    assert main(["why", "--platform", "rocm", *PROBLEM]) == 2
    assert "pass --arch gfxNNN" in capsys.readouterr().err


def test_info_reports_the_rocm_facts(capsys):
    assert main(["info", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["rocm"].startswith("none: ")
    assert "hip_python" in facts


@pytest.mark.parametrize("arch, unknown", [("gfx1234", True), ("gfx942", False), ("gfx90a:sramecc+:xnack-", False)])
def test_an_architecture_no_declared_table_lists_is_said_to_be_answered_by_pytorch_sdpa_alone(capsys, arch, unknown):
    assert main(["why", "--platform", "rocm", "--arch", arch, *PROBLEM]) in (0, 1)
    captured = capsys.readouterr()
    said = f"{arch} is an architecture no declared table lists (hipdnn_sdpa: gfx942, gfx950; ck_fmha: gfx90a, " \
           "gfx942, gfx950, gfx1100, gfx1201): only pytorch_sdpa can declare it"
    assert (said in captured.out + captured.err) == unknown, captured.out + captured.err
