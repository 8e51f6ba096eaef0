"""YAML 1.1 numbers most readers misread: a leading 0 is octal (head_dim_qk: 0100 is 64) and colons
make base 60 (seqlen_q: 1:30 is 90). A config file or --set value written so is an error at its line
saying what YAML reads, never a problem of another size; ordinary spellings still read as before."""

from __future__ import annotations

import pytest

from fusedattn_select.cli.problem_input import parse_sets
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import ConfigError

ENTRY = dict(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=128, seqlen_kv=128, head_dim_qk=64)


def write(tmp_path, **fields):
    body = "".join(f"    {k}: {v}\n" for k, v in {**ENTRY, **fields}.items())
    path = tmp_path / "m.yaml"
    path.write_text(f"configs:\n  - name: a\n{body}")
    return path


@pytest.mark.parametrize("field, written, read", [
    ("head_dim_qk", "0100", "64"), ("seqlen_q", "0_200", "128"), ("batch_size", "02", "2"),
    ("seqlen_kv", "1:30", "90"), ("dropout", "0:0.1", "0.1"), ("window_size", "[010, -1]", "8"),
])
def test_an_octal_or_base_60_number_is_an_error_at_its_line(tmp_path, field, written, read):
    path = write(tmp_path, **{field: written})
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith(field))
    with pytest.raises(ConfigError) as caught:
        load_config_file(path)
    text = caught.value.allowed
    assert text.startswith(f"is not valid YAML: line {line}, ") and f"({read})" in text
    assert ("octal" in text) != ("base-60" in text)


def test_a_set_value_written_so_is_an_error_naming_the_key():
    with pytest.raises(ConfigError) as caught:
        parse_sets(["head_dim_qk=0100"])
    assert caught.value.field == "head_dim_qk" and "octal (64)" in caught.value.allowed


@pytest.mark.parametrize("written, read", [
    ("0", 0), ("-0", 0), ("+0", 0), ("128", 128), ("1_024", 1024), ("0x80", 128), ("0b1000", 8),
])
def test_ordinary_integers_still_read(written, read):
    assert parse_sets([f"seqlen_kv={written}"]) == {"seqlen_kv": read}


@pytest.mark.parametrize("written, read", [("128", 128), ("1_024", 1024), ("0x80", 128), ("0b1000", 8)])
def test_ordinary_sizes_in_a_file_still_read(tmp_path, written, read):
    assert load_config_file(write(tmp_path, seqlen_kv=written)).entries[0].config.seqlen_kv == read


@pytest.mark.parametrize("written, read", [("0.1", 0.1), ("00.5", 0.5), ("1.0e-1", 0.1), ("0.", 0.0)])
def test_ordinary_floats_still_read(tmp_path, written, read):
    assert load_config_file(write(tmp_path, dropout=written)).entries[0].config.dropout == read
