"""--set key=value: a field set twice is refused (the earlier value would be dropped without a word), and
only what is typed as a decimal number becomes one ("nan" and "inf" stay the words they were typed as)."""

from __future__ import annotations

import pytest

from fusedattn_select import cli
from fusedattn_select.cli.problem_input import parse_sets
from fusedattn_select.errors import ConfigError


def test_a_field_set_twice_is_refused_naming_it(capsys):
    with pytest.raises(ConfigError, match="sets dropout a second time"):
        parse_sets(["dropout=0.1", "dropout=0.2"])
    code = cli.main(["why", "configs/llama-3-8b.yaml", "--set", "seqlen_q=512", "--set", "seqlen_q=1024"])
    assert code == 2
    assert capsys.readouterr().err.strip() == ("error: --set='seqlen_q=1024': sets seqlen_q a second time: "
                                               "give each field once")


def test_only_decimal_numbers_are_read_as_numbers():
    values = parse_sets(["dropout=1e-3", "attn_scale=.5", "window_size=[128,0]", "mask=causal", "a=nan", "b=inf",
                         "c=-2E+3", "d=1e400"])
    assert values == {"dropout": 0.001, "attn_scale": 0.5, "window_size": [128, 0], "mask": "causal", "a": "nan",
                      "b": "inf", "c": -2000.0, "d": float("inf")}
