"""Export a store to a JSON file and import one, verifying every row (both stores delegate here).

An export file holds the fingerprints' descriptions, decisions and runner choices (each with the
sha256 of its content) and plans (base64 with their size and sha256). A schema 1 file's runner
choices are plan rows keyed `runner:<key>` (schema.LEGACY_RUNNER_PREFIX): they import as runner
choices, never as plans. Import trusts nothing in it: a fingerprint must hash
to its key, every row must parse and match its sha256, a plan its size; a row that fails is skipped
with its reason. These checks catch damage and edits, not a forger: anyone can write a consistent
file, so import only files you trust. Every row is checked before any is written, and a file
holding a value no export holds (an integer beyond 64 bits, nesting deeper than the format's) is
refused whole (CacheError naming the row): such a file was not written by export().
Import counts the rows the store holds once every row is written: a row a later one of the same
import evicted (the store's size bound, max_bytes) is listed as skipped, not as imported.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, TextIO

from fusedattn_select._version import __version__
from fusedattn_select.store.entry_rows import (
    PARSE_ERRORS,
    BadEntry,
    NewEntry,
    Written,
    decision_digest,
    fingerprint_key,
    NewRunnerChoice,
    new_entry,
    parse_depth,
    parse_json,
    parse_verdicts,
    runner_choice_digest,
    runner_choice_row,
    sha256,
    shown,
)
from fusedattn_select.store.protocol import SCHEMA_VERSION, CacheError, ImportReport
from fusedattn_select.store.schema import LEGACY_RUNNER_PREFIX
from fusedattn_select.store.store_settings import MAX_BYTES_ENV
from fusedattn_select.types import Fingerprint

log = logging.getLogger("fusedattn_select")

EXPORT_FORMAT = "fusedattn-select-cache"


class Transferable(Protocol):
    """What export and import need of a store (package-internal): its bound, reads and checked writes."""

    max_bytes: int

    def _export_rows(self, fingerprint_key: str | None) -> tuple[dict, list[dict], list[dict], list[dict]]:
        """(fingerprint descriptions by key, decision rows, plan rows, runner choice rows) of valid entries."""

    def _put(self, fingerprint: Fingerprint, entry: NewEntry) -> Written:
        """put() of a checked entry, saying what became of it."""

    def _put_runner_choice(self, entry: NewRunnerChoice, fingerprint: Fingerprint) -> bool:
        """put_runner_choice() of a checked runner choice; whether it was stored."""

    def _plan_refusal(self) -> str:
        """Why plans may not be written to this store ("" when they may)."""

    def put_plan(self, fingerprint: Fingerprint, plan_key: str, blob: bytes) -> bool: ...

    def get(self, fingerprint: Fingerprint, key: str) -> Any: ...

    def get_plan(self, fingerprint: Fingerprint, plan_key: str) -> bytes | None: ...

    def get_runner_choice(self, fingerprint: Fingerprint, key: str) -> dict[str, Any] | None: ...


# ----- export -------------------------------------------------------------------------------------
def export_store(store: Transferable, path: str | os.PathLike, fingerprint: Fingerprint | str | None = None) -> dict:
    """Write every valid entry (of `fingerprint` only, when given) to a JSON file.

    Returns {"path", "verdicts", "plans", "runner_choices"} counts. Raises CacheError naming the path when it cannot be
    written (no such directory, a directory, no permission, disk full); nothing is left behind then.
    """
    path = Path(path)
    _check_writable(path)
    document, counts = _export_document(store, fingerprint)
    _write_export(path, document)
    log.info("fusedattn_select: exported %d decisions, %d plans and %d runner choices to %s",
             counts["verdicts"], counts["plans"], counts["runner_choices"], path)
    return {"path": str(path), **counts}


def export_to_stream(store: Transferable, stream: TextIO, fingerprint: Fingerprint | str | None = None) -> dict:
    """Write what export_store() writes to a file to `stream` (`cache export -`: stdout), then a newline.

    Returns {"path": "-", "verdicts", "plans", "runner_choices"}, which the caller says (`cache export -`: on
    stderr; a log line too would say it twice). Raises CacheError when the stream cannot be written;
    BrokenPipeError as it is (its reader went away: the command line ends quietly).
    """
    document, counts = _export_document(store, fingerprint)
    try:
        json.dump(document, stream, indent=1)
        stream.write("\n")
        stream.flush()
    except BrokenPipeError:
        raise
    except OSError as err:
        raise CacheError(f"cache export -: stdout cannot be written ({err.strerror or err})") from None
    return {"path": "-", **counts}


def _export_document(store: Transferable, fingerprint: Fingerprint | str | None) -> tuple[dict, dict[str, int]]:
    """(the export file's JSON object of every valid entry of `store` (of `fingerprint` only), its row counts)."""
    fingerprints, verdict_rows, plan_rows, runner_rows = store._export_rows(fingerprint_key(fingerprint))
    document = {
        "format": EXPORT_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "library_version": __version__,
        "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "fingerprints": fingerprints,
        "verdicts": verdict_rows,
        "plans": plan_rows,
        "runner_choices": runner_rows,
    }
    return document, {"verdicts": len(verdict_rows), "plans": len(plan_rows), "runner_choices": len(runner_rows)}


def _check_writable(path: Path) -> None:
    """CacheError naming `path` when an export cannot be written there, before anything is read."""
    try:
        if path.is_dir():
            raise CacheError(f"cache export {path}: is a directory; name the file to write")
        parent = path.parent
        if not parent.exists():
            raise CacheError(f"cache export {path}: directory {parent} does not exist")
        if not parent.is_dir():
            raise CacheError(f"cache export {path}: {parent} is not a directory")
    except OSError as err:  # a name too long, a component that cannot be searched
        raise CacheError(f"cache export {path}: cannot be written ({err.strerror or err})") from None


def _write_export(path: Path, document: dict) -> None:
    """Write the export at `path`, following a link to where it leads. A regular file (new or
    existing) is written beside its final place and renamed over it, so readers never see half an
    export, and keeps an existing file's mode; anything else there (a device such as /dev/stdout, a
    pipe) is written into as it is, never replaced."""
    target = Path(os.path.realpath(path))
    try:
        existing = os.stat(target)
    except OSError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        try:
            with open(target, "w", encoding="utf-8") as handle:
                json.dump(document, handle, indent=1)
        except OSError as err:
            raise CacheError(f"cache export {path}: cannot be written ({err.strerror or err})") from None
        return
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
        if existing is not None:
            os.chmod(temporary, stat.S_IMODE(existing.st_mode))
        os.replace(temporary, target)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        if isinstance(err, OSError):
            raise CacheError(f"cache export {path}: cannot be written ({err.strerror or err})") from None
        raise


# ----- import -------------------------------------------------------------------------------------
def import_store(store: Transferable, path: str | os.PathLike,
                 fingerprint: Fingerprint | str | None = None) -> ImportReport:
    """Load an export file into `store`; with `fingerprint` (a Fingerprint or its key), only rows of
    that fingerprint, else rows of every fingerprint in the file.

    Rows of another fingerprint, rows that do not parse or do not match their sha256 (or carry
    none), plans whose size does not match and decisions where the store keeps a deeper one
    (entry_rows.keeps_stored) are skipped, each with its reason. Every row is checked before any is
    written. Raises CacheError, having written nothing, when the file is not an export at all or
    holds a value no export holds.
    """
    path = Path(path)
    document = read_export(path)
    owners = _Owners.of(document, fingerprint_key(fingerprint))
    decision_rows, plan_rows = _list_field(document, "verdicts"), _list_field(document, "plans")
    runner_rows = _list_field(document, "runner_choices")
    legacy = [row for row in plan_rows if document["schema_version"] == 1 and _is_legacy_runner_row(row)]
    plan_rows = [row for row in plan_rows if not any(row is other for other in legacy)]
    refusal = store._plan_refusal() if plan_rows else ""
    skipped: list[tuple[str, str]] = []
    decisions = _checked_rows(path, owners, "verdicts", decision_rows, skipped, _check_decision)
    plans = _checked_rows(path, owners, "plans", plan_rows, skipped,
                          lambda fp, row: _check_plan(fp, row, refusal))
    runners = (_checked_rows(path, owners, "runner_choices", runner_rows, skipped, _check_runner_choice)
               + _checked_rows(path, owners, "plans", legacy, skipped, _check_legacy_runner_choice))
    written: list[_Written] = []
    for label, fp, entry in decisions:
        reason = _write_decision(store, fp, entry)
        if reason:
            skipped.append((label, reason))
        else:
            written.append(_Written("verdicts", label, fp, entry.key))
    for label, fp, (key, blob) in plans:
        if store.put_plan(fp, key, blob):
            written.append(_Written("plans", label, fp, key))
        else:
            skipped.append((label, "the store refused the plan (see the warning)"))
    for label, fp, entry in runners:
        if store._put_runner_choice(entry, fp):
            written.append(_Written("runner_choices", label, fp, entry.key))
        else:
            skipped.append((label, "the store could not write it (see the warning)"))
    held = _held(store, written, skipped)
    log.info("fusedattn_select: imported %d decisions, %d plans and %d runner choices from %s (%d rows skipped)",
             held["verdicts"], held["plans"], held["runner_choices"], path, len(skipped))
    return ImportReport(held["verdicts"], held["plans"], tuple(skipped), held["runner_choices"])


@dataclass(frozen=True)
class _Written:
    """A row of the export file that import wrote to the store."""

    table: str  # "verdicts", "plans" or "runner_choices"
    label: str
    fingerprint: Fingerprint
    key: str


def _held(store: Transferable, written: list[_Written], skipped: list[tuple[str, str]]) -> dict[str, int]:
    """How many of the `written` rows of each table the store holds now; each one it no longer holds is
    appended to `skipped`, with the reason.

    Each write may evict the least recently used rows to stay within max_bytes, the rows this import
    wrote before it included: a row counts as imported only when it is still there."""
    held = {"verdicts": 0, "plans": 0, "runner_choices": 0}
    readers = {"verdicts": store.get, "plans": store.get_plan, "runner_choices": store.get_runner_choice}
    for row in written:
        if readers[row.table](row.fingerprint, row.key) is not None:
            held[row.table] += 1
        else:
            skipped.append((row.label, f"not kept: evicted to stay within the cache's size limit of "
                            f"{store.max_bytes} bytes ({MAX_BYTES_ENV}; raise it to keep every row)"))
    return held


def read_export(path: Path) -> dict:
    """The export file at `path` as a JSON object; CacheError naming it when it is not an export."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CacheError(f"export file {path}: cannot be read ({err.strerror or err})") from None
    except RecursionError:
        raise CacheError(f"export file {path}: is nested too deeply to decode (not written by export())") from None
    except ValueError as err:  # not JSON (or not UTF-8), or an integer of more digits than int() reads
        raise CacheError(f"export file {path}: is not JSON ({shown(err)})") from None
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise CacheError(f"export file {path}: format must be {EXPORT_FORMAT!r} (written by export())")
    version = document.get("schema_version")
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise CacheError(f"export file {path}: schema_version={shown(version)}: this version reads "
                         f"1..{SCHEMA_VERSION}")
    return document


def export_fingerprints(path: str | os.PathLike) -> dict[str, str]:
    """The fingerprints an export file's rows may belong to: {key: description, or why it is unusable}."""
    good, problems = _export_fingerprints(read_export(Path(path)).get("fingerprints"))
    return {**{key: fp.describe() for key, fp in good.items()}, **problems}


# Checks one row of a known fingerprint: what to write, or why it is skipped (a str).
RowCheck = Callable[[Fingerprint, dict], Any]


def _checked_rows(path: Path, owners: _Owners, field: str, rows: list, skipped: list[tuple[str, str]],
                  check: RowCheck) -> list[tuple[str, Fingerprint, Any]]:
    """(label, fingerprint, what to write) of each row that checks out; every other row is appended to
    `skipped` with its reason. CacheError when a row holds a value no export holds."""
    kind = {"verdicts": "decision", "plans": "plan", "runner_choices": "runner choice"}[field]
    accepted = []
    for index, row in enumerate(rows):
        label = _label(kind, row)
        problem = _out_of_range(row)
        if problem:
            raise CacheError(f"export file {path}: {field}[{index}] ({label}): {problem}; a file export() "
                             "did not write: nothing was imported")
        fingerprint, reason = owners.claim(row)
        if fingerprint is not None:
            checked = check(fingerprint, row)
            if isinstance(checked, str):
                reason = checked
            else:
                accepted.append((label, fingerprint, checked))
        if reason:
            skipped.append((label, reason))
    return accepted


def _label(kind: str, row: Any) -> str:
    if not isinstance(row, dict):
        return f"{kind} {shown(row, 40)}"
    fp_key, key = row.get("fingerprint", ""), row.get("key", "")
    fp_text = fp_key[:12] if isinstance(fp_key, str) else shown(fp_key, 12)
    key_text = key[:32] if isinstance(key, str) else shown(key, 32)
    return f"{kind} {fp_text}/{key_text}"


# No export nests deeper than this below a row (row > verdicts > verdict > timings_ms > a number).
_MAX_ROW_DEPTH = 8
# No field of an export holds a larger integer (versions, SM counts, sizes).
_MAX_INT_BITS = 64


def _out_of_range(value: Any) -> str:
    """What in `value` no export holds: an integer beyond 64 bits or nesting deeper than the format's
    ("" when nothing). Iterative, so a hostile value cannot exhaust the stack."""
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > _MAX_INT_BITS:
            return f"an integer of {item.bit_length()} bits is out of range"
        if isinstance(item, (dict, list)):
            if depth >= _MAX_ROW_DEPTH:
                return f"nested more than {_MAX_ROW_DEPTH} levels deep"
            children = list(item.keys()) + list(item.values()) if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return ""


def _check_decision(fingerprint: Fingerprint, row: dict) -> NewEntry | str:
    key = row.get("key")
    if not isinstance(key, str) or not key:
        return f"key={shown(key)}: must be a non-empty string"
    try:
        verdicts = parse_verdicts(row.get("verdicts"))
        depth = parse_depth(row.get("depth"))
    except BadEntry as err:
        return str(err)
    digest = row.get("sha256")
    if digest is None:
        return "carries no sha256 of its content (exported by an older version: export it again)"
    if digest != decision_digest(fingerprint.key(), key, depth, verdicts):
        return "sha256 of the decision does not match the row (edited or damaged)"
    return new_entry(fingerprint, key, verdicts, depth)


def _write_decision(store: Transferable, fingerprint: Fingerprint, entry: NewEntry) -> str:
    written = store._put(fingerprint, entry)
    if written is Written.STORED:
        return ""
    if written is Written.KEPT_DEEPER:
        return "a deeper decision is already stored"
    return "the store could not write it (see the warning)"


def _check_plan(fingerprint: Fingerprint, row: dict, refusal: str) -> tuple[str, bytes] | str:
    if refusal:
        return f"plans refused: {refusal}"
    key = row.get("key")
    if not isinstance(key, str) or not key:
        return f"key={shown(key)}: must be a non-empty string"
    try:
        blob = base64.b64decode(row.get("blob", ""), validate=True)
    except (TypeError, ValueError) as err:
        return f"blob is not base64 ({shown(err)})"
    if row.get("size") != len(blob):
        return f"blob has {len(blob)} bytes, the row says {shown(row.get('size'))} (truncated)"
    if row.get("sha256") != sha256(blob):
        return "sha256 of the blob does not match the row"
    return key, blob


def _check_runner_choice(fingerprint: Fingerprint, row: dict) -> NewRunnerChoice | str:
    key = row.get("key")
    if not isinstance(key, str) or not key:
        return f"key={shown(key)}: must be a non-empty string"
    try:
        entry = runner_choice_row(fingerprint.key(), key, row.get("choice"))
    except ValueError as err:
        return str(err)
    digest = row.get("sha256")
    if digest is None:
        return "carries no sha256 of its content"
    if digest != runner_choice_digest(fingerprint.key(), key, entry.choice):
        return "sha256 of the runner choice does not match the row (edited or damaged)"
    return entry


def _is_legacy_runner_row(row: Any) -> bool:
    return isinstance(row, dict) and isinstance(row.get("key"), str) and row["key"].startswith(LEGACY_RUNNER_PREFIX)


def _check_legacy_runner_choice(fingerprint: Fingerprint, row: dict) -> NewRunnerChoice | str:
    """A schema 1 plan row holding a runner choice (its JSON as the blob), checked as a plan row is."""
    checked = _check_plan(fingerprint, row, "")
    if isinstance(checked, str):
        return checked
    key, blob = checked
    if key == LEGACY_RUNNER_PREFIX:
        return f"key={shown(key)}: names no runner choice"
    try:
        return runner_choice_row(fingerprint.key(), key[len(LEGACY_RUNNER_PREFIX):],
                                 parse_json(blob.decode("utf-8", "replace"), "runner choice fields"))
    except ValueError as err:  # BadEntry too
        return f"not a runner choice ({shown(err)})"


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

    def claim(self, row: Any) -> tuple[Fingerprint | None, str]:
        """(the row's fingerprint, "") or (None, why the row is skipped)."""
        if not isinstance(row, dict):
            return None, "not an object"
        fp_key = row.get("fingerprint", "")
        if not isinstance(fp_key, str):
            return None, f"fingerprint={shown(fp_key, 40)}: must be a fingerprint key"
        if self.only is not None and fp_key != self.only:
            return None, f"foreign fingerprint {fp_key[:12]} (importing only {self.only[:12]})"
        if fp_key in self.problems:
            return None, self.problems[fp_key]
        if fp_key not in self.fingerprints:
            return None, f"fingerprint {fp_key[:12]} is not described in the file"
        return self.fingerprints[fp_key], ""


def _list_field(document: dict, name: str) -> list:
    value = document.get(name, [])
    if not isinstance(value, list):
        raise CacheError(f"export file: {name!r} must be a list of rows")
    return value


def _export_fingerprints(value: Any) -> tuple[dict[str, Fingerprint], dict[str, str]]:
    """Fingerprints of an export file whose description hashes to their key, and why others don't."""
    if not isinstance(value, dict):
        raise CacheError("export file: 'fingerprints' must map fingerprint keys to descriptions")
    good: dict[str, Fingerprint] = {}
    problems: dict[str, str] = {}
    for key, description in value.items():
        problem = _out_of_range(description)
        if problem:
            problems[key] = f"fingerprint description: {problem}"
            continue
        try:
            fingerprint = Fingerprint.from_dict(description)
        except PARSE_ERRORS as err:
            problems[key] = f"fingerprint description does not parse ({type(err).__name__}: {shown(err)})"
            continue
        if fingerprint.key() != key:
            problems[key] = f"fingerprint description hashes to {fingerprint.key()[:12]}, not to its key {key[:12]}"
            continue
        good[key] = fingerprint
    return good, problems
