"""`why --platform rocm`: deeper depths answer no data (exit 3), bogus gfx targets exit 2, a missing hip-python names
the extra, and no cuDNN rule answers a ROCm question."""

from __future__ import annotations

import json
import sys

import pytest

from fusedattn_select.cli import main

PROBLEM = ["--set", "batch_size=2", "--set", "num_heads_q=16", "--set", "num_heads_kv=16", "--set", "seqlen_q=1024",
           "--set", "seqlen_kv=1024", "--set", "head_dim_qk=128", "--set", "mask=causal_bottom_right",
           "--set", "is_training=false"]
NO_DATA_EXIT = 3  # docs/cli.md, exit codes: nothing refused, some problem has no data


def _why(capsys, *args: str) -> tuple[int, dict]:
    code = main(["why", "--platform", "rocm", "--arch", "gfx942", *PROBLEM, "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_at_depth_fast_the_declared_table_answers_supported(capsys):
    code, document = _why(capsys)
    (verdict,) = document["results"][0]["selection"]["verdicts"]
    assert code == 0 and (verdict["outcome"], verdict["depth"]) == ("supported", "fast")


@pytest.mark.parametrize("flag, depth", [("--verify", "verify"), ("--full", "full")])
def test_a_deeper_depth_is_no_data_at_depth_fast_and_exits_3(capsys, flag, depth):
    code, document = _why(capsys, flag)
    assert code == NO_DATA_EXIT and document["probe_depth"] == depth
    result = document["results"][0]
    (verdict,) = result["selection"]["verdicts"]
    assert (verdict["outcome"], verdict["depth"], verdict["provenance"]) == ("no_data", "fast", "declared")
    assert not result.get("verified")
    assert "at depth fast only" in verdict["message"] and "live hipDNN probe" in verdict["message"]


def test_the_text_answer_at_verify_says_no_data_and_why(capsys):
    assert main(["why", "--platform", "rocm", "--arch", "gfx942", *PROBLEM, "--verify"]) == NO_DATA_EXIT
    out = capsys.readouterr().out
    assert "-> no data" in out and "at depth fast only" in out and "verified" not in out


def test_an_fp8_paged_decode_is_not_refused_by_a_cudnn_rule(capsys):
    paged = ["--set", "qkv_dtype=fp8_e4m3", "--set", "o_dtype=fp8_e4m3", "--set", "seqlen_q=1",
             "--set", "qkv_layout=paged_kv_bshd_bshd_bshd", "--set", "mask=padding_causal_bottom_right",
             "--set", "page_size=64", "--set", "num_pages=1024"]
    code, document = _why(capsys, *paged)
    (verdict,) = document["results"][0]["selection"]["verdicts"]
    assert verdict["provenance"] == "declared" and not verdict["stage"].startswith("rule:")
    assert "cuDNN" not in verdict["message"]
    assert code == NO_DATA_EXIT and "page_size=64" in verdict["message"]


@pytest.mark.parametrize("arch", ["gfxfff", "gfx0", "gfx94", "gfx9420", "gfx5aa", "gfx942:", "GFX942", "gfx942x"])
def test_a_value_that_is_no_gfx_target_exits_2_with_one_error_line(capsys, arch):
    assert main(["why", "--platform", "rocm", "--arch", arch, *PROBLEM]) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --arch={arch!r}: must be an AMD GPU target")
    assert "'gfx90a'" in errors[0] and "'gfx1100'" in errors[0]
    assert captured.out == ""


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201", "gfx1234", "gfx908", "gfx1151",
                                  "gfx942:sramecc+:xnack-"])
def test_every_gfx_target_is_answered(capsys, arch):
    assert main(["why", "--platform", "rocm", "--arch", arch, *PROBLEM]) in (0, 1, NO_DATA_EXIT)
    assert "error:" not in capsys.readouterr().err


def test_every_arch_a_declared_table_lists_is_a_valid_target():
    from fusedattn_select.cli.engines import GFX_TARGET
    from fusedattn_select.probing.rocm import DeclaredRocmEngine

    listed = {arch for archs in DeclaredRocmEngine("gfx942").listed().values() for arch in archs}
    assert listed and all(GFX_TARGET.fullmatch(arch) for arch in listed)


def test_without_hip_python_the_error_names_the_rocm_extra_once(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)  # hides hip-python: `import hip` raises ImportError
    assert main(["why", "--platform", "rocm", *PROBLEM]) == 2
    err = capsys.readouterr().err
    assert err.count("pip install 'fusedattn-select[rocm]'") == 1 and "--arch" in err
