"""The one table renderer of the command line (fusedattn_select.cli.table) and the tables built on it."""

from __future__ import annotations

from fusedattn_select.cli.table import render_markdown_table, render_table
from fusedattn_select.cli.warmup_command import format_report
from fusedattn_select.selection.local_warmup import WarmupOutcome, WarmupReport, WarmupRow
from fusedattn_select.types import Backend, ProbeDepth


def test_columns_are_as_wide_as_their_widest_cell_and_two_spaces_apart():
    text = render_table(("name", "n"), [("a", 1), ("longer", 22)])
    assert text.splitlines() == ["name    n", "a       1", "longer  22"]


def test_lines_carry_no_trailing_whitespace_even_when_the_last_cell_is_empty():
    text = render_table(("key", "value"), [("first", ""), ("x", "y")])
    assert text.splitlines() == ["key    value", "first", "x      y"]


def test_align_r_right_aligns_a_column_and_others_stay_left():
    text = render_table(("name", "seconds", "note"), [("a", "0.125", "ok"), ("bb", "12.500", "")], align="lr")
    assert text.splitlines() == ["name  seconds  note", "a       0.125  ok", "bb     12.500"]


def test_indent_starts_every_line_and_no_headers_means_no_header_line():
    text = render_table(None, [("k", "v"), ("key", None)], indent="  ")
    assert text.splitlines() == ["  k    v", "  key  None"]


def test_markdown_table_escapes_pipes_folds_whitespace_and_fits_rows_to_the_headers():
    table = render_markdown_table(("a", "b", "c"), [("x|y", "two\nlines"), (1, None, 3.5, "extra")])
    assert table.splitlines() == ["| a | b | c |", "|---|---|---|", "| x\\|y | two lines |  |", "| 1 |  | 3.5 |"]


def test_warmup_report_table_right_aligns_seconds_and_ends_with_the_summary():
    rows = (
        WarmupRow("model/train", "k1", Backend.F16, WarmupOutcome.ACCEPTED, "", 0.0123, False, ("model/again",)),
        WarmupRow("model/wide", "k2", Backend.NONE, WarmupOutcome.REJECTED, "head dim above 256", 12.5, True),
    )
    text = format_report(WarmupReport(rows, wall_seconds=12.6, depth=ProbeDepth.FAST, jobs=2))
    assert text.splitlines() == [
        "name                         backend  outcome   seconds  answer  reason",
        "model/train (= model/again)  F16      accepted    0.012  probed",
        "model/wide                   NONE     rejected   12.500  cached  head dim above 256",
        "1 accepted, 1 rejected, 0 failed in 12.60 s",
    ]
