"""Record a snapshot: probe every entry of some config files on a live device and keep the verdicts.

Snapshots are how the library answers on machines without a GPU (CI, laptops): they must come from
a real device, so recording from a SnapshotEngine is refused. Each problem is asked through a fresh
`Selector` without a persistent store, so every verdict in the file comes from this run.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from fusedattn_select._version import __version__
from fusedattn_select.config_files import NamedConfig, load_config_file
from fusedattn_select.errors import SnapshotError
from fusedattn_select.probing import torch_rules
from fusedattn_select.probing.engine import ProbeEngine
from fusedattn_select.probing.snapshot import SCHEMA
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Outcome, ProbeDepth, Provenance, Verdict

log = logging.getLogger("fusedattn_select")

# progress(done, total, entry): called after each entry is recorded (entry as written to the file).
Progress = Callable[[int, int, dict], None]


def _failed_verdicts(named: NamedConfig, depth: ProbeDepth, err: Exception) -> tuple[Verdict, ...]:
    # An engine must not raise (see ProbeEngine), but if one does the entry is still recorded, as
    # a failure with the error text, so a recording never hides a problem it could not answer.
    cfg = named.config
    message = f"{type(err).__name__}: {err}"
    return tuple(
        Verdict(cfg.candidate, phase, Outcome.FAILED, "recorder", message, message,
                Provenance.LIVE_PROBE, depth)
        for phase in cfg.phases
    )


def record_snapshot(
    paths: Iterable[str | Path],
    engine: ProbeEngine,
    depth: str = "fast",
    jobs: int = 1,
    progress: Progress | None = None,
    ask_torch: bool = True,
) -> dict[str, Any]:
    """Probe every entry of the YAML config files `paths` with `engine`; return the snapshot dict.

    Entries keep the order of the files. Rule-rejected problems are recorded with their rule
    verdicts, FAILED probes as failed; nothing is skipped. `jobs` > 1 probes entries on threads
    (this overlaps the Python around the probes; cuDNN's plan builds themselves hold the GIL).

    With `ask_torch` and torch seeing a CUDA device, each entry also gets PyTorch's own answer
    (`"torch"`, see probing.torch_rules.torch_answer) and the header torch's versions (`"torch"`);
    without torch the header says why (`"torch": {"unavailable": reason}`) and entries have none.
    """
    if engine.provenance is Provenance.SNAPSHOT:
        raise SnapshotError(
            f"refusing to record from {engine.name}: snapshots are recorded from a live device only"
        )
    probe_depth = ProbeDepth.parse(depth, "depth")
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: must be >= 1")
    paths = [Path(p) for p in paths]
    files = [load_config_file(p) for p in paths]
    work = [(path.name, named) for path, cfg_file in zip(paths, files) for named in cfg_file.entries]
    # A snapshot records each problem's own graphs, as described (never its bucket form).
    selector = Selector(engine, store=None, bucket_forms=False)
    torch_header, torch_missing = torch_rules.torch_platform() if ask_torch else (None, "not asked (ask_torch=False)")
    if torch_header is None:
        log.info("fusedattn_select: recording without torch's answers: %s", torch_missing)
    total = len(work)
    done = 0

    def answer(item: tuple[str, NamedConfig]) -> dict[str, Any]:
        suite, named = item
        try:
            verdicts = selector.select(named.config, probe_depth).verdicts
        except Exception as err:  # noqa: BLE001 - recorded, see _failed_verdicts
            log.error("fusedattn_select: recording %s:%s raised %s", suite, named.name, err)
            verdicts = _failed_verdicts(named, probe_depth, err)
        return {
            "suite": suite,
            "name": named.name,
            "cache_key": named.config.cache_key(),
            # With defaults, so the recorded problem keeps its meaning if a default ever changes.
            "config": named.config.to_dict(include_defaults=True),
            "verdicts": [_as_probed(v).to_dict() for v in verdicts],
        }

    entries: list[dict[str, Any]] = []
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


def write_snapshot(snapshot: dict[str, Any], path: str | Path) -> Path:
    """Write the snapshot JSON atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a snapshot is data meant to be shared
        with os.fdopen(fd, "w") as handle:
            json.dump(snapshot, handle, indent=1, sort_keys=False)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


__all__ = ["record_snapshot", "summarize", "write_snapshot"]
