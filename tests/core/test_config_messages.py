"""What a user reads when a problem description or config file is wrong: empty files, YAML errors
with their line and column, "did you mean", and the bounds of integer fields (issue 13, item 9)."""

from __future__ import annotations

import pytest

from fusedattn_select.config import INT32_MAX, MASKS, AttnConfig, allowed, did_you_mean
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


@pytest.mark.parametrize("field, written, meant", [
    ("qkv_layout", "bshd", "bshd_bshd_bshd"),  # spelling alone chose 'bsh3d', another layout
    ("qkv_layout", "SBHD", "sbhd_sbhd_sbhd"),
    ("mask", "causal_bottom", "causal_bottom_right"),
    ("mask", "causal_mask", "causal"),
    ("bias", "alibi_bias", "alibi"),
])
def test_a_value_cut_short_or_run_on_suggests_the_value_it_starts_or_ends(field, written, meant):
    err = error(AttnConfig.from_dict, dict(BASE, **{field: written}))
    assert err.allowed.startswith(f"did you mean {meant!r}? must be one of")


def test_an_unknown_field_that_starts_with_a_field_suggests_that_field():
    err = error(AttnConfig.from_dict, dict(BASE, mask_type="causal"))  # spelling alone chose 'qkv_dtype'
    assert err.allowed.startswith("unknown field; did you mean 'mask'?")


@pytest.mark.parametrize("written, meant", [
    # A value that starts with another value ('causal', 'padding', 'padding_causal') was suggested that
    # value although it is a typo of a longer one.
    ("causal_bottom_rigth", "causal_bottom_right"),
    ("padding_casual", "padding_causal"),
    ("padding_causal_botom_right", "padding_causal_bottom_right"),
    ("Padding_Casual", "padding_causal"),
])
def test_a_typo_of_a_value_suggests_that_value_before_one_it_starts_with(written, meant):
    err = error(AttnConfig.from_dict, dict(BASE, mask=written))
    assert err.allowed.startswith(f"did you mean {meant!r}? must be one of")


def test_did_you_mean_suggests_only_one_of_the_choices_given():
    assert did_you_mean("bshd", ["bsh3d", "bshd_bshd_bshd"]) == "did you mean 'bshd_bshd_bshd'? "
    assert did_you_mean("mask_type", MASKS) == ""  # a field name is no value of mask
    assert did_you_mean("", MASKS) == "" and did_you_mean(3, MASKS) == ""


@pytest.mark.parametrize("text, meant", [("1e-1", "0.1"), ("5e-6", "5.0e-06"), ("5E-1", "0.5")])
def test_a_float_yaml_reads_as_text_says_to_write_it_with_a_decimal_point(tmp_path, text, meant):
    err = error(load_config_file, write(tmp_path, f"configs:\n  - {ENTRY[:-1]}, dropout: {text}}}\n"))
    assert err.field.endswith("a: dropout") and err.value == text
    assert f"'{text}' is text, not a number" in err.allowed
    assert f"write it with a decimal point, as {meant}" in err.allowed
    fixed = load_config_file(write(tmp_path, f"configs:\n  - {ENTRY[:-1]}, dropout: {meant}}}\n", "fixed.yaml"))
    assert fixed.entries[0].config.dropout == float(text)


@pytest.mark.parametrize("text, meant", [("0.1", "0.1"), ("0.25", "0.25"), (" .5", "0.5")])
def test_a_quoted_float_says_it_is_text_and_to_write_it_without_quotes(tmp_path, text, meant):
    # It used to blame an exponent the text does not have and ask for a decimal point it has.
    err = error(load_config_file, write(tmp_path, f'configs:\n  - {ENTRY[:-1]}, dropout: "{text}"}}\n'))
    assert err.field.endswith("a: dropout") and err.value == text
    assert err.allowed.endswith(f"; {text!r} is text (quoted), not a number: write the number without quotes, "
                                f"as {meant}"), err.allowed
    assert "exponent" not in err.allowed and "decimal point" not in err.allowed
    fixed = load_config_file(write(tmp_path, f"configs:\n  - {ENTRY[:-1]}, dropout: {meant}}}\n", "fixed.yaml"))
    assert fixed.entries[0].config.dropout == float(text)


@pytest.mark.parametrize("field, text", [("dropout", "0.1"), ("attn_scale", "2"), ("dropout", "1e-1")])
def test_a_str_from_python_gets_the_exponent_explanation_only_with_an_exponent(field, text):
    err = error(AttnConfig.from_dict, dict(BASE, **{field: text}))
    assert err.field == field
    assert ("exponent" in err.allowed) == ("e" in text) and ("without quotes" in err.allowed) != ("e" in text)


def test_attn_scale_written_as_text_says_the_same():
    err = error(AttnConfig.from_dict, dict(BASE, attn_scale="1e-1"))
    assert err.field == "attn_scale" and "write it with a decimal point, as 0.1" in err.allowed
    assert "decimal point" not in error(AttnConfig.from_dict, dict(BASE, dropout="high")).allowed


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
