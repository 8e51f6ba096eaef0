"""use_snapshots()'s errors say what it takes, and it takes what they say: files, or no files (None) with a
target; None alone is refused, so no error lists None as a value that works by itself."""

from __future__ import annotations

import pytest

from fusedattn_select import use_snapshots
from fusedattn_select.errors import ConfigError
from fusedattn_select.selection.selector import default_selector


@pytest.mark.parametrize("snapshots", [5, b"x.json", [3]])
def test_a_value_that_is_no_path_is_told_that_none_needs_a_target(snapshots):
    with pytest.raises(ConfigError) as raised:
        use_snapshots(snapshots)
    allowed = raised.value.allowed
    assert "path" in allowed and "target='h100' or 'h200'" in allowed
    assert not allowed.endswith("or None")  # None alone is refused (below)


def test_none_alone_is_refused_and_none_with_a_target_answers_as_the_errors_say():
    with pytest.raises(ConfigError) as raised:
        use_snapshots(None)
    assert raised.value.field == "snapshots" and "target='h100' or 'h200'" in raised.value.allowed
    assert use_snapshots(None, target="h100").engine_name.startswith("snapshot:h100-")


def test_an_empty_target_is_named_as_the_target_not_ignored():
    before = default_selector()
    with pytest.raises(ConfigError) as raised:
        use_snapshots(target="")
    assert raised.value.field == "target" and "'h100', 'h200'" in raised.value.allowed
    assert default_selector() is before


def test_the_docstring_says_what_none_means():
    assert "None" in use_snapshots.__doc__ and "target" in use_snapshots.__doc__
