"""SnapshotEngine: answers recorded on a real device, replayed where there is no device.

A snapshot is the JSON written by `fusedattn_select.selection.recorder.record_snapshot` (schema
"fusedattn-select-snapshot/1"): the device fingerprint plus, for every probed problem, the full
verdicts of each phase. Replaying never guesses: a problem that was not recorded, or a "yes"
recorded at depth fast asked at depth full, is answered NO_DATA at stage "snapshot", naming the
files it was looked up in: only a live probe can answer it.

A snapshot recorded over bucket ladders (`snapshot record` with a ladder) also holds, under
"buckets", the verdicts of each recorded class's bucket forms: the graphs a live GPU runs every shape
of the class in. A shape the snapshot did not record exactly is then answered by the row of the bucket
a GPU would run it in (`bucket_for`: buckets.bucket_form, the live path's own bucket), and the answer
says so (Selection.plan_form names the bucket). An exactly recorded shape answers from its own row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping, NoReturn

from fusedattn_select.buckets import bucket_form
from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError, SnapshotError
from fusedattn_select.probing.nearest import NEAREST_LIMIT, NearProblem, RecordedProblem, nearest
from fusedattn_select.types import (
    Backend,
    Fingerprint,
    Outcome,
    Phase,
    ProbeDepth,
    Provenance,
    Verdict,
    format_cudnn_version,
)

log = logging.getLogger("fusedattn_select")

# What a supported verdict recorded at a depth established, and what a deeper question asks.
_REACHED = {ProbeDepth.FAST: "check_support passed, kernels not built",
            ProbeDepth.FULL: "kernels built, results not compared with a reference"}
_ASKED = {ProbeDepth.FULL: "they build", ProbeDepth.VERIFY: "they compute the right results"}

SCHEMA = "fusedattn-select-snapshot/1"

# Fingerprint fields that must agree for two snapshots to be merged into one engine: the answers
# depend on them. library_version may differ (the recorder changed, not the device).
_MERGE_FIELDS = (
    "platform", "device_name", "compute_capability", "sm_count", "cudnn_backend_version",
    "cudnn_frontend_version", "driver_version",
)


@dataclass(frozen=True)
class SnapshotFile:
    """The header of one snapshot file: where and when it was recorded, from which suites."""

    path: str
    fingerprint: Fingerprint
    recorded_at: str
    recorder_version: str
    suites: tuple[str, ...]
    entry_count: int

    @property
    def file_name(self) -> str:
        return Path(self.path).name

    @property
    def recorded_on(self) -> str:
        """The date part of `recorded_at` (ISO 8601)."""
        return self.recorded_at[:10]


def _read_json(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SnapshotError(f"snapshot {path}: file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SnapshotError(f"snapshot {path}: cannot be read ({err})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise SnapshotError(f"snapshot {path}: nested too deeply to decode (a snapshot nests a few levels)") from None
    except ValueError as err:  # not JSON, or an integer of more digits than int() reads
        raise SnapshotError(f"snapshot {path}: not valid JSON ({err})") from None
    if not isinstance(data, Mapping):
        raise SnapshotError(f"snapshot {path}: expected a JSON object with schema {SCHEMA!r}")
    if data.get("schema") != SCHEMA:
        raise SnapshotError(
            f"snapshot {path}: schema {data.get('schema')!r} is not {SCHEMA!r}; "
            "re-record it with `fusedattn-select snapshot record`"
        )
    return data


# The fingerprint fields a recording always writes (recorder.record_snapshot: the live device's
# fingerprint) and what each must hold; a file without them cannot say where its answers are from.
_TEXT_FIELDS = ("platform", "device_name", "cudnn_frontend_version", "driver_version", "library_version")
_COUNT_FIELDS = ("sm_count", "cudnn_backend_version")
_CAPABILITY = re.compile(r"[0-9]+\.[0-9]+")


def _fingerprint(raw: object) -> Fingerprint:
    """The recording device's fingerprint; ValueError naming the field that is missing or malformed."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"'fingerprint' must be an object, not {type(raw).__name__}")
    for name in _TEXT_FIELDS:
        value = raw.get(name)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"fingerprint.{name}={_described(value, with_type=False)}: must be a non-empty "
                             "string (the recording device's, as `snapshot record` writes it)")
    for name in _COUNT_FIELDS:
        value = raw.get(name)
        if type(value) is not int or value <= 0:
            raise ValueError(f"fingerprint.{name}={_described(value, with_type=False)}: must be a positive "
                             "integer (the recording device's, as `snapshot record` writes it)")
    capability = raw.get("compute_capability")
    if not isinstance(capability, str) or not _CAPABILITY.fullmatch(capability):
        raise ValueError(f"fingerprint.compute_capability={_described(capability, with_type=False)}: must be "
                         "'major.minor' such as '9.0'")
    return Fingerprint.from_dict(dict(raw))


