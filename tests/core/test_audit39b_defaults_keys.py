"""An unknown key under a config file's `defaults` is an error naming `defaults`, not the first entry
(which does not hold it); a key that is a field's likely spelling gets that field."""

from __future__ import annotations

import pytest

from fusedattn_select.config_files import parse_config_file
from fusedattn_select.errors import ConfigError

ENTRY = dict(name="a", batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=128, seqlen_kv=128, head_dim_qk=64)


@pytest.mark.parametrize("key, says", [
    ("mask_type", "did you mean 'mask'?"), ("foo", "must be one of 'batch_size'"), ("name", "an entry's name goes in the entry"),
])
def test_an_unknown_defaults_key_is_named_under_defaults(key, says):
    with pytest.raises(ConfigError) as caught:
        parse_config_file({"defaults": {key: "x"}, "configs": [ENTRY]}, "m.yaml")
    assert caught.value.field == f"m.yaml: defaults: {key}"
    assert caught.value.allowed.startswith("unknown field; ") and says in caught.value.allowed


def test_known_defaults_still_merge():
    loaded = parse_config_file({"defaults": {"mask": "causal"}, "configs": [ENTRY]}, "m.yaml")
    assert loaded.entries[0].config.mask == "causal"
