"""Export a store to a JSON file and import one, verifying every row (both stores delegate here).

An export file holds the fingerprints' descriptions, decisions and plans (base64 with their size
and sha256). Import trusts nothing in it: a fingerprint must hash to its key, every row must parse,
a plan must match its size and digest; a row that fails is skipped with its reason.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from fusedattn_select._version import __version__
from fusedattn_select.store.entries import (
    BadEntry,
    NewEntry,
    Written,
    fingerprint_key,
    new_entry,
    parse_depth,
    parse_verdicts,
    sha256,
)
from fusedattn_select.store.protocol import SCHEMA_VERSION, CacheError, ImportReport
from fusedattn_select.types import Fingerprint

log = logging.getLogger("fusedattn_select")

EXPORT_FORMAT = "fusedattn-select-cache"


class Transferable(Protocol):
    """What export and import need of a store besides put_plan (package-internal)."""

    def _export_rows(self, fingerprint_key: str | None) -> tuple[dict, list[dict], list[dict]]:
        """(fingerprint descriptions by key, decision rows, plan rows) of valid entries."""

    def _put(self, fingerprint: Fingerprint, entry: NewEntry) -> Written:
        """put() of a checked entry, saying what became of it."""

    def _plan_refusal(self) -> str:
        """Why plans may not be written to this store ("" when they may)."""

    def put_plan(self, fingerprint: Fingerprint, plan_key: str, blob: bytes) -> bool: ...


# ----- export -------------------------------------------------------------------------------------
def export_store(store: Transferable, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> dict:
    """Write every valid entry (of `fingerprint` only, when given) to a JSON file.

    Returns {"path", "verdicts", "plans"} counts.
    """
    fingerprints, verdict_rows, plan_rows = store._export_rows(fingerprint_key(fingerprint))
    document = {
        "format": EXPORT_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "library_version": __version__,
        "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "fingerprints": fingerprints,
        "verdicts": verdict_rows,
        "plans": plan_rows,
    }
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1)
    os.replace(temporary, path)  # readers never see a half-written export
    log.info("fusedattn_select: exported %d decisions and %d plans to %s",
             len(verdict_rows), len(plan_rows), path)
    return {"path": str(path), "verdicts": len(verdict_rows), "plans": len(plan_rows)}


# ----- import -------------------------------------------------------------------------------------
def import_store(store: Transferable, path: str | os.PathLike,
            fingerprint: Fingerprint | str | None = None) -> ImportReport:
    """Load an export file into `store`; with `fingerprint`, only rows of that fingerprint.

    Rows of another fingerprint, rows that do not parse, plans whose sha256 or size do not
    match and FAST rows where a FULL entry is stored are skipped, each with its reason.
    Raises CacheError when the file is not an export at all.
    """
    document = _read_export(Path(path))
    owners = _Owners.of(document, fingerprint_key(fingerprint))
    skipped: list[tuple[str, str]] = []
    verdicts = _import_rows(owners, "decision", _list_field(document, "verdicts"), skipped,
                            lambda fp, row: _import_decision(store, fp, row))
    plan_rows = _list_field(document, "plans")
    refusal = store._plan_refusal() if plan_rows else ""
    plans = _import_rows(owners, "plan", plan_rows, skipped,
                         lambda fp, row: _import_plan(store, fp, row, refusal))
    log.info("fusedattn_select: imported %d decisions and %d plans from %s (%d rows skipped)",
             verdicts, plans, path, len(skipped))
    return ImportReport(verdicts, plans, tuple(skipped))


# Imports one row of a known fingerprint: "" when it was stored, else why it was skipped.
RowImport = Callable[[Fingerprint, dict], str]


def _import_rows(owners: _Owners, kind: str, rows: list, skipped: list[tuple[str, str]],
                 import_row: RowImport) -> int:
    """Import each row whose fingerprint checks out; appends every skipped row to `skipped`."""
    imported = 0
    for row in rows:
        label, fingerprint, reason = owners.claim(kind, row)
        if fingerprint is not None:
            reason = import_row(fingerprint, row)
        if reason:
            skipped.append((label, reason))
        else:
            imported += 1
    return imported


def _import_decision(store: Transferable, fingerprint: Fingerprint, row: dict) -> str:
    key = row.get("key")
    if not isinstance(key, str) or not key:
        return f"key={key!r}: must be a non-empty string"
    try:
        verdicts = parse_verdicts(row.get("verdicts"))
        depth = parse_depth(row.get("depth"))
    except BadEntry as err:
        return str(err)
    written = store._put(fingerprint, new_entry(fingerprint, key, verdicts, depth))
    if written is Written.STORED:
        return ""
    if written is Written.KEPT_FULL:
        return "a full-depth decision is already stored"
    return "the store could not write it (see the warning)"


def _import_plan(store: Transferable, fingerprint: Fingerprint, row: dict, refusal: str) -> str:
    if refusal:
        return f"plans refused: {refusal}"
    key = row.get("key")
    if not isinstance(key, str) or not key:
        return f"key={key!r}: must be a non-empty string"
    try:
        blob = base64.b64decode(row.get("blob", ""), validate=True)
    except (TypeError, ValueError) as err:
        return f"blob is not base64 ({err})"
    if row.get("size") != len(blob):
        return f"blob has {len(blob)} bytes, the row says {row.get('size')!r} (truncated)"
    if row.get("sha256") != sha256(blob):
        return "sha256 of the blob does not match the row"
    if not store.put_plan(fingerprint, key, blob):
        return "the store refused the plan (see the warning)"
    return ""


@dataclass(frozen=True)
class _Owners:
    """The fingerprints of an export file that rows may be imported under, and why others may not."""

    only: str | None  # import rows of this fingerprint key only
    fingerprints: dict[str, Fingerprint]
    problems: dict[str, str]

    @classmethod
    def of(cls, document: dict, only: str | None) -> _Owners:
        fingerprints, problems = _export_fingerprints(document.get("fingerprints"))
        return cls(only, fingerprints, problems)

    def claim(self, kind: str, row: Any) -> tuple[str, Fingerprint | None, str]:
        """(label of the row, its fingerprint or None, why it is skipped when None)."""
        if not isinstance(row, dict):
            return f"{kind} {row!r:.40}", None, "not an object"
        fp_key = str(row.get("fingerprint", ""))
        label = f"{kind} {fp_key[:12]}/{str(row.get('key', ''))[:32]}"
        if self.only is not None and fp_key != self.only:
            return label, None, f"foreign fingerprint {fp_key[:12]} (importing only {self.only[:12]})"
        if fp_key in self.problems:
            return label, None, self.problems[fp_key]
        if fp_key not in self.fingerprints:
            return label, None, f"fingerprint {fp_key[:12]} is not described in the file"
        return label, self.fingerprints[fp_key], ""


def _read_export(path: Path) -> dict:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CacheError(f"cache export {path}: cannot be read ({err.strerror or err})") from None
    except ValueError as err:
        raise CacheError(f"cache export {path}: is not JSON ({err})") from None
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise CacheError(f"cache export {path}: format must be {EXPORT_FORMAT!r} (written by export())")
    version = document.get("schema_version")
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise CacheError(f"cache export {path}: schema_version={version!r}: this version reads 1..{SCHEMA_VERSION}")
    return document


def _list_field(document: dict, name: str) -> list:
    value = document.get(name, [])
    if not isinstance(value, list):
        raise CacheError(f"cache export: {name!r} must be a list of rows")
    return value


def _export_fingerprints(value: Any) -> tuple[dict[str, Fingerprint], dict[str, str]]:
    """Fingerprints of an export file whose description hashes to their key, and why others don't."""
    if not isinstance(value, dict):
        raise CacheError("cache export: 'fingerprints' must map fingerprint keys to descriptions")
    good: dict[str, Fingerprint] = {}
    problems: dict[str, str] = {}
    for key, description in value.items():
        try:
            fingerprint = Fingerprint.from_dict(description)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            problems[key] = f"fingerprint description does not parse ({type(err).__name__}: {err})"
            continue
        if fingerprint.key() != key:
            problems[key] = f"fingerprint description hashes to {fingerprint.key()[:12]}, not to its key {key[:12]}"
            continue
        good[key] = fingerprint
    return good, problems