# The ISO 8601 times every supported Python reads alike (3.11's fromisoformat takes more than 3.10's).
_ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{3}|\.\d{6})?)?)?(Z|[+-]\d{2}:\d{2})?")


def _recorded_at(raw: object) -> str:
    """When the file was recorded (ISO 8601, as the recorder writes it); ValueError otherwise."""
    try:
        if not _ISO_TIME.fullmatch(raw):  # type: ignore[arg-type]
            raise ValueError(raw)
        datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith("Z") else raw)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"recorded_at={_described(raw, with_type=False)}: must be the ISO 8601 time of the "
                         "recording, such as '2026-11-27T17:08:06+00:00'") from None
    return raw  # type: ignore[return-value]


def _header(path: Path, data: Mapping[str, Any]) -> SnapshotFile:
    try:
        fingerprint = _fingerprint(data.get("fingerprint"))
        recorded_at = _recorded_at(data.get("recorded_at"))
        entries = data["entries"]
        if not isinstance(entries, list):
            raise TypeError("'entries' must be a list")
        suites = tuple(str(s) for s in data.get("suites", ()))
        return SnapshotFile(
            path=str(path),
            fingerprint=fingerprint,
            recorded_at=recorded_at,
            recorder_version=str(data.get("recorder_version", "")),
            suites=suites,
            entry_count=len(entries),
        )
    except _MALFORMED as err:
        raise SnapshotError(f"snapshot {path}: malformed header ({_described(err)})") from None


# What reading a malformed header or entry raises: a hostile one (an integer beyond any float, a
# value nested past Python's recursion limit) raises OverflowError or RecursionError.
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


def _described(value: object, with_type: bool = True, limit: int = 200) -> str:
    """An error (or value) for a message, cut to `limit` characters, even one too large to print."""
    try:
        text = str(value)
    except (RecursionError, ValueError):  # nested too deeply, or an int of more digits than str() writes
        text = "a value too large to show"
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(value).__name__}: {text}" if with_type else text


def read_header(path: str | Path) -> SnapshotFile:
    """Read only what a snapshot says about itself (device, date, suites); validates the schema."""
    path = Path(path)
    return _header(path, _read_json(path))


def _entries(path: Path, data: Mapping[str, Any]) -> list[RecordedProblem]:
    problems: list[RecordedProblem] = []
    rederived = []
    for index, raw in enumerate(data["entries"]):
        where = f"snapshot {path}: entries[{index}]"
        if not isinstance(raw, Mapping):
            raise SnapshotError(f"{where}: must be an object")
        try:
            cfg = AttnConfig.from_dict(raw["config"])
            verdicts = tuple(Verdict.from_dict(v).with_provenance(Provenance.SNAPSHOT) for v in raw["verdicts"])
            # Index by the key this library computes for the recorded config, so a change in how keys
            # are derived can never make a recorded answer apply to a different problem.
            key = cfg.cache_key()
        except ConfigError as err:
            raise SnapshotError(f"{where} ({_described(raw.get('name', '?'), with_type=False)}): config is "
                                f"not valid here: {_described(err, with_type=False)}") from None
        except _MALFORMED as err:
            raise SnapshotError(f"{where}: malformed entry ({_described(err)})") from None
        recorded = raw.get("cache_key")
        if isinstance(recorded, str) and recorded != key:
            rederived.append(f"entries[{index}]")
        name, suite = raw.get("name"), raw.get("suite")
        problems.append(RecordedProblem(
            name=name if isinstance(name, str) else f"entries[{index}]",
            suite=suite if isinstance(suite, str) else "",
            file_name=path.name, config=cfg, verdicts=verdicts,
        ))
    if rederived:  # one line a file: the keys this library derives answer, not the recorded ones
        log.debug("snapshot %s: %d recorded cache_keys re-derived by this version (%s)", path, len(rederived),
                  ", ".join(rederived[:5]) + (", ..." if len(rederived) > 5 else ""))
    return problems


