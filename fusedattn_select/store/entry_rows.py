"""Rows of a store: checking what callers hand in, encoding verdicts, and distrusting what is read back.

Both stores and the export/import code use these, so a decision means the same bytes, the same
size and the same validity rules wherever it is kept.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import json
import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from fusedattn_select.types import Fingerprint, Outcome, ProbeDepth, Verdict

log = logging.getLogger("fusedattn_select")


class BadEntry(ValueError):
    """A stored row that must not be trusted; the message says why."""


class Written(enum.Enum):
    """What a store did with one decision handed to it."""

    STORED = "stored"
    KEPT_DEEPER = "kept a deeper decision"
    FAILED = "failed"


# ----- arguments ----------------------------------------------------------------------------------
def check_fingerprint(fingerprint: Fingerprint) -> None:
    if not isinstance(fingerprint, Fingerprint):
        raise TypeError(f"fingerprint={fingerprint!r}: must be a Fingerprint")


def check_key(name: str, key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"{name}={key!r}: must be a non-empty string")


def fingerprint_key(fingerprint: Fingerprint | str | None) -> str | None:
    """The key of `fingerprint` (a Fingerprint, or already a key), or None for "every fingerprint"."""
    if fingerprint is None or isinstance(fingerprint, str):
        return fingerprint
    check_fingerprint(fingerprint)
    return fingerprint.key()


@dataclass(frozen=True)
class NewEntry:
    """A decision handed to put(): checked, encoded and sized once for whichever store keeps it."""

    fp_key: str
    key: str
    text: str  # the verdicts as the JSON a database row and an export file hold
    verdicts: tuple[Verdict, ...]
    depth: ProbeDepth
    size: int  # what it counts against max_bytes: the encoded verdicts and the two keys


def new_entry(fingerprint: Fingerprint, key: str, verdicts: Iterable[Verdict], depth: ProbeDepth | str) -> NewEntry:
    """put()'s arguments, checked (TypeError or ValueError): FAILED and NO_DATA verdicts are never stored."""
    check_fingerprint(fingerprint)
    check_key("key", key)
    verdicts = tuple(verdicts)
    if not verdicts or not all(isinstance(v, Verdict) for v in verdicts):
        raise ValueError(f"verdicts={verdicts!r}: must be a non-empty sequence of Verdict")
    failed = [v for v in verdicts if v.outcome in (Outcome.FAILED, Outcome.NO_DATA)]
    if failed:
        raise ValueError(
            f"verdicts: {failed[0].reason()}: FAILED verdicts are incidents (out of memory, CUDA "
            "error, timeout) and NO_DATA verdicts say nothing was known: neither is an answer, and "
            "neither is ever stored"
        )
    try:
        depth = ProbeDepth(depth)
    except ValueError:
        raise ValueError(f"depth={depth!r}: must be 'fast', 'full' or 'verify'") from None
    fp_key = fingerprint.key()
    # Not sort_keys: timings_ms is an ordered mapping (the cuDNN steps in the order they ran).
    text = json.dumps([v.to_dict() for v in verdicts], separators=(",", ":"))
    return NewEntry(fp_key, key, text, verdicts, depth, len(text.encode()) + len(fp_key) + len(key))


def keeps_stored(stored_depth: Any, entry: NewEntry) -> bool:
    """Whether put() keeps the stored decision of `stored_depth` (its depth column) instead of writing `entry`:
    it does when the stored one is deeper and `entry` is no rejection. A rejection answers a question
    of every depth (a build that fails after a verified "yes"), so it replaces a row of any depth; a
    depth that does not parse is a damaged row, replaced too."""
    if any(not v.supported for v in entry.verdicts):
        return False
    try:
        depth = parse_depth(stored_depth)
    except BadEntry:
        return False
    return depth is not entry.depth and depth.answers(entry.depth)


