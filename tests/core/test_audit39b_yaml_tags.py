"""An explicit YAML tag its value cannot mean (`!!int` with no digits, `!!bool maybe`,
`!!timestamp x`) is a YAML error at its line, in a config file and in a --set value alike; PyYAML's
constructors raise IndexError, KeyError or AttributeError there, which came out as tracebacks."""

from __future__ import annotations

import pytest

from fusedattn_select.cli.problem_input import parse_sets
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import ConfigError

ENTRY = "".join(f"    {k}: {v}\n" for k, v in dict(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=128,
                                                       seqlen_kv=128, head_dim_qk=64).items())
TAGGED = ["!!int", "!!int ''", "!!float", "!!float ''", "!!bool maybe", "!!timestamp x", "!!timestamp 2001-13-14"]


@pytest.mark.parametrize("tagged", TAGGED)
def test_a_tagged_value_its_tag_cannot_mean_is_an_error_at_its_line_in_a_file(tmp_path, tagged):
    path = tmp_path / "m.yaml"
    path.write_text(f"configs:\n  - name: a\n{ENTRY}    dropout: {tagged}\n")
    with pytest.raises(ConfigError) as caught:
        load_config_file(path)
    assert caught.value.allowed.startswith("is not valid YAML: line 9, ")
    assert "cannot build this value as !!" in caught.value.allowed


@pytest.mark.parametrize("tagged", TAGGED)
def test_a_tagged_set_value_its_tag_cannot_mean_is_an_error_naming_the_key(tagged):
    with pytest.raises(ConfigError) as caught:
        parse_sets([f"dropout={tagged}"])
    assert caught.value.field == "dropout" and "cannot build this value" in caught.value.allowed


def test_tagged_values_their_tags_mean_still_read():
    assert parse_sets(["head_dim_v=!!int 64", "dropout=!!float 0.1", "is_training=!!bool no"]) == {
        "head_dim_v": 64, "dropout": 0.1, "is_training": False}
