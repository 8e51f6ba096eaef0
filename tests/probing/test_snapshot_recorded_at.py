"""A snapshot's recorded_at is read alike on every supported Python (3.11's fromisoformat takes forms 3.10's
refuses): the recorder's own form, a trailing Z, milli- or microseconds; a basic-format or impossible time
is refused naming the field."""

from __future__ import annotations

import pytest

from fusedattn_select.probing.snapshot import _recorded_at


@pytest.mark.parametrize("text", ["2026-11-27T17:08:06+00:00", "2026-11-27T17:08:06Z", "2026-11-27 17:08:06",
                                  "2026-11-27T17:08:06.123+00:00", "2026-11-27T17:08:06.123456-05:00", "2026-11-27"])
def test_iso_times_every_python_reads_are_taken(text):
    assert _recorded_at(text) == text


@pytest.mark.parametrize("text", ["20261127T170806", "2026-11-27T17:08:06.1234", "2026-11-27T25:00:00", "yesterday",
                                  5, None])
def test_other_times_are_refused_naming_the_field(text):
    with pytest.raises(ValueError, match="recorded_at="):
        _recorded_at(text)
