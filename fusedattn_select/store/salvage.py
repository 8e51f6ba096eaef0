"""Salvage a damaged database: every row that can still be read, for a fresh file (`salvage`) or
for a command that only reads (`recover`).

Two readers, combined:
- SQLite, through each table's own b-tree (`NOT INDEXED`, so a damaged index page loses nothing).
  A damaged table page fails the scan at that page: the scan resumes at the first rowid past it
  that can be read again (found by seeking, which descends the b-tree from its root). What SQLite
  reads is authoritative.
- the page scanner (pages.py), which reads the leaf pages without the b-tree above them, as
  SQLite's `.recover` does. It adds the rows SQLite cannot reach: those under a damaged root or
  interior page, and every row of a file whose page 1 is damaged or that is cut short.
Rows are kept once per primary key. How many rows were lost comes from an index that still counts
the table, when one does; otherwise it is unknown.
"""

from __future__ import annotations

import itertools
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from fusedattn_select.store.pages import scan
from fusedattn_select.store.schema import LEGACY_RUNNER_PREFIX, legacy_runner_row

# The columns of each data table copied into the fresh database (the schema of SCHEMA_VERSION).
TABLE_COLUMNS = {
    "fingerprints": ("fingerprint_key", "fingerprint", "created"),
    "verdicts": ("fingerprint_key", "config_key", "depth", "verdicts", "size", "created", "last_used"),
    "plans": ("fingerprint_key", "plan_key", "sha256", "size", "created", "last_used", "blob"),
    "runner_choices": ("fingerprint_key", "runner_key", "choice", "size", "created", "last_used"),
}
# How many leading columns of TABLE_COLUMNS make each table's primary key.
_KEY_COLUMNS = {"fingerprints": 1, "verdicts": 2, "plans": 2, "runner_choices": 2}
# What each column of TABLE_COLUMNS holds. Every column is NOT NULL, so these shapes tell the tables
# apart; SQLite stores an integral REAL as an integer on disk, and reads it back as a REAL.
_COLUMN_KINDS = {
    "fingerprints": ("text", "text", "real"),
    "verdicts": ("text", "text", "text", "text", "integer", "real", "real"),
    "plans": ("text", "text", "text", "integer", "real", "real", "blob"),
    "runner_choices": ("text", "text", "text", "integer", "real", "real"),
}
# The Python types a value of each kind is read as (the first) or stored as on disk; the types of
# the rows of each table as stored, and as read.
_TYPES_OF_KIND = {"text": (str,), "integer": (int,), "real": (float, int), "blob": (bytes,)}
_STORED_TYPES = {table: set(itertools.product(*(_TYPES_OF_KIND[kind] for kind in kinds)))
                 for table, kinds in _COLUMN_KINDS.items()}
_READ_TYPES = {table: tuple(_TYPES_OF_KIND[kind][0] for kind in kinds) for table, kinds in _COLUMN_KINDS.items()}
# Seeks past a damaged page grow by powers of two up to this rowid distance (SQLite rowids are int64).
_MAX_SEEK = 2**62


@dataclass
class SalvageReport:
    """Rows copied per table, and rows lost per table (None: unknown, no index could count them)."""

    salvaged: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int | None] = field(default_factory=dict)

    def describe(self) -> str:
        """e.g. "salvaged 1 fingerprints, 17 decisions, 1 plans, 0 runner choices; lost 0 rows"."""
        names = {"verdicts": "decisions", "plans": "plans", "fingerprints": "fingerprints",
                 "runner_choices": "runner choices"}
        kept = ", ".join(f"{self.salvaged.get(table, 0)} {names[table]}" for table in TABLE_COLUMNS)
        if any(count is None for count in self.lost.values()):
            known = sum(count or 0 for count in self.lost.values())
            return f"salvaged {kept}; lost {known} rows and an unknown number of rows on unreadable pages"
        return f"salvaged {kept}; lost {sum(self.lost.values())} rows"


@dataclass(frozen=True)
class Recovered:
    """The readable rows of each table of TABLE_COLUMNS (tuples in its column order, one per
    primary key), and the rows lost per table (None: unknown, no index could count them)."""

    rows: dict[str, list[tuple]]
    lost: dict[str, int | None]


