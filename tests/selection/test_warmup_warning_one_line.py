"""A problem whose warmup raises is one WARNING line (the cause named); its traceback goes to DEBUG, where
`-vv` or a library user's logging asks for it: with no logging set up, Python's last-resort handler would
print a whole traceback for one warning."""

from __future__ import annotations

import logging

from fusedattn_select.selection.local_warmup import warmup
from fusedattn_select.selection.selector import Selector
from tests.selection.test_warmup import BASE, CountingTestEngine


def test_a_raising_problem_warns_in_one_line_and_keeps_its_traceback_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="fusedattn_select")
    selector = Selector(CountingTestEngine())

    def raising(*args, **kwargs):
        raise RuntimeError("engine exploded")

    selector.select = raising  # the selector itself raising: what the warmup loop guards against
    warmup([("raises", BASE)], selector=selector)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "raised" in r.getMessage()]
    assert len(warnings) == 1 and "engine exploded" in warnings[0].getMessage(), caplog.text
    assert warnings[0].exc_info is None and "\n" not in warnings[0].getMessage()
    assert any(r.levelno == logging.DEBUG and r.exc_info for r in caplog.records), caplog.text
