"""What a user reads when a problem description or config file is wrong: empty files, YAML errors
with their line and column, "did you mean", and the bounds of integer fields (issue 13, item 9)."""

from __future__ import annotations

import pytest

from fusedattn_select.config import INT32_MAX, AttnConfig, allowed
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import ConfigError

BASE = dict(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128)
ENTRY = "{name: a, batch_size: 1, num_heads_q: 1, num_heads_kv: 1, seqlen_q: 1, seqlen_kv: 1, head_dim_qk: 8}"


def write(tmp_path, text, name="model.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def error(call, *args):
    with pytest.raises(ConfigError) as info:
        call(*args)
    return info.value


# ----- empty and non-mapping files ------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_an_empty_config_file_says_it_is_empty_and_what_it_must_hold(tmp_path, text):
    err = error(load_config_file, write(tmp_path, text))
    assert str(err).startswith(f"config file='{tmp_path / 'model.yaml'}': is empty; ")
    assert "'configs' list of named entries" in str(err)
    assert "NoneType" not in str(err)


def test_a_config_file_holding_a_list_names_what_it_holds(tmp_path):
    err = error(load_config_file, write(tmp_path, "- a\n- b\n"))
    assert "holds a YAML list, not a mapping" in str(err) and "'configs' list" in str(err)


# ----- YAML errors with line and column -------------------------------------------------------
def test_a_yaml_error_names_its_line_and_column(tmp_path):
    text = f"name: x\nconfigs:\n  - {ENTRY[:-1]}\n"  # the flow mapping is never closed
    err = error(load_config_file, write(tmp_path, text))
    assert "is not valid YAML: line 4, column 1: expected ',' or '}'" in str(err)
    assert "(while parsing a flow mapping at line 3, column 5)" in str(err)


def test_a_tab_in_indentation_is_reported_at_its_line(tmp_path):
    err = error(load_config_file, write(tmp_path, "configs:\n\t- {name: a}\n"))
    assert "line 2, column 1: found character '\\t' that cannot start any token" in str(err)


# ----- did you mean ---------------------------------------------------------------------------
def test_a_mistyped_field_suggests_the_field_first_without_listing_all_30():
    err = error(AttnConfig.from_dict, dict(BASE, batch_sise=2))
    assert err.field == "batch_sise"
    assert err.allowed.startswith("unknown field; did you mean 'batch_size'?")
    assert "'num_pages'" not in err.allowed  # the list of every field is left out when one fits


def test_an_unknown_field_like_no_other_lists_every_field():
    err = error(AttnConfig.from_dict, dict(BASE, zzz=1))
    assert "did you mean" not in err.allowed and "'batch_size'" in err.allowed and "'num_pages'" in err.allowed


def test_a_mistyped_choice_suggests_the_value_before_the_list():
    err = error(AttnConfig.from_dict, dict(BASE, mask="casual"))
    assert err.allowed.startswith("did you mean 'causal'? must be one of 'no_mask'")


def test_a_mistyped_file_key_suggests_the_key(tmp_path):
    err = error(load_config_file, write(tmp_path, f"config:\n  - {ENTRY}\n"))
    assert "unknown key; did you mean 'configs'?" in str(err)


def test_an_unknown_entry_name_suggests_one_and_lists_a_long_suite_shortly(tmp_path):
    entries = "".join(f"  - {ENTRY.replace('name: a', f'name: entry-{i}')}\n" for i in range(40))
    config_file = load_config_file(write(tmp_path, "configs:\n" + entries))
    err = error(config_file.get, "entry-400")
    assert err.allowed.startswith("did you mean 'entry-4")
    assert err.allowed.endswith("and 28 more") and "'entry-39'" not in err.allowed


def test_allowed_with_a_limit_counts_what_it_leaves_out():
    assert allowed(["a", "b", "c"], limit=2) == "must be one of 'a', 'b' and 1 more"
    assert allowed(["a", "b"], limit=2) == "must be one of 'a', 'b'"


# ----- bounds of integer fields ----------------------------------------------------------------
def test_a_batch_size_of_ten_to_the_21_is_rejected_naming_the_bound():
    err = error(AttnConfig.from_dict, dict(BASE, batch_size=10**21))
    assert err.field == "batch_size" and err.value == 10**21
    assert "must be at most 2147483647 (2**31-1" in err.allowed


@pytest.mark.parametrize("name", ["batch_size", "num_heads_q", "seqlen_q", "seqlen_kv", "head_dim_qk", "head_dim_v"])
def test_every_dimension_accepts_int32_max_and_rejects_one_more(name):
    small = dict(batch_size=1, num_heads_q=1, num_heads_kv=1, seqlen_q=1, seqlen_kv=1, head_dim_qk=8)
    assert getattr(AttnConfig.from_dict(dict(small, **{name: INT32_MAX})), name) == INT32_MAX
    assert error(AttnConfig.from_dict, dict(small, **{name: INT32_MAX + 1})).field == name


def test_a_window_bound_above_int32_is_rejected():
    err = error(AttnConfig.from_dict, dict(BASE, window_size=[2**40, -1]))
    assert err.field == "window_size" and "[-1, 2147483647]" in err.allowed


def test_a_tensor_of_more_elements_than_int64_strides_address_is_rejected_naming_the_product():
    huge = dict(BASE, batch_size=INT32_MAX, seqlen_q=INT32_MAX, num_heads_q=INT32_MAX, num_heads_kv=1)
    err = error(AttnConfig.from_dict, huge)
    assert err.field == "batch_size*seqlen_q*num_heads_q*head_dim_qk"
    assert err.value == INT32_MAX**3 * 128 and "elements of Q: must be at most 9223372036854775807" in err.allowed


def test_a_problem_just_inside_the_int64_range_is_accepted():
    # 2**31-1 tokens of 2**31-1 heads of dim 1 in a batch of 1: (2**31-1)**2 elements < 2**63.
    cfg = AttnConfig.from_dict(dict(BASE, batch_size=1, seqlen_q=INT32_MAX, seqlen_kv=1, num_heads_q=INT32_MAX,
                                    num_heads_kv=1, head_dim_qk=1))
    assert cfg.seqlen_q == INT32_MAX


def test_a_problem_missing_several_required_fields_names_them_all():
    err = error(AttnConfig.from_dict, dict(batch_size=2))
    assert err.field == "num_heads_q"
    assert err.allowed == "required field is missing (missing: num_heads_q, num_heads_kv, seqlen_q, seqlen_kv, head_dim_qk)"
