"""A damaged database file replaced by its salvaged copy in one rename, and a replacement that a
dead process left half done finished.

The steps, under the caller's exclusive flock on the directory (every write holds it shared, so no
write lands in a file being set aside):
  1. the readable rows go into `<name>.salvage-<pid>`, which is renamed `<name>.salvaged` once
     complete and synced;
  2. the damaged file gets a second name, `<name>.corrupt-<timestamp>`, and its -wal and -shm
     files move there too (a stale log must never be replayed into the new database);
  3. `<name>.salvaged` is renamed over `<name>`.
A process that dies between 1 and 3 leaves `<name>.salvaged`: `finish()` does steps 2 and 3.
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import os
import shutil
import sqlite3
import time
from pathlib import Path

from fusedattn_select.store.salvage import salvage
from fusedattn_select.store.schema import create_schema


class SalvageError(OSError):
    """A salvaged copy could not be written or read back."""


class SalvageSwap:
    """The replacement of the database file at `path` by a salvaged copy (`copy` while it waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.copy = path.with_name(f"{path.name}.salvaged")

    def make(self, problem: str) -> tuple[Path, str]:
        """Steps 1 to 3: (where the damaged file is kept, what was salvaged). SalvageError or
        OSError when it cannot."""
        stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S.%f")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for stale in glob.glob(glob.escape(str(self.path)) + ".salvage-*"):  # left by dead salvagers
            with contextlib.suppress(OSError):
                os.remove(stale)
        partial = self.path.with_name(f"{self.path.name}.salvage-{os.getpid()}")
        _salvage_into(self.path, partial, {"salvage_aside": aside.name, "salvage_problem": problem})
        fsync(partial)
        os.replace(partial, self.copy)
        fsync(self.path.parent)
        finished = self.finish()
        if finished is None:
            raise SalvageError(f"the salvaged copy of {self.path} did not read back")
        return finished

    def finish(self) -> tuple[Path, str] | None:
        """Steps 2 and 3: the damaged file (and its log) aside, the salvaged copy in its place:
        (where the damaged file is kept, what was salvaged); None (the copy removed) when the copy is
        not a complete one."""
        meta = _salvage_meta(self.copy)
        if meta is None:
            os.remove(self.copy)
            return None
        name = meta.get("salvage_aside") or f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
        aside = self.path.with_name(name)
        if self.path.exists() and not aside.exists():
            try:
                os.link(self.path, aside)
            except OSError:  # a file system without hard links
                shutil.copy2(self.path, aside)
        # A stale write-ahead log must never be replayed into the new database.
        for suffix in ("-wal", "-shm"):
            source = Path(f"{self.path}{suffix}")
            with contextlib.suppress(FileNotFoundError):
                if Path(f"{aside}{suffix}").exists():
                    os.remove(source)
                else:
                    os.replace(source, f"{aside}{suffix}")
        os.replace(self.copy, self.path)
        fsync(self.path.parent)
        return aside, meta.get("salvage_report", "")


def _salvage_into(damaged: Path, fresh: Path, meta: dict[str, str]) -> str:
    """Copy the readable rows of `damaged` into a new database file `fresh`, with `meta` and the
    report in its meta table; the report (e.g. "salvaged 17 decisions, ...; lost 0 rows").
    Raises SalvageError when no new file could be written."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(fresh)
    try:
        os.close(os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        conn = sqlite3.connect(str(fresh), isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            create_schema(conn)
            report = salvage(damaged, conn).describe()
            for name, value in {**meta, "salvage_report": report}.items():
                conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (name, value))
            conn.execute("COMMIT")
        finally:
            conn.close()
    except (OSError, sqlite3.Error) as err:
        with contextlib.suppress(OSError):
            os.remove(fresh)
        raise SalvageError(f"cannot write a salvaged copy of {damaged} ({err})") from None
    return report


def _salvage_meta(path: Path) -> dict[str, str] | None:
    """The meta rows of a salvaged copy, or None when it is not a complete, sound one."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = dict(conn.execute("SELECT name, value FROM meta").fetchall())
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return rows if "salvage_report" in rows else None


def fsync(path: Path) -> None:
    """Flush a file or directory to disk (a rename is durable once its directory is)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
