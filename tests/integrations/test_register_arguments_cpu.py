"""register()'s arguments, checked before anything is registered: a name that is a non-empty string
and none of transformers' own implementations, and build-ahead arguments only with model= (without
a model nothing would use them). Real transformers interfaces; nothing is built.
"""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.integrations.transformers import register  # noqa: E402

UNUSED = "fusedattn_arguments_test"  # a name no test registers


def registered_names() -> set[str]:
    return set(AttentionInterface()) | set(AttentionMaskInterface())


def own_functions() -> dict[str, str]:
    """Where each of transformers' entries comes from, to see that none was replaced."""
    return {f"{kind}:{key}": function.__module__ for kind, interface in (("attn", AttentionInterface()),
                                                                          ("mask", AttentionMaskInterface()))
            for key, function in interface.items() if function.__module__.startswith("transformers.")}


@pytest.mark.parametrize("arguments, field", [
    ({"max_batch": -1}, "max_batch"), ({"max_batch": 2}, "max_batch"), ({"max_batch": True}, "max_batch"),
    ({"max_length": 0}, "max_length"), ({"max_length": 4096}, "max_length"),
    ({"training": "yes"}, "training"), ({"training": False}, "training"),
])
def test_build_ahead_arguments_without_a_model_are_an_error(arguments, field):
    with pytest.raises(ConfigError) as raised:
        register(UNUSED, **arguments)
    assert raised.value.field == field
    assert UNUSED not in registered_names()


def test_build_ahead_arguments_given_without_a_model_say_they_need_one():
    with pytest.raises(ConfigError, match=r"max_batch=2: applies only with model="):
        register(UNUSED, max_batch=2)
    with pytest.raises(ConfigError, match=r"training=False: applies only with model="):
        register(UNUSED, training=False)


@pytest.mark.parametrize("name", [123, None, "", b"fusedattn", ["fusedattn"]])
def test_the_name_must_be_a_non_empty_string(name):
    before = registered_names()
    with pytest.raises(ConfigError) as raised:
        register(name)
    assert raised.value.field == "name" and "non-empty string" in raised.value.allowed
    assert registered_names() == before


@pytest.mark.parametrize("name", ["sdpa", "eager", "flash_attention_2", "flex_attention", "paged|eager"])
def test_transformers_own_implementations_are_not_replaced(name):
    before = own_functions()
    with pytest.raises(ConfigError) as raised:
        register(name)
    assert raised.value.field == "name" and "transformers' own" in raised.value.allowed
    assert "'sdpa'" in raised.value.allowed and "'eager'" in raised.value.allowed
    assert own_functions() == before


@pytest.mark.parametrize("name, reading", [("my_flash", "flash attention"), ("org/kernel", "Hub"),
                                           ("paged|fusedattn", "prefix"), ("fusedattn_sdpa", "sdpa")])
def test_names_transformers_reads_as_something_else_are_refused(name, reading):
    with pytest.raises(ConfigError) as raised:
        register(name)
    assert raised.value.field == "name" and reading in raised.value.allowed
    assert name not in registered_names()


def test_register_without_arguments_still_registers_and_is_idempotent():
    assert register() == "fusedattn"
    assert register("fusedattn") == "fusedattn"  # our own earlier entry is not one of transformers'
    assert register(max_batch=None, max_length=None, training=None) == "fusedattn"  # the defaults
    assert "fusedattn" in AttentionInterface() and "fusedattn" in AttentionMaskInterface()
