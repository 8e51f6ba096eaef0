"""The database schema of SCHEMA_VERSION: its tables, indexes and triggers, and how to tell a
file's schema (shared by the database and the salvaged copies written for it)."""

from __future__ import annotations

import sqlite3

from fusedattn_select._version import __version__
from fusedattn_select.store.protocol import SCHEMA_VERSION

# The payload total of both tables is kept by triggers, so a write never sums a whole table.
_PAYLOAD_TRIGGERS = tuple(
    f"CREATE TRIGGER IF NOT EXISTS payload_{table}_{event} AFTER {event.upper()}{of} ON {table}"
    f" BEGIN UPDATE totals SET bytes = bytes {change} WHERE name = 'payload'; END"
    for table in ("verdicts", "plans")
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
    "CREATE TABLE IF NOT EXISTS totals (name TEXT PRIMARY KEY, bytes INTEGER NOT NULL)",
    # Counted once when the table is new (a store written before totals existed), kept by triggers after.
    "INSERT OR IGNORE INTO totals (name, bytes) VALUES ('payload',"
    " (SELECT COALESCE(SUM(size), 0) FROM verdicts) + (SELECT COALESCE(SUM(size), 0) FROM plans))",
    *_PAYLOAD_TRIGGERS,
)
DATA_TABLES = ("verdicts", "plans", "fingerprints")


def create_schema(conn: sqlite3.Connection) -> None:
    """The tables, indexes and triggers of SCHEMA_VERSION, and the meta rows saying so."""
    for statement in SCHEMA:
        conn.execute(statement)
    conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('created_by', ?)",
                 (f"fusedattn-select {__version__}",))


def schema_version(conn: sqlite3.Connection) -> int | None:
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone() is None:
        return None
    row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    try:
        return int(row[0]) if row is not None else None
    except (TypeError, ValueError):
        return 0


def schema_is_current(conn: sqlite3.Connection) -> bool:
    """The schema of SCHEMA_VERSION with its payload triggers (a store written before they existed
    gets them on its next open for writing)."""
    if schema_version(conn) != SCHEMA_VERSION:
        return False
    triggers = conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'payload_%'")
    return triggers.fetchone()[0] == len(_PAYLOAD_TRIGGERS)