# A ladder's recorded bucket verdicts, by (the bucket form's problem class key, batch, seqlen_q,
# seqlen_kv): plain tuples, cheaper to make and hash than Bucket for the tens of thousands read.
BucketIndex = dict[tuple[str, int, int, int], tuple[Verdict, ...]]


def _rungs(where: str, group: Mapping[str, Any], verdicts: tuple[Verdict, ...],
           phases: int) -> list[tuple[int, int, int, tuple[Verdict, ...]]]:
    """A group's rungs, (batch, seqlen_q, seqlen_kv, verdicts): each recorded as [batch, seqlen_q,
    seqlen_kv, then one index into `verdicts` per verdict]."""
    rungs = group.get("rungs")
    if not isinstance(rungs, list):
        raise SnapshotError(f"{where}: 'rungs' must be a list of [batch, seqlen_q, seqlen_kv, verdict index...]")
    found = []
    count = len(verdicts)
    # `type(x) is int` where the checks say "integer": a bool is not one. Plain comparisons, not
    # generators: a bundled snapshot has tens of thousands of rungs, read on every `why`.
    for number, rung in enumerate(rungs):
        # A rule answers only the phases it rejects: 1 to `phases` verdicts.
        if type(rung) is not list or not 4 <= len(rung) <= 3 + phases:
            _bad_rung(where, number, rung, phases)
        batch, seqlen_q, seqlen_kv, *picked = rung
        if not (type(batch) is int and type(seqlen_q) is int and type(seqlen_kv) is int
                and batch >= 1 and seqlen_q >= 1 and seqlen_kv >= 1):
            _bad_rung(where, number, rung, phases)
        for i in picked:
            if type(i) is not int or not 0 <= i < count:
                raise SnapshotError(f"{where}: rungs[{number}]: verdict indices {_described(picked, with_type=False)} "
                                    f"must be in 0..{count - 1}")
        found.append((batch, seqlen_q, seqlen_kv, tuple([verdicts[i] for i in picked])))
    return found


def _bad_rung(where: str, number: int, rung: object, phases: int) -> NoReturn:
    raise SnapshotError(f"{where}: rungs[{number}]={_described(rung, with_type=False)}: must be "
                        f"[batch, seqlen_q, seqlen_kv] (positive integers) and 1 to {phases} verdict indices")


def _bucket_rows(path: Path, data: Mapping[str, Any], problems: list[RecordedProblem], index: BucketIndex) -> int:
    """Add the rungs a ladder recorded ("buckets", see recorder.bucket_groups) to `index`, the first
    recorded of each kept; returns how many were read. Nothing per rung is derived here (a bucket's
    form and key are made when a shape asks for it): a file of thousands of rungs loads in milliseconds."""
    groups = data.get("buckets", [])
    if not isinstance(groups, list):
        raise SnapshotError(f"snapshot {path}: 'buckets' must be a list")
    count = 0
    for number, group in enumerate(groups):
        where = f"snapshot {path}: buckets[{number}]"
        if not isinstance(group, Mapping):
            raise SnapshotError(f"{where}: must be an object")
        entry = group.get("entry")
        if isinstance(entry, bool) or not isinstance(entry, int) or not 0 <= entry < len(problems):
            raise SnapshotError(f"{where}: entry={_described(entry, with_type=False)}: must be the index "
                                f"of a recorded entry (0 to {len(problems) - 1})")
        own = bucket_form(problems[entry].config)
        if own is None:
            raise SnapshotError(f"{where}: entries[{entry}] ({problems[entry].label}) has no bucket form")
        try:
            verdicts = tuple(Verdict.from_dict(v).with_provenance(Provenance.SNAPSHOT) for v in group["verdicts"])
        except _MALFORMED as err:
            raise SnapshotError(f"{where}: malformed verdicts ({_described(err)})") from None
        class_key = own.shape_class_key()
        for batch, seqlen_q, seqlen_kv, answer in _rungs(where, group, verdicts, len(own.phases)):
            index.setdefault((class_key, batch, seqlen_q, seqlen_kv), answer)
            count += 1
    return count