def recover(path: Path) -> Recovered:
    """Every readable row of the data tables of the database file `path` (and its -wal), read
    without writing anything: what SQLite reads, and what the page scanner adds."""
    # The scan reads first: it only reads, and sees the files as they were found.
    pages = scan(path, _table_of_shape)
    found: dict[str, dict[tuple, tuple]] = {table: {} for table in TABLE_COLUMNS}
    for row in pages.rows:
        values = _as_stored(row.table, row.values)
        if values is not None:
            found[row.table].setdefault(values[:_KEY_COLUMNS[row.table]], values)
    # Where SQLite cannot count a table by an index (it cannot open a file whose header is
    # damaged), the scanner may still have read one.
    counted: dict[str, int | None] = {table: pages.indexed_rows.get(table) for table in TABLE_COLUMNS}
    source = _open_read_only(path, pages.page_size)
    if source is not None:
        try:
            absent = _absent_tables(source)
            for table in absent:  # a schema 1 file has no runner_choices: nothing of it is lost
                counted[table] = 0
            for table, columns in TABLE_COLUMNS.items():
                if table in absent:
                    continue
                from_sqlite: set[tuple] = set()
                for row in readable_rows(source, table, columns):
                    # SQLite reads a page cut short as if the rest were zeros: rows of NULLs.
                    values = _as_stored(table, tuple(row))
                    key = None if values is None else values[:_KEY_COLUMNS[table]]
                    if key is not None and key not in from_sqlite:
                        from_sqlite.add(key)
                        found[table][key] = values  # what SQLite reads wins over what the scan read
                by_sqlite = indexed_count(source, table)
                counted[table] = counted[table] if by_sqlite is None else by_sqlite
        finally:
            source.close()
    lost = {table: None if counted[table] is None else max(counted[table] - len(found[table]), 0)
            for table in TABLE_COLUMNS}
    _move_legacy_runner_choices(found)
    return Recovered({table: list(by_key.values()) for table, by_key in found.items()}, lost)


def _absent_tables(conn: sqlite3.Connection) -> set[str]:
    """The data tables the file's schema does not hold (none when its schema cannot be read)."""
    try:
        held = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError:
        return set()
    return set(TABLE_COLUMNS) - held


def _move_legacy_runner_choices(found: dict[str, dict[tuple, tuple]]) -> None:
    """Schema 1's runner choice plan rows, as the runner_choices rows an upgrade makes of them
    (schema.upgrade): a salvage of a schema 1 file writes the current schema."""
    plan_columns = TABLE_COLUMNS["plans"]
    at = [plan_columns.index(column) for column in ("fingerprint_key", "plan_key", "blob", "created", "last_used")]
    for key, values in list(found["plans"].items()):
        if isinstance(values[1], str) and values[1].startswith(LEGACY_RUNNER_PREFIX):
            del found["plans"][key]
            converted = legacy_runner_row(tuple(values[i] for i in at))
            if converted is not None:
                found["runner_choices"].setdefault(converted[:2], converted)


def salvage(damaged: Path, fresh: sqlite3.Connection) -> SalvageReport:
    """Copy every readable row of the data tables of `damaged` into `fresh` (a database with the
    current schema, in one transaction the caller commits)."""
    recovered = recover(damaged)
    report = SalvageReport()
    for table, columns in TABLE_COLUMNS.items():
        insert = (f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) "
                  f"VALUES ({', '.join('?' * len(columns))})")
        report.salvaged[table] = sum(fresh.execute(insert, row).rowcount for row in recovered.rows[table])
        report.lost[table] = recovered.lost[table]
    return report


def _open_read_only(path: Path, page_size: int) -> sqlite3.Connection | None:
    """A read-only connection to `path` (None: SQLite would read nothing, or wrong rows)."""
    try:
        size = path.stat().st_size
        if size == 0:
            # SQLite deletes the -wal of an empty database file when it opens it, even read-only:
            # a file cut to nothing would lose the rows its log still holds.
            return None
        if page_size and size % page_size:
            # SQLite reads the part of a page that a cut took away as zeros, and returns rows
            # of them: a file cut inside a page is read by the scanner alone.
            return None
        return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except (sqlite3.Error, OSError, ValueError):
        return None


def _as_stored(table: str, values: tuple) -> tuple | None:
    """`values` as SQLite reads them back from a row of `table` (None: not a row of its shape)."""
    types = tuple(map(type, values))  # exact types: a bool is no integer here
    if types not in _STORED_TYPES.get(table, ()):
        return None
    if types == _READ_TYPES[table]:
        return values
    return tuple(float(value) if read is float else value for value, read in zip(values, _READ_TYPES[table]))


def _table_of_shape(values: tuple) -> str | None:
    """The data table whose rows have the shape of `values` (None: none has)."""
    return next((table for table in _COLUMN_KINDS if _as_stored(table, values) is not None), None)


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
