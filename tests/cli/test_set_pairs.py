"""--set key=value: a field set twice takes the later value and says so on stderr (not dropped silently), and
only what is typed as a decimal number becomes one ("nan" and "inf" stay the words they were typed as)."""

from __future__ import annotations

from fusedattn_select import cli
from fusedattn_select.cli.problem_input import parse_sets


def test_a_field_set_twice_takes_the_later_value_and_says_so(capsys):
    assert parse_sets(["dropout=0.1", "dropout=0.2"]) == {"dropout": 0.2}
    assert capsys.readouterr().err == "warning: --set dropout=0.2 replaces dropout=0.1 given before it\n"
    code = cli.main(["why", "configs/llama-3-8b.yaml", "--set", "seqlen_q=512", "--set", "seqlen_q=1024"])
    assert code in (0, 1, 3)
    assert "warning: --set seqlen_q=1024 replaces seqlen_q=512 given before it" in capsys.readouterr().err


def test_only_decimal_numbers_are_read_as_numbers():
    values = parse_sets(["dropout=1e-3", "attn_scale=.5", "window_size=[128,0]", "mask=causal", "a=nan", "b=inf",
                         "c=-2E+3", "d=1e400"])
    assert values == {"dropout": 0.001, "attn_scale": 0.5, "window_size": [128, 0], "mask": "causal", "a": "nan",
                      "b": "inf", "c": -2000.0, "d": float("inf")}