def _rung(form: AttnConfig) -> tuple:
    """A bucket form's key among the recorded rungs: its class and sizes (as _bucket_rows files them)."""
    return form.shape_class_key(), form.batch_size, form.seqlen_q, form.seqlen_kv


class SnapshotEngine:
    """A ProbeEngine that answers from one or more snapshot files recorded on one device."""

    provenance = Provenance.SNAPSHOT

    def __init__(self, files: Iterable[SnapshotFile], answers: Mapping[tuple[str, Phase], Verdict],
                 recorded: Iterable[RecordedProblem] = (), buckets: BucketIndex | None = None) -> None:
        self.files = tuple(files)
        if not self.files:
            raise SnapshotError("a snapshot engine needs at least one snapshot file")
        self._answers = dict(answers)
        self.recorded = tuple(recorded)
        # The bucket forms a ladder recorded: only those answer for other shapes, never an entry that
        # happens to be a ragged problem.
        self._buckets: BucketIndex = dict(buckets or {})
        self._fingerprint = self.files[0].fingerprint
        self.file_names = "+".join(f.file_name for f in self.files)
        self.name = f"snapshot:{self.file_names}"

    @classmethod
    def load(cls, path: str | Path) -> "SnapshotEngine":
        """Load one snapshot file; SnapshotError names the file when it is missing or malformed."""
        return cls.load_many([path])

    @classmethod
    def load_many(cls, paths: Iterable[str | Path]) -> "SnapshotEngine":
        """Merge snapshot files recorded on the same device and cuDNN into one engine.

        The first file that records a problem answers it. Files from different fingerprints
        (device, cuDNN, driver) cannot be merged: their answers are about different platforms.
        """
        files: list[SnapshotFile] = []
        answers: dict[tuple[str, Phase], Verdict] = {}
        recorded: dict[str, RecordedProblem] = {}
        buckets: BucketIndex = {}
        for path in (Path(p) for p in paths):
            data = _read_json(path)
            header = _header(path, data)
            if files:
                first = files[0]
                for name in _MERGE_FIELDS:
                    if getattr(header.fingerprint, name) != getattr(first.fingerprint, name):
                        raise SnapshotError(
                            f"snapshot {path}: recorded with {name}={getattr(header.fingerprint, name)!r}, "
                            f"but {first.path} with {getattr(first.fingerprint, name)!r}; "
                            "only snapshots of one platform can be merged"
                        )
            problems = _entries(path, data)
            for problem in problems:
                key = problem.config.cache_key()
                recorded.setdefault(key, problem)
                for verdict in problem.verdicts:
                    answers.setdefault((key, verdict.phase), verdict)
            _bucket_rows(path, data, problems, buckets)
            files.append(header)
        return cls(files, answers, recorded.values(), buckets)

    def content_sha256(self) -> str:
        """sha256 (hex) of the files' bytes in load order: equal digests, equal answers. A file that
        cannot be read now counts as its path and error, so only engines that cannot read it alike match."""
        digest = hashlib.sha256()
        for file in self.files:
            try:
                digest.update(hashlib.sha256(Path(file.path).read_bytes()).digest())
            except OSError as err:
                digest.update(f"{file.path}: {type(err).__name__}".encode())
        return digest.hexdigest()

    def fingerprint(self) -> Fingerprint:
        return self._fingerprint

    def __len__(self) -> int:
        return len(self._answers)

    @property
    def bucket_count(self) -> int:
        """How many buckets the loaded snapshots recorded over ladders."""
        return len(self._buckets)

    def bucket_for(self, cfg: AttnConfig) -> AttnConfig | None:
        """The recorded bucket form whose verdicts answer `cfg`: the bucket a live GPU runs it in
        (buckets.bucket_form, as the live Selector picks it with nothing learned yet), when `cfg`
        itself was not recorded and that bucket was; else None (its own row, or no data, answers)."""
        if not self._buckets:
            return None
        key = cfg.cache_key()
        if any((key, phase) in self._answers for phase in cfg.phases):
            return None
        form = bucket_form(cfg)
        recorded = None if form is None else self._buckets.get(_rung(form))
        if recorded is None:
            return None
        return form

    def nearest(self, cfg: AttnConfig, limit: int = NEAREST_LIMIT) -> tuple[NearProblem, ...]:
        """The recorded problems closest to `cfg` (probing.nearest says how they are ranked), best
        first, `cfg` itself left out: OTHER problems, whose verdicts are never `cfg`'s answer."""
        return nearest(cfg, self.recorded, limit)

    def describe(self) -> str:
        """Where the answers were recorded: "NVIDIA H100 80GB HBM3, cuDNN 9.19.0 on 2026-11-21", with
        every date the merged files were recorded on ("on 2026-11-21 and 2026-11-27"): any may answer."""
        fp = self.files[0].fingerprint
        dates = sorted({f.recorded_on for f in self.files})
        on = dates[0] if len(dates) == 1 else ", ".join(dates[:-1]) + f" and {dates[-1]}"
        return f"{fp.device_name or fp.platform}, cuDNN {format_cudnn_version(fp.cudnn_backend_version)} on {on}"

    def probe(self, cfg: AttnConfig, backend: Backend, phase: Phase, depth: ProbeDepth) -> Verdict:
        """The recorded verdict for this problem and phase, or NO_DATA when none answers `depth`
        (a "yes" recorded at depth full does not answer depth verify either).

        A verdict keeps the depth it was recorded at. A "yes" recorded at depth fast says nothing
        about whether the kernels build, so it does not answer a question at depth full; a "no"
        recorded at depth fast does (a graph cuDNN refuses does not build either).
        """
        key = cfg.cache_key()
        verdict = self._answers.get((key, phase)) or self._bucket_verdict(cfg, phase)
        if verdict is None or verdict.backend is not backend:
            answer = self._no_data(key, backend, phase, depth, f"not recorded in {self.file_names}; "
                                   "only a live probe on a GPU can answer it")
        elif verdict.supported and not verdict.depth.answers(depth):
            answer = self._no_data(
                key, backend, phase, verdict.depth,
                f"recorded at depth {verdict.depth.value} in {self.file_names} ({_REACHED[verdict.depth]}); "
                f"ask at depth {verdict.depth.value} for that answer: only a live probe at depth {depth.value} "
                f"can say whether {_ASKED[depth]}",
                verdict.timings_ms,
            )
        else:
            answer = verdict
        log.debug("fusedattn_select: snapshot lookup %s %s %s at depth %s in %s: %s (recorded at depth %s)",
                  key, backend.value, phase.value, depth.value, self.file_names, answer.outcome.value,
                  answer.depth.value)
        return answer

    def _bucket_verdict(self, cfg: AttnConfig, phase: Phase) -> Verdict | None:
        """The verdict of `phase` a ladder recorded for `cfg` when `cfg` is itself a bucket form at one of
        its rungs (a rung is recorded as its class and sizes, not as an entry): read here, never copied
        into the answers, so an answer does not depend on which problems were asked before it."""
        if not self._buckets:
            return None
        recorded = self._buckets.get(_rung(cfg))
        return next((verdict for verdict in recorded or () if verdict.phase is phase), None)

    @staticmethod
    def _no_data(key: str, backend: Backend, phase: Phase, depth: ProbeDepth, message: str,
                 timings_ms: tuple[tuple[str, float], ...] = ()) -> Verdict:
        return Verdict(
            backend=backend, phase=phase, outcome=Outcome.NO_DATA, stage="snapshot", message=message,
            detail=f"{message}: no {backend.value} {phase.value} verdict at this depth for cache key {key}",
            provenance=Provenance.SNAPSHOT, depth=depth, timings_ms=timings_ms,
        )