def plan_to_store(fingerprint: Fingerprint, plan_key: str, blob: bytes, max_bytes: int) -> bytes | None:
    """put_plan()'s arguments, checked (TypeError or ValueError): the blob as bytes, or None
    (logged) when it is larger than the whole store."""
    check_fingerprint(fingerprint)
    check_key("plan_key", plan_key)
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise TypeError(f"blob: must be bytes, not {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) > max_bytes:
        log.warning("fusedattn_select: plan %s (%d bytes) is larger than the cache (max_bytes=%d); not stored",
                    plan_key, len(blob), max_bytes)
        return None
    return blob


# A runner choice: the runner kept and the cost per forward call of each runner (microseconds).
# The store checks the shape only; which runner names exist is selection/runners.py's business.
RUNNER_CHOICE_FIELDS = ("runner", "torch_us", "cudnn_us")
_MAX_RUNNER_NAME = 64


@dataclass(frozen=True)
class NewRunnerChoice:
    """A runner choice handed to put_runner_choice(): checked, encoded and sized once."""

    fp_key: str
    key: str
    text: str  # the choice as the JSON a database row holds
    choice: dict[str, Any]
    size: int  # what it counts against max_bytes: the encoded choice and the two keys


def check_runner_choice(choice: Any) -> dict[str, Any]:
    """`choice` as the dict a store keeps: exactly RUNNER_CHOICE_FIELDS, a short runner name and two
    finite non-negative times. ValueError naming the field otherwise."""
    if not isinstance(choice, Mapping) or set(choice) != set(RUNNER_CHOICE_FIELDS):
        raise ValueError(f"choice={shown(choice)}: must be a mapping of exactly {', '.join(RUNNER_CHOICE_FIELDS)}")
    runner = choice["runner"]
    if not isinstance(runner, str) or not 0 < len(runner) <= _MAX_RUNNER_NAME:
        raise ValueError(f"runner={shown(runner)}: must be a name of 1 to {_MAX_RUNNER_NAME} characters")
    checked: dict[str, Any] = {"runner": runner}
    for field in RUNNER_CHOICE_FIELDS[1:]:
        value = choice[field]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{field}={shown(value)}: must be a finite number of microseconds >= 0")
        checked[field] = float(value)
    return checked


def new_runner_choice(fingerprint: Fingerprint, key: str, choice: Mapping[str, Any]) -> NewRunnerChoice:
    """put_runner_choice()'s arguments, checked (TypeError or ValueError)."""
    check_fingerprint(fingerprint)
    check_key("key", key)
    return runner_choice_row(fingerprint.key(), key, choice)


def runner_choice_row(fp_key: str, key: str, choice: Mapping[str, Any]) -> NewRunnerChoice:
    """The row of `choice` (checked: ValueError) under `fp_key` and `key`."""
    checked = check_runner_choice(choice)
    text = json.dumps(checked, sort_keys=True, separators=(",", ":"))
    return NewRunnerChoice(fp_key, key, text, checked, len(text.encode()) + len(fp_key) + len(key))


def parse_runner_choice(text: Any) -> dict[str, Any]:
    """A stored runner choice (its JSON text); BadEntry when it must not be used."""
    data = parse_json(text, "runner choice fields")
    try:
        return check_runner_choice(data)
    except ValueError as err:
        raise BadEntry(str(err)) from None


# ----- encoding -----------------------------------------------------------------------------------
def sha256(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def verdict_export_row(fp_key: str, key: str, depth: ProbeDepth, verdicts: tuple[Verdict, ...],
                       created: float) -> dict:
    """One decision as a row of an export file, with the sha256 of its content (decision_digest)."""
    return {"fingerprint": fp_key, "key": key, "depth": depth.value,
            "verdicts": [v.to_dict() for v in verdicts], "created": created,
            "sha256": decision_digest(fp_key, key, depth, verdicts)}


def plan_export_row(fp_key: str, key: str, blob: bytes) -> dict:
    """One plan as a row of an export file: base64, with its size and sha256."""
    return {"fingerprint": fp_key, "key": key, "sha256": sha256(blob), "size": len(blob),
            "blob": base64.b64encode(blob).decode("ascii")}


def runner_choice_export_row(fp_key: str, key: str, choice: dict[str, Any], created: float) -> dict:
    """One runner choice as a row of an export file, with the sha256 of its content."""
    return {"fingerprint": fp_key, "key": key, "choice": choice, "created": created,
            "sha256": runner_choice_digest(fp_key, key, choice)}


def runner_choice_digest(fp_key: str, key: str, choice: dict[str, Any]) -> str:
    """The sha256 an export file carries for a runner choice row, over its canonical content."""
    return sha256(json.dumps([fp_key, key, choice], sort_keys=True, separators=(",", ":")).encode())


# ----- reading back -------------------------------------------------------------------------------
# Anything the parsing of a stored or imported row can raise: a hostile row (a number beyond any
# float, JSON nested past Python's recursion limit) raises OverflowError or RecursionError.
PARSE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


def parse_verdicts(data: Any) -> tuple[Verdict, ...]:
    if not isinstance(data, list) or not data:
        raise BadEntry("verdicts are not a non-empty list")
    try:
        verdicts = tuple(Verdict.from_dict(item) for item in data)
    except PARSE_ERRORS as err:
        raise BadEntry(f"a verdict does not parse ({type(err).__name__}: {shown(err)})") from None
    if any(v.outcome in (Outcome.FAILED, Outcome.NO_DATA) for v in verdicts):
        raise BadEntry("holds a FAILED or NO_DATA verdict, which is never cached")
    return verdicts


def parse_depth(value: Any) -> ProbeDepth:
    try:
        return ProbeDepth(value)
    except PARSE_ERRORS:
        raise BadEntry(f"depth {shown(value)} is not 'fast', 'full' or 'verify'") from None


def _not_json(name: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON does not have and a store never writes.
    raise ValueError(f"{name} is not a JSON value")


def parse_json(text: Any, what: str) -> Any:
    """`text` decoded as JSON; BadEntry (naming `what`) when it is not JSON this process can read."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except RecursionError:
        raise BadEntry(f"{what} are nested too deeply to decode") from None
    except (TypeError, ValueError) as err:  # ValueError too for an integer of more digits than int() reads
        raise BadEntry(f"{what} are not valid JSON ({shown(err)})") from None


def parse_row(depth: Any, text: Any) -> tuple[tuple[Verdict, ...], ProbeDepth]:
    """A stored decision (its depth column and JSON verdicts); BadEntry when it must not be used."""
    return parse_verdicts(parse_json(text, "verdicts")), parse_depth(depth)


def decision_digest(fp_key: str, key: str, depth: ProbeDepth, verdicts: tuple[Verdict, ...]) -> str:
    """The sha256 an export file carries for a decision row: over its canonical content (fingerprint,
    key, depth and verdicts as to_dict writes them), so a verdict edited in the file does not match."""
    canonical = json.dumps([fp_key, key, depth.value, [v.to_dict() for v in verdicts]], separators=(",", ":"))
    return sha256(canonical.encode())


def shown(value: object, limit: int = 120) -> str:
    """repr of `value` cut to `limit` characters; a value too deep or too long to print is described."""
    try:
        text = repr(value) if not isinstance(value, BaseException) else str(value)
    except (RecursionError, ValueError):  # ValueError: an int of more digits than str() writes
        return f"<a {type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[:limit] + "..."
