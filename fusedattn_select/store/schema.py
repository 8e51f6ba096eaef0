"""The database schema of SCHEMA_VERSION: its tables, indexes and triggers, how to tell a file's
schema, and the upgrade of a schema 1 file (shared by the database and the salvaged copies written
for it)."""

from __future__ import annotations

import sqlite3

from fusedattn_select._version import __version__
from fusedattn_select.store.entry_rows import BadEntry, parse_runner_choice, runner_choice_row
from fusedattn_select.store.protocol import SCHEMA_VERSION

# The payload tables: each row's `size` counts against max_bytes.
PAYLOAD_TABLES = ("verdicts", "plans", "runner_choices")
DATA_TABLES = ("verdicts", "plans", "runner_choices", "fingerprints")
# Schema 1 kept a runner choice as a plan row whose key was this prefix and the choice's key, its
# JSON as the blob. Schemas a writer upgrades in place (older ones are started over).
LEGACY_RUNNER_PREFIX = "runner:"
UPGRADABLE = (1,)
_PREFIX_LENGTH = len(LEGACY_RUNNER_PREFIX)


def is_legacy_runner_row(row: str = "plans") -> str:
    """SQL: whether the `row` of plans holds a runner choice as schema 1 stored it."""
    return f"(substr({row}.plan_key, 1, {_PREFIX_LENGTH}) = '{LEGACY_RUNNER_PREFIX}')"


# The payload total of every payload table is kept by triggers, so a write never sums a whole table.
# (The schema's text must fit on the file's first page with the table roots it names: a damaged
# page of a longer schema would lose the tables it describes; see test_store_damage_sweep.)
_PAYLOAD_TRIGGERS = tuple(
    f"CREATE TRIGGER IF NOT EXISTS payload_{table}_{event} AFTER {event.upper()}{of} ON {table}"
    f" BEGIN UPDATE totals SET bytes = bytes {change} WHERE name = 'payload'; END"
    for table in PAYLOAD_TABLES
    for event, of, change in (("insert", "", "+ NEW.size"), ("delete", "", "- OLD.size"),
                              ("update", " OF size", "+ NEW.size - OLD.size"))
)
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS fingerprints ("
    " fingerprint_key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, created REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS verdicts ("
    " fingerprint_key TEXT NOT NULL, config_key TEXT NOT NULL, depth TEXT NOT NULL,"
    " verdicts TEXT NOT NULL, size INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL,"
    " PRIMARY KEY (fingerprint_key, config_key))",
    # (last_used, size) covers the eviction scan.
    "CREATE INDEX IF NOT EXISTS verdicts_by_last_use ON verdicts (last_used, size)",
    "CREATE TABLE IF NOT EXISTS plans ("
    " fingerprint_key TEXT NOT NULL, plan_key TEXT NOT NULL, sha256 TEXT NOT NULL,"
    " size INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL, blob BLOB NOT NULL,"
    " PRIMARY KEY (fingerprint_key, plan_key))",
    "CREATE INDEX IF NOT EXISTS plans_by_last_use ON plans (last_used, size)",
    # Six columns: the salvage's page scanner tells a table's rows apart by their shape.
    "CREATE TABLE IF NOT EXISTS runner_choices ("
    " fingerprint_key TEXT NOT NULL, runner_key TEXT NOT NULL, choice TEXT NOT NULL,"
    " size INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL,"
    " PRIMARY KEY (fingerprint_key, runner_key))",
    "CREATE INDEX IF NOT EXISTS runner_choices_by_last_use ON runner_choices (last_used, size)",
    "CREATE TABLE IF NOT EXISTS totals (name TEXT PRIMARY KEY, bytes INTEGER NOT NULL)",
    # Counted once when the table is new (a store written before totals existed), kept by triggers after.
    "INSERT OR IGNORE INTO totals (name, bytes) VALUES ('payload',"
    + " + ".join(f"(SELECT COALESCE(SUM(size), 0) FROM {table})" for table in PAYLOAD_TABLES) + ")",
    *_PAYLOAD_TRIGGERS,
)


