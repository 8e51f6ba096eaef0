"""Record a snapshot: probe every entry of some config files on a live device and keep the verdicts.

Snapshots are how the library answers on machines without a GPU (CI, laptops): they must come from
a real device, so recording from a SnapshotEngine is refused. Each problem is asked through a fresh
`Selector` without a persistent store, so every verdict in the file comes from this run.

With a `Ladder`, each problem class is also recorded over its bucket ladder (buckets.ladder): the
bucket forms whose graphs a live GPU runs every shape of the class in. Those rows sit apart from the
entries, under "buckets", grouped by the entry whose class they are, each rung naming its bucket, so
no reader takes one for an exact shape; the snapshot engine answers an unrecorded shape of the class from its bucket's
row (probing.snapshot).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from fusedattn_select._version import __version__
from fusedattn_select.buckets import LADDER_MAX_BATCH, LADDER_MAX_SEQLEN, Bucket, bucket_form, ladder
from fusedattn_select.config import AttnConfig
from fusedattn_select.config_files import NamedConfig, load_config_file
from fusedattn_select.errors import ConfigError, SnapshotError, short_repr
from fusedattn_select.probing import torch_rules
from fusedattn_select.probing.engine_protocol import ProbeEngine
from fusedattn_select.probing.snapshot import SCHEMA
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Outcome, ProbeDepth, Provenance, Verdict

log = logging.getLogger("fusedattn_select")

# progress(done, total, entry): called after each entry is recorded (entry as written to the file).
Progress = Callable[[int, int, dict], None]


@dataclass(frozen=True)
class Ladder:
    """How far each problem class is recorded over its bucket ladder: batch sizes up to `max_batch`,
    lengths up to `max_seqlen` (each extended to a recorded problem's own bucket; buckets.ladder), and
    at which probe depth (None: the entries' own)."""

    max_batch: int = LADDER_MAX_BATCH
    max_seqlen: int = LADDER_MAX_SEQLEN
    depth: ProbeDepth | None = None

    def __post_init__(self) -> None:
        for field in ("max_batch", "max_seqlen"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ladder {field}={value!r}: must be a positive integer")
        if self.depth is not None:
            object.__setattr__(self, "depth", ProbeDepth.parse(self.depth, "ladder depth"))

    def header(self) -> dict[str, Any]:
        """What the snapshot says about its ladder ("depth" only where the rungs have a depth of their own)."""
        reach = {"max_batch": self.max_batch, "max_seqlen": self.max_seqlen}
        return reach if self.depth is None else {**reach, "depth": self.depth.value}


def ladder_work(configs: Iterable[AttnConfig], reach: Ladder) -> list[tuple[int, Bucket, AttnConfig]]:
    """(entry index, bucket, bucket form) for every bucket on the ladders of `configs`, each form once:
    the first entry of a class whose ladder holds a bucket is the one its row names."""
    seen: set[str] = set()
    work = []
    for index, cfg in enumerate(configs):
        for bucket in ladder(cfg, reach.max_batch, reach.max_seqlen):
            form = bucket_form(cfg, bucket)
            key = form.cache_key() if form is not None else None
            if key is not None and key not in seen:
                seen.add(key)
                work.append((index, bucket, form))
    return work


def bucket_groups(rows: Iterable[tuple[int, Bucket, tuple[Verdict, ...]]]) -> list[dict[str, Any]]:
    """The "buckets" of a snapshot from (entry index, bucket, verdicts) rows: one group per entry,
    {"entry", "verdicts", "rungs"}, each rung [batch, seqlen_q, seqlen_kv, i, ...] with one index into
    the group's "verdicts" per phase. The group's verdicts are kept once each, without probe times
    (they would make every rung's verdicts distinct); rows of one entry keep their order."""
    groups: dict[int, tuple[dict[str, Any], dict[str, int]]] = {}
    for index, bucket, verdicts in rows:
        group, seen = groups.setdefault(index, ({"entry": index, "verdicts": [], "rungs": []}, {}))
        rung: list[int] = [bucket.batch, bucket.seqlen_q, bucket.seqlen_kv]
        for verdict in verdicts:
            raw = dataclasses.replace(_as_probed(verdict), timings_ms=()).to_dict()
            text = json.dumps(raw, sort_keys=True)
            if text not in seen:
                seen[text] = len(group["verdicts"])
                group["verdicts"].append(raw)
            rung.append(seen[text])
        group["rungs"].append(rung)
    return [group for group, _ in groups.values()]


def _failed_verdicts(cfg: AttnConfig, depth: ProbeDepth, err: Exception) -> tuple[Verdict, ...]:
    # An engine must not raise (see ProbeEngine), but if one does the entry is still recorded, as
    # a failure with the error text, so a recording never hides a problem it could not answer.
    message = f"{type(err).__name__}: {err}"
    return tuple(
        Verdict(cfg.candidate, phase, Outcome.FAILED, "recorder", message, message,
                Provenance.LIVE_PROBE, depth)
        for phase in cfg.phases
    )


def _verdicts(selector: Selector, cfg: AttnConfig, depth: ProbeDepth, what: str) -> tuple[Verdict, ...]:
    """`cfg`'s own verdicts, or failures with the error an engine raised (see _failed_verdicts)."""
    try:
        return selector.select(cfg, depth).verdicts
    except Exception as err:  # noqa: BLE001 - recorded, see _failed_verdicts
        log.error("fusedattn_select: recording %s raised %s", what, err)
        return _failed_verdicts(cfg, depth, err)


def _entry_row(selector: Selector, depth: ProbeDepth, suite: str, named: NamedConfig) -> dict[str, Any]:
    """An "entries" row: the problem as named in its suite, its config and its own verdicts."""
    verdicts = _verdicts(selector, named.config, depth, f"{suite}:{named.name}")
    return {
        "suite": suite,
        "name": named.name,
        "cache_key": named.config.cache_key(),
        # With defaults, so the recorded problem keeps its meaning if a default ever changes.
        "config": named.config.to_dict(include_defaults=True),
        "verdicts": [_as_probed(v).to_dict() for v in verdicts],
    }


def _checked_request(engine: ProbeEngine, depth: str, jobs: int, ladder: Ladder | None) -> ProbeDepth:
    """record_snapshot's depth, after refusing what it cannot record (SnapshotError, ValueError)."""
    if engine.provenance is Provenance.SNAPSHOT:
        raise SnapshotError(
            f"refusing to record from {engine.name}: snapshots are recorded from a live device only"
        )
    probe_depth = ProbeDepth.parse(depth, "depth")
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: must be >= 1")
    if ladder is not None and not isinstance(ladder, Ladder):
        raise ValueError(f"ladder={ladder!r}: must be a recorder.Ladder or None")
    return probe_depth


def record_snapshot(
    paths: Iterable[str | Path],
    engine: ProbeEngine,
    depth: str = "fast",
    jobs: int = 1,
    progress: Progress | None = None,
    ask_torch: bool = True,
    ladder: Ladder | None = None,
) -> dict[str, Any]:
    """Probe every entry of the YAML config files `paths` with `engine`; return the snapshot dict.

    Entries keep the order of the files. Rule-rejected problems are recorded with their rule
    verdicts, FAILED probes as failed; nothing is skipped. `jobs` > 1 probes entries on threads
    (this overlaps the Python around the probes; cuDNN's plan builds themselves hold the GIL).

    With `ask_torch` and torch seeing a CUDA device, each entry also gets PyTorch's own answer
    (`"torch"`, see probing.torch_rules.torch_answer) and the header torch's versions (`"torch"`);
    without torch the header says why (`"torch": {"unavailable": reason}`) and entries have none.

    With `ladder`, every bucket form on the ladders of the entries' classes is probed too (at
    `ladder.depth`, default `depth`) and recorded under "buckets" (see bucket_groups; `progress` is
    called for each of those as well). A rung keeps its verdicts' depth, so a fast rung never answers
    a question at depth full.
    """
    probe_depth = _checked_request(engine, depth, jobs, ladder)
    paths = [Path(p) for p in paths]
    work = [(path.name, named) for path in paths for named in load_config_file(path).entries]
    rungs = ladder_work([named.config for _, named in work], ladder) if ladder is not None else []
    # Building every rung's kernels (depth full) costs a plan build per graph: a ladder may ask less.
    rung_depth = ladder.depth if ladder is not None and ladder.depth is not None else probe_depth
    # Each problem's own graphs, as described; bucket forms are asked as problems of their own.
    selector = Selector(engine, store=None, bucket_forms=False)
    torch_header, torch_missing = torch_rules.torch_platform() if ask_torch else (None, "not asked (ask_torch=False)")
    if torch_header is None:
        log.info("fusedattn_select: recording without torch's answers: %s", torch_missing)
    total, done = len(work) + len(rungs), 0

    def answer(item: tuple[str, NamedConfig]) -> dict[str, Any]:
        return _entry_row(selector, probe_depth, *item)

    def rung(item: tuple[int, Bucket, AttnConfig]) -> tuple[int, Bucket, tuple[Verdict, ...]]:
        index, bucket, form = item
        return index, bucket, _verdicts(selector, form, rung_depth, f"entries[{index}] at bucket {bucket.describe()}")

    entries: list[dict[str, Any]] = []
    rows: list[tuple[int, Bucket, tuple[Verdict, ...]]] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for (_, named), entry in zip(work, pool.map(answer, work)):
            if torch_header is not None:
                # Asked on this (the main) thread, one problem at a time: torch_answer sets torch's
                # global SDPA flags while it asks.
                entry["torch"] = torch_rules.torch_answer(named.config)
            entries.append(entry)
            done += 1
            if progress is not None:
                progress(done, total, entry)
        for row in pool.map(rung, rungs):
            rows.append(row)
            done += 1
            if progress is not None:
                index, bucket, verdicts = row
                progress(done, total, {"entry": index, "bucket": dataclasses.asdict(bucket),
                                       "verdicts": [v.to_dict() for v in verdicts]})
    return {
        "schema": SCHEMA,
        "recorder_version": __version__,
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "depth": probe_depth.value,
        "engine": engine.name,
        "fingerprint": engine.fingerprint().to_dict(),
        "torch": torch_header if torch_header is not None else {"unavailable": torch_missing},
        "suites": [p.name for p in paths],
        "entries": entries,
        **({"buckets": bucket_groups(rows), "ladder": ladder.header()}
           if ladder is not None else {}),
    }


def _as_probed(verdict: Verdict) -> Verdict:
    # A problem listed twice is answered from the memory cache the second time; the verdict is
    # still the one the live probe produced, so record it as such.
    if verdict.provenance is Provenance.MEMORY_CACHE:
        return verdict.with_provenance(Provenance.LIVE_PROBE)
    return verdict


def summarize(snapshot: dict[str, Any]) -> dict[str, int]:
    """Counts of entries by answer: selected, none (rejected), failed (a probe failed)."""
    counts = {"entries": 0, "selected": 0, "none": 0, "failed": 0}
    for entry in snapshot["entries"]:
        counts["entries"] += 1
        outcomes = {v["outcome"] for v in entry["verdicts"]}
        if Outcome.FAILED.value in outcomes:
            counts["failed"] += 1
        elif outcomes == {Outcome.SUPPORTED.value}:
            counts["selected"] += 1
        else:
            counts["none"] += 1
    return counts


def check_output(path: str | Path, field: str = "output") -> Path:
    """`path` as a Path once a snapshot can be written there, else ConfigError naming `field` and `path`.

    Asked before a recording starts, so a path that cannot take the file fails in a second instead of
    after every probe: the path must not be a directory, its nearest existing folder must be a
    directory (write_snapshot creates the missing ones below it), and a file must be creatable there.
    The last is tried for real (a temporary file, removed at once): permission bits say nothing to
    root, a read-only mount or /proc."""
    shown = str(path)
    path = Path(path)
    try:
        if path.is_dir():
            raise ConfigError(field, shown, "is a directory; name the snapshot file to write")
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise ConfigError(field, shown, f"{folder} is not a directory; the snapshot file needs one")
    except OSError as err:  # a name too long, a folder that cannot be searched
        raise ConfigError(field, shown, f"cannot be written ({err.strerror or err})") from None
    try:
        # The temporary name write_snapshot uses, so a file name too long for it fails here too.
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        allowed = "a shorter file name" if err.errno == errno.ENAMETOOLONG else "a directory this user can write"
        raise ConfigError(field, shown, f"no file can be created in {folder} ({err.strerror or err}); "
                          f"the snapshot needs {allowed}") from None
    return path


def write_snapshot(snapshot: dict[str, Any], path: str | Path, field: str = "snapshot") -> Path:
    """Write the snapshot JSON atomically (a reader never sees half a file), creating missing folders.

    A write that fails (a folder gone since check_output, a full disk) raises SnapshotError naming
    `field` and the path, and leaves no file behind: neither the temporary one nor half a snapshot."""
    path = Path(path)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), 0o644)  # mkstemp creates 0600; a snapshot is data meant to be shared
            json.dump(snapshot, handle, indent=1, sort_keys=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())  # the data is on disk before the name points at it (a crash)
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(err, OSError):
            raise SnapshotError(f"{field}={short_repr(str(path))}: cannot be written ({err.strerror or err}); "
                                "no snapshot was written") from err
        raise
    return path


__all__ = [
    "Ladder", "bucket_groups", "check_output", "ladder_work", "record_snapshot", "summarize", "write_snapshot",
]
