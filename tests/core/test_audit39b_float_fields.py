"""attn_scale and dropout given an integer beyond any float (YAML reads a long digit string as an int):
a ConfigError naming the field, from Python, a config file and --set alike, never an OverflowError."""

from __future__ import annotations

import pytest

from fusedattn_select import AttnConfig
from fusedattn_select.cli.problem_input import problems
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import ConfigError

BASE = dict(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=128, seqlen_kv=128, head_dim_qk=64)
HUGE = 10**400  # float(HUGE) raises OverflowError


@pytest.mark.parametrize("field", ["attn_scale", "dropout"])
@pytest.mark.parametrize("value", [HUGE, -HUGE])
def test_an_int_beyond_any_float_is_a_config_error_naming_the_field(field, value):
    with pytest.raises(ConfigError) as caught:
        AttnConfig(**BASE, **{field: value})
    assert caught.value.field == field and caught.value.value == value
    assert "must be a" in caught.value.allowed


@pytest.mark.parametrize("field", ["attn_scale", "dropout"])
def test_a_config_file_with_such_a_value_names_file_entry_and_field(tmp_path, field):
    body = "".join(f"    {k}: {v}\n" for k, v in BASE.items())
    path = tmp_path / "m.yaml"
    path.write_text(f"configs:\n  - name: big\n{body}    {field}: {HUGE}\n")
    with pytest.raises(ConfigError) as caught:
        load_config_file(path)
    assert caught.value.field == f"{path}: big: {field}"


def test_set_with_such_a_value_is_a_config_error():
    sets = [f"{k}={v}" for k, v in BASE.items()] + [f"dropout={HUGE}"]
    with pytest.raises(ConfigError) as caught:
        problems(None, None, None, sets)
    assert caught.value.field == "dropout"


def test_ints_that_are_floats_still_become_floats():
    cfg = AttnConfig(**BASE, attn_scale=2, dropout=0)
    assert (type(cfg.attn_scale), type(cfg.dropout)) == (float, float)
    assert cfg.cache_key() == AttnConfig(**BASE, attn_scale=2.0).cache_key()