def create_schema(conn: sqlite3.Connection) -> None:
    """The tables, indexes and triggers of SCHEMA_VERSION, and the meta rows saying so."""
    for statement in SCHEMA:
        conn.execute(statement)
    conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('created_by', ?)",
                 (f"fusedattn-select {__version__}",))


def upgrade(conn: sqlite3.Connection) -> int:
    """Bring a database of an UPGRADABLE schema to SCHEMA_VERSION inside the caller's transaction,
    keeping every row: the new tables, and schema 1's runner choice plan rows moved to
    runner_choices. How many runner choices moved."""
    create_schema(conn)
    return sweep_legacy_runner_rows(conn)


def holds_legacy_runner_rows(conn: sqlite3.Connection) -> bool:
    """Whether a plan row holds a runner choice. After the upgrade, a schema 1 writer that was
    already connected (it checked the schema when it opened the file) keeps storing its runner
    choices as plan rows: readers read them as runner choices (sqlite_rows), and the next writer to
    open the file moves them (sweep_legacy_runner_rows)."""
    return conn.execute(f"SELECT 1 FROM plans WHERE {is_legacy_runner_row()} LIMIT 1").fetchone() is not None


def sweep_legacy_runner_rows(conn: sqlite3.Connection) -> int:
    """Move every runner choice plan row to runner_choices (the newer of the two where both hold the
    key) and delete it, inside the caller's transaction; how many moved."""
    rows = conn.execute("SELECT fingerprint_key, plan_key, blob, created, last_used FROM plans"
                        f" WHERE {is_legacy_runner_row()}").fetchall()
    moved = 0
    for row in rows:
        converted = legacy_runner_row(row)
        if converted is not None:
            conn.execute(
                "INSERT INTO runner_choices (fingerprint_key, runner_key, choice, size, created, last_used)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (fingerprint_key, runner_key) DO UPDATE SET"
                " choice = excluded.choice, size = excluded.size, created = excluded.created,"
                " last_used = excluded.last_used WHERE excluded.created >= runner_choices.created", converted)
            moved += 1
        # A runner choice was never a plan: a row that does not parse is dropped, not kept as one.
        conn.execute("DELETE FROM plans WHERE fingerprint_key = ? AND plan_key = ?", (row[0], row[1]))
    return moved


def legacy_runner_row(row: tuple) -> tuple | None:
    """The runner_choices row of a schema 1 plan row (fingerprint_key, plan_key, blob, created,
    last_used) that held a runner choice; None when its key or blob is not one."""
    fp_key, plan_key, blob, created, last_used = row
    if not isinstance(plan_key, str) or not plan_key.startswith(LEGACY_RUNNER_PREFIX):
        return None
    key = plan_key[len(LEGACY_RUNNER_PREFIX):]
    try:
        text = blob.decode() if isinstance(blob, bytes) else blob
        choice = parse_runner_choice(text)
    except (BadEntry, UnicodeDecodeError, AttributeError):
        return None
    if not key or not isinstance(fp_key, str):
        return None
    new = runner_choice_row(fp_key, key, choice)
    return fp_key, key, new.text, new.size, created, last_used


def schema_version(conn: sqlite3.Connection) -> int | None:
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone() is None:
        return None
    row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    try:
        return int(row[0]) if row is not None else None
    except (TypeError, ValueError):
        return 0


def has_table(conn: sqlite3.Connection, table: str) -> bool:
    """Whether the file holds `table` (a schema 1 file opened read-only has no runner_choices)."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone() is not None


def schema_is_current(conn: sqlite3.Connection) -> bool:
    """The schema of SCHEMA_VERSION with its payload triggers (a store written before they existed
    gets them on its next open for writing)."""
    if schema_version(conn) != SCHEMA_VERSION:
        return False
    triggers = conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'payload_%'")
    return triggers.fetchone()[0] == len(_PAYLOAD_TRIGGERS)
