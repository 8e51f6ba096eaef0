"""tools/fp8_dk_check.py without a GPU: the problems it asks, the errors it reads and its summary."""

from __future__ import annotations

import pytest

from tools import fp8_dk_check


def test_the_default_problems_are_fp8_training_problems_of_the_suites():
    asked = fp8_dk_check.problems(list(fp8_dk_check.DEFAULT_PROBLEMS))
    assert [name for name, _ in asked] == list(fp8_dk_check.DEFAULT_PROBLEMS)
    assert all(cfg.is_fp8 and cfg.is_training for _, cfg in asked)


@pytest.mark.parametrize("name, words", [("nosuite:train", "suite must be one of"),
                                         ("llama-3-8b-fp8:no-such-entry", "has no entry 'no-such-entry'")])
def test_an_unknown_problem_is_an_error_naming_it(name, words):
    with pytest.raises(ValueError, match=words):
        fp8_dk_check.problems([name])
    with pytest.raises(SystemExit) as exit_info:
        fp8_dk_check.main(["--problems", name])
    assert exit_info.value.code == 2


def test_errors_are_read_from_a_backward_detail():
    detail = ("compared with the float32 reference on seeded data (seed 20240607): dQ max error 0.0919 (tolerance "
              "0.375); dK max error 12.3 (tolerance 0.375); dV max error 0.066 (tolerance 0.375); batch 2")
    assert fp8_dk_check.errors(detail) == {"dQ": 0.0919, "dK": 12.3, "dV": 0.066}
    assert fp8_dk_check.errors("numerics not checked: ...") == {}


def test_summary_counts_passes_errors_beyond_the_reference_and_differing_repeats():
    def row(dk, diff=0.0):
        return {"problem": "p", "tolerance": 0.375, "errors": {"dQ": 0.1, "dK": dk},
                "repeat_max_diff": [{"dQ": 0.0, "dK": diff}]}

    got = fp8_dk_check.summary([row(0.1), row(1.0), row(4.62, diff=3.5), row(0.3)])
    assert got == {"p": {"checks": 4, "dK_passed": 2, "dK_error_above_1": 1, "repeat_differed": 1}}


def test_a_config_file_gives_its_fp8_training_entries(tmp_path):
    from pathlib import Path

    race = Path(__file__).resolve().parents[2] / "probes" / "fp8-backward-race.yaml"
    asked = fp8_dk_check.config_problems(race)
    assert asked and all(name.startswith("fp8-backward-race:") for name, _ in asked)
    assert all(cfg.is_fp8 and cfg.is_training for _, cfg in asked)
    plain = tmp_path / "bf16.yaml"
    plain.write_text("name: bf16\nconfigs:\n  - {name: a, batch_size: 1, num_heads_q: 2, num_heads_kv: 2, seqlen_q: 64, "
                     "seqlen_kv: 64, head_dim_qk: 64}\n")
    with pytest.raises(ValueError, match="no FP8 training entry"):
        fp8_dk_check.config_problems(plain)
    with pytest.raises(SystemExit) as exit_info:
        fp8_dk_check.main(["--config", str(plain)])
    assert exit_info.value.code == 2


def test_errors_of_a_second_execution_are_read_too():
    detail = "dQ max error 0.09 (tolerance 0.375); dK (second execution) max error 4.62 (tolerance 0.375)"
    assert fp8_dk_check.errors(detail) == {"dQ": 0.09, "dK": 4.62}


@pytest.mark.parametrize("argv", [["--divisors", "0"], ["--repeats", "0"], ["--executions", "-1"]])
def test_counts_below_one_are_an_error_naming_the_option(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        fp8_dk_check.main(argv)
    assert exit_info.value.code == 2 and argv[0] in capsys.readouterr().err
