"""Tables as text: aligned columns for the terminal, and GitHub markdown for reports."""

from __future__ import annotations

from typing import Iterable, Sequence

COLUMN_GAP = "  "


def render_table(headers: Sequence[object] | None, rows: Iterable[Sequence[object]], *,
                 align: str = "", indent: str = "") -> str:
    """Aligned columns, lines joined by "\\n" (no final newline); `headers` None: no header line.

    Columns are two spaces apart, each as wide as its widest cell (header included). `align` has
    one letter per column, "l" or "r"; columns it does not reach are left-aligned. Every line
    starts with `indent` and ends without trailing whitespace. Cells are shown as str() shows them.
    """
    table = [[str(cell) for cell in row] for row in ([headers] if headers is not None else []) + list(rows)]
    if not table:
        return ""
    columns = max(len(row) for row in table)
    widths = [max((len(row[i]) for row in table if i < len(row)), default=0) for i in range(columns)]
    lines = []
    for row in table:
        cells = [
            cell.rjust(width) if align[i:i + 1] == "r" else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths))
        ]
        lines.append((indent + COLUMN_GAP.join(cells)).rstrip())
    return "\n".join(lines)


def _markdown_cell(value: object) -> str:
    text = "" if value is None else str(value)
    return " ".join(text.replace("|", "\\|").split())


def render_markdown_table(headers: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub markdown table: pipes in cells escaped, whitespace runs (newlines too) folded to
    one space, None shown empty, each row padded with empty cells or cut to the number of headers."""
    head = "| " + " | ".join(_markdown_cell(h) for h in headers) + " |"
    rule = "|" + "|".join("---" for _ in headers) + "|"
    body = []
    for row in rows:
        cells = [_markdown_cell(cell) for cell in row]
        cells += [""] * (len(headers) - len(cells))
        body.append("| " + " | ".join(cells[: len(headers)]) + " |")
    return "\n".join([head, rule, *body])
