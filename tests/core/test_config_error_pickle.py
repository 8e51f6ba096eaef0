"""ConfigError crosses processes (multiprocessing, distributed) and copies whole: field, value, allowed
and its message; it is built without super().__init__() so that dynamo can trace its raise."""

from __future__ import annotations

import copy
import pickle

from fusedattn_select.errors import SHOWN_CHARACTERS, ConfigError


def _same(got: ConfigError, want: ConfigError) -> None:
    assert type(got) is ConfigError
    assert (got.field, got.value, got.allowed) == (want.field, want.value, want.allowed)
    assert (str(got), repr(got), got.args) == (str(want), repr(want), want.args)


def test_config_error_pickles_and_copies_with_its_fields():
    err = ConfigError("mask", "bogus", "must be one of 'no_mask', 'causal'")
    err.add_note("while reading model.yaml")
    assert err.args == ("mask='bogus': must be one of 'no_mask', 'causal'",)
    assert str(err) == err.args[0] and repr(err) == f"ConfigError({err.args[0]!r})"
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(err, protocol))
        _same(back, err)
        assert back.__notes__ == ["while reading model.yaml"]
    _same(copy.copy(err), err)
    _same(copy.deepcopy(err), err)


def test_a_long_value_is_cut_in_the_message_and_kept_whole_across_pickling():
    err = ConfigError("x" * 5, list(range(10_000)), "must be short")
    back = pickle.loads(pickle.dumps(err))
    _same(back, err)
    assert back.value == list(range(10_000)) and len(str(back)) < SHOWN_CHARACTERS + 100
