"""declare_backend given a name that is not a string is a ConfigError naming the field, like any other
name that is no upper-case identifier; it was an AttributeError (or a TypeError for a list)."""

from __future__ import annotations

import pytest

from fusedattn_select.errors import ConfigError
from fusedattn_select.types import Backend, declare_backend


@pytest.mark.parametrize("name", [5, b"TOY", ["TOY"], None, "", "toy", "TOY-1"])
def test_a_name_that_is_no_upper_case_identifier_is_a_config_error(name):
    with pytest.raises(ConfigError) as caught:
        declare_backend(name)
    assert caught.value.field == "backend"


def test_built_in_names_give_the_built_in_members():
    assert declare_backend("F16") is Backend.F16 and declare_backend("NONE") is Backend.NONE
