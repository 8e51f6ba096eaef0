"""The rows of the persistent store's database read in bulk: its totals and the rows an export holds,
from the live file or, for a damaged one, from what salvage would keep (salvage.recover).

A schema 1 file opened read-only (no writer upgraded it yet) keeps runner choices as plan rows, and
a schema 1 writer that was connected when another process upgraded the file keeps writing them
(schema.upgrade): they are counted, read and exported as runner choices here too, as the next
writer to open the file moves them. Each bulk read runs in one read transaction (`snapshot`):
its statements see one state of the file, whatever a writer commits meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path
from typing import Callable, Iterable, TypeVar

from fusedattn_select.store import salvage
from fusedattn_select.store.entry_rows import (
    BadEntry,
    parse_json,
    parse_row,
    parse_runner_choice,
    plan_export_row,
    runner_choice_export_row,
    sha256,
    verdict_export_row,
)
from fusedattn_select.store.schema import (
    LEGACY_RUNNER_PREFIX,
    PAYLOAD_TABLES,
    has_table,
    is_legacy_runner_row,
    legacy_runner_row,
)

log = logging.getLogger("fusedattn_select")

T = TypeVar("T")

# What an export holds of each table, in this order.
EXPORTED = {
    "fingerprints": ("fingerprint_key", "fingerprint"),
    "verdicts": ("fingerprint_key", "config_key", "depth", "verdicts", "created"),
    "plans": ("fingerprint_key", "plan_key", "sha256", "size", "blob"),
    "runner_choices": ("fingerprint_key", "runner_key", "choice", "created"),
}
# (decisions, plans, runner choices, payload bytes)
Totals = tuple[int, int, int, int]
# (fingerprint descriptions by key, decision rows, plan rows, runner choice rows) of an export
ExportRows = tuple[dict, list[dict], list[dict], list[dict]]


def snapshot(action: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
    """`action` run in one read transaction: every statement it makes reads the same state of the
    file, whatever writers commit meanwhile (a connection in autocommit mode reads each statement's
    own state). For bulk reads: totals, an export, a lookup that reads two tables."""
    def read(conn: sqlite3.Connection) -> T:
        conn.execute("BEGIN")
        try:
            return action(conn)
        finally:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")  # nothing was written: ending the read is all it does
    return read


def totals(conn: sqlite3.Connection) -> Totals:
    """The rows of each kind, and the payload bytes, of the live file (run it in one snapshot)."""
    entries = conn.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]
    plans = conn.execute(f"SELECT COUNT(*) FROM plans WHERE NOT {is_legacy_runner_row()}").fetchone()[0]
    runners = conn.execute(f"SELECT COUNT(*) FROM plans WHERE {is_legacy_runner_row()}"
                           + (_NOT_MOVED if has_table(conn, "runner_choices") else "")).fetchone()[0]
    if has_table(conn, "runner_choices"):
        runners += conn.execute("SELECT COUNT(*) FROM runner_choices").fetchone()[0]
    return entries, plans, runners, payload_bytes(conn)


# A runner choice plan row whose key runner_choices does not hold (yet): counted and read as a runner choice.
_NOT_MOVED = (" AND NOT EXISTS (SELECT 1 FROM runner_choices WHERE runner_choices.fingerprint_key ="
              f" plans.fingerprint_key AND runner_key = substr(plans.plan_key, {len(LEGACY_RUNNER_PREFIX) + 1}))")


def runner_choice_text(conn: sqlite3.Connection, fp_key: str, key: str) -> tuple[str, bool] | None:
    """(the stored JSON text of a runner choice, whether it is a plan row a schema 1 writer stored:
    see schema.holds_legacy_runner_rows), or None. The newer of the two where both hold the key (a
    schema 1 writer measured it again); run it in one snapshot."""
    found = []
    if has_table(conn, "runner_choices"):
        row = conn.execute("SELECT choice, created FROM runner_choices WHERE fingerprint_key = ? AND runner_key = ?",
                           (fp_key, key)).fetchone()
        if row is not None:
            found.append((row[1], 0, row[0], False))
    row = conn.execute("SELECT fingerprint_key, plan_key, blob, created, last_used FROM plans"
                       " WHERE fingerprint_key = ? AND plan_key = ?", (fp_key, LEGACY_RUNNER_PREFIX + key)).fetchone()
    converted = legacy_runner_row(row) if row is not None else None
    if converted is not None:
        found.append((converted[4], 1, converted[2], True))
    newest = max(found, key=lambda item: (_number(item[0]), item[1]), default=None)
    return None if newest is None else (newest[2], newest[3])


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else float("-inf")


def recovered_totals(path: Path) -> Totals:
    """The totals of a damaged file: of every row salvage would keep."""
    recovered = salvage.recover(path).rows
    sizes = {table: [row[salvage.TABLE_COLUMNS[table].index("size")] for row in recovered.get(table, [])]
             for table in PAYLOAD_TABLES}
    return (len(sizes["verdicts"]), len(sizes["plans"]), len(sizes["runner_choices"]),
            sum(sum(values) for values in sizes.values()))


def payload_bytes(conn: sqlite3.Connection) -> int:
    row = None
    with contextlib.suppress(sqlite3.OperationalError):  # a file opened read-only from before totals existed
        row = conn.execute("SELECT bytes FROM totals WHERE name = 'payload'").fetchone()
    if row is not None:
        return row[0]
    return sum(conn.execute(f"SELECT COALESCE(SUM(size), 0) FROM {table}").fetchone()[0]
               for table in PAYLOAD_TABLES if has_table(conn, table))


def raw_export_rows(conn: sqlite3.Connection, fingerprint_key: str | None, plans_refused: bool) -> list[list[tuple]]:
    """The EXPORTED columns of each table of the live file (of `fingerprint_key` only, when given;
    run it in one snapshot)."""
    tables = []
    for table, columns in EXPORTED.items():
        if table == "runner_choices":
            rows = list(conn.execute(f"SELECT {', '.join(columns)} FROM {table}")) if has_table(conn, table) else []
            newest = {(row[0], row[1]): row for row in rows}
            for row in _legacy_runner_rows(conn):  # the newer of the two where both hold the key
                held = newest.get((row[0], row[1]))
                if held is None or _number(row[3]) > _number(held[3]):
                    newest[(row[0], row[1])] = row
            rows = list(newest.values())
        else:
            where = f" WHERE NOT {is_legacy_runner_row()}" if table == "plans" else ""
            rows = [] if table == "plans" and plans_refused else list(
                conn.execute(f"SELECT {', '.join(columns)} FROM {table}{where}"))
        tables.append(_sorted_rows(rows, fingerprint_key))
    return tables


def recovered_export_rows(path: Path, fingerprint_key: str | None, plans_refused: bool) -> list[list[tuple]]:
    """What raw_export_rows reads, from a damaged file: every row salvage would keep."""
    recovered = salvage.recover(path).rows
    tables = []
    for table, columns in EXPORTED.items():
        at = [salvage.TABLE_COLUMNS[table].index(column) for column in columns]
        rows = [] if table == "plans" and plans_refused else recovered.get(table, [])
        tables.append(_sorted_rows((tuple(row[i] for i in at) for row in rows), fingerprint_key))
    return tables


def export_rows(raw: list[list[tuple]]) -> ExportRows:
    """The rows of an export file made of raw_export_rows' tuples; rows that must not be trusted are
    left out with a warning."""
    fingerprint_rows, verdict_rows, plan_rows, runner_rows = raw
    fingerprints = {}
    for fp_key, text in fingerprint_rows:
        with contextlib.suppress(BadEntry):
            fingerprints[fp_key] = parse_json(text, "fingerprint")
    verdicts = []
    for fp_key, key, depth, text, created in verdict_rows:
        try:
            parsed, parsed_depth = parse_row(depth, text)
        except BadEntry as bad:
            log.warning("fusedattn_select: not exporting the decision %s: %s", key, bad)
            continue
        verdicts.append(verdict_export_row(fp_key, key, parsed_depth, parsed, created))
    plans = []
    for fp_key, key, digest, size, blob in plan_rows:
        if plan_problem(digest, size, blob):
            log.warning("fusedattn_select: not exporting the damaged plan %s", key)
            continue
        plans.append(plan_export_row(fp_key, key, blob))
    runners = []
    for fp_key, key, text, created in runner_rows:
        try:
            runners.append(runner_choice_export_row(fp_key, key, parse_runner_choice(text), created))
        except BadEntry as bad:
            log.warning("fusedattn_select: not exporting the runner choice %s: %s", key, bad)
    return fingerprints, verdicts, plans, runners


def plan_problem(digest: object, size: object, blob: object) -> str:
    """Why a stored plan row must not be used ("" when its blob matches its size and digest)."""
    if not isinstance(blob, bytes):
        return f"blob is {type(blob).__name__}, not bytes"
    if len(blob) != size:
        return f"blob has {len(blob)} bytes, {size} were stored (truncated)"
    if sha256(blob) != digest:
        return "sha256 of the blob does not match the stored digest"
    return ""


def _legacy_runner_rows(conn: sqlite3.Connection) -> list[tuple]:
    """The runner choice plan rows (schema 1's, or a schema 1 writer's), as EXPORTED's runner_choices columns."""
    found = []
    for row in conn.execute("SELECT fingerprint_key, plan_key, blob, created, last_used FROM plans"
                            f" WHERE {is_legacy_runner_row()}"):
        converted = legacy_runner_row(row)
        if converted is not None:
            found.append((converted[0], converted[1], converted[2], converted[4]))
    return found


def _sorted_rows(rows: Iterable[tuple], fingerprint_key: str | None) -> list[tuple]:
    return sorted((row for row in rows if fingerprint_key in (None, row[0])), key=lambda row: (str(row[0]), str(row[1])))
