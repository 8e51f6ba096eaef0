"""The YAML config file format: defaults merged into each entry, names, and errors naming the place."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusedattn_select import AttnConfig, ConfigError
from fusedattn_select.config_files import load_config_file, parse_config_file

BASE = dict(batch_size=2, num_heads_q=32, num_heads_kv=8, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128)


def write(tmp_path, text: str, name: str = "model.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD_FILE = """
name: tiny
description: a tiny model
source: https://example.org/tiny
defaults: {num_heads_q: 8, num_heads_kv: 2, head_dim_qk: 64, mask: causal}
configs:
  - {name: train, batch_size: 2, seqlen_q: 512, seqlen_kv: 512}
  - {name: decode, batch_size: 16, seqlen_q: 1, seqlen_kv: 4096, mask: causal_bottom_right, is_training: false}
"""


def test_config_file_merges_defaults_into_each_entry(tmp_path):
    config_file = load_config_file(write(tmp_path, GOOD_FILE))
    assert (config_file.name, config_file.description, config_file.source) == (
        "tiny", "a tiny model", "https://example.org/tiny")
    train, decode = config_file.entries
    assert train.config == AttnConfig(batch_size=2, num_heads_q=8, num_heads_kv=2, seqlen_q=512, seqlen_kv=512,
                                      head_dim_qk=64, mask="causal")
    assert decode.config.mask == "causal_bottom_right" and decode.config.num_heads_kv == 2
    assert config_file.get("decode") is decode


def test_config_file_name_defaults_to_the_file_stem(tmp_path):
    text = "configs:\n  - {name: a, batch_size: 1, num_heads_q: 1, num_heads_kv: 1, seqlen_q: 1, seqlen_kv: 1, head_dim_qk: 8}\n"
    assert load_config_file(write(tmp_path, text, "gpt-tiny.yaml")).name == "gpt-tiny"


def test_config_file_get_unknown_name_lists_the_names(tmp_path):
    config_file = load_config_file(write(tmp_path, GOOD_FILE))
    with pytest.raises(ConfigError, match="'train', 'decode'"):
        config_file.get("prefill")


@pytest.mark.parametrize("text, where, message", [
    (GOOD_FILE.replace("name: decode", "name: train"), "configs[1].name", "must be unique"),
    (GOOD_FILE + "owner: me\n", "owner", "unknown key"),
    (GOOD_FILE.replace("seqlen_q: 512,", "seqlen_q: 512, head_dim: 64,"), "train: head_dim", "unknown field"),
    (GOOD_FILE.replace("head_dim_qk: 64", "head_dim_qk: 0"), "train: head_dim_qk", "positive integer"),
    (GOOD_FILE.replace("{name: train, ", "{"), "configs[0].name", "non-empty string"),
    ("configs: []\n", "configs", "non-empty list"),
    ("name: x\n", "configs", "non-empty list"),
    ("defaults: [1]\nconfigs: [{name: a}]\n", "defaults", "must be a mapping"),
    # 0, [] and null were read as no defaults at all
    ("defaults: 0\nconfigs: [{name: a}]\n", "defaults", "must be a mapping"),
    ("defaults: []\nconfigs: [{name: a}]\n", "defaults", "must be a mapping"),
    ("defaults:\nconfigs: [{name: a}]\n", "defaults", "leave the key out for no defaults"),
    ("configs: [train]\n", "configs[0]", "must be a mapping"),
    ("- just\n- a list\n", "config file", "holds a YAML list, not a mapping"),
])
def test_config_file_errors_name_the_place(tmp_path, text, where, message):
    with pytest.raises(ConfigError) as info:
        load_config_file(write(tmp_path, text))
    assert where in info.value.field
    assert message in str(info.value)


def test_config_file_with_bad_yaml_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config_file(write(tmp_path, "configs: [\n  - {name: a\n"))


def test_missing_config_file_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config_file(tmp_path / "missing.yaml")


def test_binary_config_file_raises_config_error(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config_file(path)


def test_parse_config_file_accepts_parsed_data():
    data = {"configs": [dict(BASE, name="a")]}
    assert parse_config_file(data).entries[0].config == AttnConfig(**BASE)
