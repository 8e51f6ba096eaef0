"""Salvage a damaged database: copy every row SQLite can still read into a fresh file.

Rows are read through each table's own b-tree (`NOT INDEXED`), so a damaged index page loses
nothing. A damaged table page fails the scan at that page: the scan resumes at the first rowid
past it that can be read again (found by seeking, which descends the b-tree from its root), and
the rows in between are lost. How many were lost comes from an index that still counts the table,
when one does; otherwise it is unknown.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

# The columns of each data table copied into the fresh database (the schema of SCHEMA_VERSION).
TABLE_COLUMNS = {
    "fingerprints": ("fingerprint_key", "fingerprint", "created"),
    "verdicts": ("fingerprint_key", "config_key", "depth", "verdicts", "size", "created", "last_used"),
    "plans": ("fingerprint_key", "plan_key", "sha256", "size", "created", "last_used", "blob"),
}
# Seeks past a damaged page grow by powers of two up to this rowid distance (SQLite rowids are int64).
_MAX_SEEK = 2**62


@dataclass
class SalvageReport:
    """Rows copied per table, and rows lost per table (None: unknown, no index could count them)."""

    salvaged: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int | None] = field(default_factory=dict)

    def describe(self) -> str:
        """e.g. "salvaged 17 decisions, 1 plans, 1 fingerprints; lost 0 rows"."""
        names = {"verdicts": "decisions", "plans": "plans", "fingerprints": "fingerprints"}
        kept = ", ".join(f"{self.salvaged.get(table, 0)} {names[table]}" for table in TABLE_COLUMNS)
        if any(count is None for count in self.lost.values()):
            known = sum(count or 0 for count in self.lost.values())
            return f"salvaged {kept}; lost {known} rows and an unknown number of rows on unreadable pages"
        return f"salvaged {kept}; lost {sum(self.lost.values())} rows"


def salvage(damaged: Path, fresh: sqlite3.Connection) -> SalvageReport:
    """Copy every readable row of the data tables of `damaged` into `fresh` (a database with the
    current schema, in one transaction the caller commits)."""
    report = SalvageReport()
    try:
        source = sqlite3.connect(f"{damaged.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return SalvageReport({}, {table: None for table in TABLE_COLUMNS})
    try:
        for table, columns in TABLE_COLUMNS.items():
            copied = 0
            insert = (f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) "
                      f"VALUES ({', '.join('?' * len(columns))})")
            for row in readable_rows(source, table, columns):
                copied += fresh.execute(insert, row).rowcount
            report.salvaged[table] = copied
            counted = indexed_count(source, table)
            report.lost[table] = None if counted is None else max(counted - copied, 0)
    finally:
        source.close()
    return report


def readable_rows(conn: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> Iterator[tuple]:
    """Every row of `table` whose pages can be read, in rowid order, skipping damaged stretches."""
    select = f"SELECT rowid, {', '.join(columns)} FROM {table} NOT INDEXED WHERE rowid >= ? ORDER BY rowid"
    start = -(2**63)
    while True:
        try:
            for row in conn.execute(select, (start,)):
                start = row[0] + 1
                yield row[1:]
            return
        except sqlite3.DatabaseError:
            # The cursor may have read one row ahead when stepping failed: `start` itself is sought.
            row = _next_readable(lambda rowid: conn.execute(select + " LIMIT 1", (rowid,)).fetchone(), start - 1)
            if row is None:
                return
            start = row[0] + 1
            yield row[1:]


def _next_readable(seek: Callable[[int], tuple | None], failed: int) -> tuple | None:
    """The first readable row past the smallest rowid > `failed` from which reading works again
    (None: reading works nowhere, or no row is left). `seek(rowid)` raises where reading fails."""
    step = 1
    while True:
        if step > _MAX_SEEK:
            return None
        try:
            seek(failed + step)
            break
        except sqlite3.DatabaseError:
            failed, step = failed + step, step * 2
    low, high = failed, failed + step  # reading fails at low, works at high
    while high - low > 1:
        middle = (low + high) // 2
        try:
            seek(middle)
            high = middle
        except sqlite3.DatabaseError:
            low = middle
    return seek(high)


def indexed_count(conn: sqlite3.Connection, table: str) -> int | None:
    """The number of rows of `table` by one of its indexes that can still be read (None: none can)."""
    try:
        indexes = [row[1] for row in conn.execute(f"PRAGMA index_list({table})")]
    except sqlite3.DatabaseError:
        return None
    for index in indexes:
        try:
            column = conn.execute(f"PRAGMA index_info({index})").fetchone()[2]
            # COUNT(*) would scan the smallest index whatever INDEXED BY says; COUNT(column) scans
            # this one (every indexed column of this schema is NOT NULL, so it counts every row).
            return conn.execute(f"SELECT COUNT({column}) FROM {table} INDEXED BY {index}").fetchone()[0]
        except (sqlite3.DatabaseError, TypeError):
            continue
    return None
