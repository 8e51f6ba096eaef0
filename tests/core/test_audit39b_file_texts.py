"""A config file's name, description and source keys left empty (YAML null) are no text, not the
text 'None' shown as the model's description or each entry's source."""

from __future__ import annotations

import pytest

from fusedattn_select.config_files import load_config_file

ENTRY = "  - {name: a, batch_size: 2, num_heads_q: 8, num_heads_kv: 8, seqlen_q: 128, seqlen_kv: 128, head_dim_qk: 64}\n"


@pytest.mark.parametrize("written", ["", " null", " ~"])
def test_empty_description_source_and_name_are_no_text(tmp_path, written):
    path = tmp_path / "tiny.yaml"
    path.write_text(f"name:{written}\ndescription:{written}\nsource:{written}\nconfigs:\n{ENTRY}")
    loaded = load_config_file(path)
    assert (loaded.name, loaded.description, loaded.source, loaded.entries[0].source) == ("tiny", "", "", "")


def test_given_texts_are_kept(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(f"name: m\ndescription: d\nsource: s\nconfigs:\n{ENTRY}")
    loaded = load_config_file(path)
    assert (loaded.name, loaded.description, loaded.source, loaded.entries[0].source) == ("m", "d", "s", "s")
