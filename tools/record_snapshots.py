#!/usr/bin/env python3
"""Record the bundled snapshots of this GPU: configs/, the Hopper probe suite and the model suite.

One command per device (docs/snapshots.md): each suite is split into shards recorded in parallel
processes with the project's own recorder (`fusedattn-select snapshot record`, bucket ladders on),
the shards of a suite are merged into one file, and the three files are checked to load together
and to answer every problem of the model suite's corpus. Processes, not threads: cuDNN's plan
builds hold the GIL.

    python3 tools/record_snapshots.py --out-dir "$OUT"      # writes <target>-{configs,hopper-suite,models}.json

The target (h100, h200) is the live device's; `--target` only checks it. Copy the files written
into fusedattn_select/snapshots/ to bundle them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORDED_WITH_FAILED_PROBES = 3  # `snapshot record`'s exit code for a file written with failed probes in it
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import yaml

from fusedattn_select.buckets import bucket_form
from fusedattn_select.config import AttnConfig
from fusedattn_select.selection.recorder import summarize, write_snapshot


@dataclass(frozen=True)
class Suite:
    """One bundled snapshot: its files, `snapshot record` options and how many shards record it."""

    name: str
    files: tuple[str, ...]
    options: tuple[str, ...]
    shards: int


SUITES = (
    # Every problem built and its outputs checked against the reference (depth verify: why --full and
    # why --verify answer them); the rungs of each class's bucket ladder check support.
    Suite("configs", tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("*.yaml"))),
          ("--depth", "verify", "--ladder-depth", "fast"), 3),
    Suite("hopper-suite", ("probes/hopper-suite.yaml",), ("--depth", "verify", "--ladder-depth", "fast"), 6),
    Suite("models", ("probes/hf-models.yaml",), ("--depth", "verify", "--ladder-depth", "fast"), 3),
)


def shard(suite: Suite, workdir: Path, shards: int | None = None) -> list[list[Path]]:
    """The suite's files split into at most `shards` units, each a list of YAML files keeping the
    names of the files they come from (a recorded entry names its file): several files go to units
    whole; one file's entries are cut into contiguous runs, each written to a folder of its own."""
    count = max(1, shards or suite.shards)
    files = [ROOT / f for f in suite.files]
    if len(files) > 1:  # contiguous runs: the merged file keeps the files' order
        size = -(-len(files) // count)
        return [files[start:start + size] for start in range(0, len(files), size)]
    data = yaml.safe_load(files[0].read_text())
    entries = data["configs"]
    size = -(-len(entries) // count)
    units = []
    for number, start in enumerate(range(0, len(entries), size)):
        folder = workdir / f"{suite.name}-{number}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / files[0].name
        path.write_text(yaml.safe_dump({**data, "configs": entries[start:start + size]}, sort_keys=False))
        units.append([path])
    return units


def _class_key(entry: dict[str, Any]) -> str:
    form = bucket_form(AttnConfig.from_dict(entry["config"]))
    assert form is not None, "a ladder group names an entry with a bucket form"
    return form.shape_class_key()


def merge_parts(parts: list[dict[str, Any]], suites: list[str]) -> dict[str, Any]:
    """One snapshot from the snapshots of a suite's shards, in order: what one recording of the whole
    suite writes (entries in order; each rung once, in the group of the first entry whose ladder holds
    it; a group's verdicts only those its rungs name)."""
    first = parts[0]
    for part in parts[1:]:
        for key in ("schema", "fingerprint", "depth", "engine", "torch", "ladder"):
            if part.get(key) != first.get(key):
                raise ValueError(f"shards disagree on {key!r}: {part.get(key)!r} != {first.get(key)!r}")
    entries: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    seen: set[tuple[str, tuple[int, ...]]] = set()
    for part in parts:
        offset = len(entries)
        for group in part.get("buckets", []):
            key = _class_key(part["entries"][group["entry"]])
            rungs = [r for r in group["rungs"] if (key, tuple(r[:3])) not in seen]
            seen.update((key, tuple(r[:3])) for r in rungs)
            if not rungs:
                continue
            used = sorted({i for r in rungs for i in r[3:]})
            index = {old: new for new, old in enumerate(used)}
            groups.append({"entry": group["entry"] + offset, "verdicts": [group["verdicts"][i] for i in used],
                           "rungs": [r[:3] + [index[i] for i in r[3:]] for r in rungs]})
        entries += part["entries"]
    merged = {**first, "suites": suites, "entries": entries}
    if "buckets" in first:
        merged["buckets"] = groups
    return merged


def _start(units: list[tuple[Suite, list[Path]]], workdir: Path) -> list[tuple[subprocess.Popen, Path, Path]]:
    runs = []
    for number, (suite, files) in enumerate(units):
        part, log = workdir / f"part-{number}.json", workdir / f"part-{number}.log"
        command = [sys.executable, "-m", "fusedattn_select.cli", "snapshot", "record", *map(str, files),
                   "-o", str(part), *suite.options]
        with log.open("w") as handle:
            handle.write(f"$ {' '.join(command)}\n")
            handle.flush()
            runs.append((subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT), part, log))
    return runs


def _wait(runs: list[tuple[subprocess.Popen, Path, Path]], deadline: float) -> list[int]:
    codes = []
    for process, _, _ in runs:
        try:
            codes.append(process.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()  # its shard is lost; the log says how far it came
            codes.append(process.wait())
    return codes


def _answers_corpus(paths: list[Path]) -> str:
    """How many model-suite corpus problems the recorded files answer (not no data) at why's defaults."""
    from fusedattn_select.probing.snapshot import SnapshotEngine
    from fusedattn_select.selection.selector import Selector
    from tools.gen_model_suite import corpus_problems

    selector = Selector(SnapshotEngine.load_many(paths))
    found, _ = corpus_problems()
    missing = [f"{p.file.name} {p.entry.name} {' '.join(p.sets)}" for p in found
               if selector.select(p.entry.config).no_data]
    lines = [f"{len(found) - len(missing)} of {len(found)} corpus problems answered"]
    return "\n  no data: ".join(lines + missing)


def _device_target(wanted: str | None) -> tuple[str, str]:
    from fusedattn_select.probing.choice import TARGETS, live_engine

    engine, reason = live_engine()
    if engine is None:
        raise SystemExit(f"record_snapshots: no live device: {reason}")
    device = engine.fingerprint().device_name
    found = [t for t in TARGETS if t in device.lower()]
    if len(found) != 1 or wanted not in (None, found[0]):
        expected = wanted or "one of " + ", ".join(TARGETS)
        raise SystemExit(f"record_snapshots: device {device!r} is not target {expected}")
    return found[0], engine.fingerprint().describe()


def suite_names(text: str) -> tuple[str, ...]:
    """argparse type of --suites: comma-separated names of SUITES, each known (none is dropped unsaid)."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    known = [suite.name for suite in SUITES]
    unknown = [name for name in names if name not in known]
    if not names or unknown:
        named = f"unknown suite {', '.join(map(repr, unknown))}; " if unknown else ""
        raise argparse.ArgumentTypeError(f"{text!r}: {named}must be a comma-separated list of {', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, required=True, help="where <target>-<suite>.json and the log go")
    parser.add_argument("--target", choices=("h100", "h200"), help="refuse to record unless the device is this one")
    parser.add_argument("--suites", type=suite_names, default=tuple(s.name for s in SUITES),
                        help="comma-separated, from " + ", ".join(s.name for s in SUITES) + " (default: all)")
    parser.add_argument("--timeout", type=float, default=540.0, help="seconds before unfinished shards are killed")
    args = parser.parse_args(argv)
    chosen = [s for s in SUITES if s.name in args.suites]
    target, device = _device_target(args.target)
    print(f"recording {', '.join(s.name for s in chosen)} on {device} as {target}", flush=True)
    started = time.monotonic()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        units = [(suite, files) for suite in chosen for files in shard(suite, workdir)]
        runs = _start(units, workdir)
        codes = _wait(runs, started + args.timeout)
        with (args.out_dir / f"record-{target}.log").open("w") as log:
            for (_, _, path), code in zip(runs, codes):
                log.write(path.read_text() + f"exit {code}\n")
        written, failed, unanswered = [], False, False
        for suite in chosen:
            mine = [(part, code) for (s, _), (_, part, _), code in zip(units, runs, codes) if s is suite]
            # 3: the shard was recorded, some of its probes failed (no answer for those entries)
            unanswered = unanswered or any(code == RECORDED_WITH_FAILED_PROBES for _, code in mine)
            if any(code not in (0, RECORDED_WITH_FAILED_PROBES) or not part.is_file() for part, code in mine):
                print(f"{suite.name}: a shard failed (exit codes {[c for _, c in mine]}); see record-{target}.log")
                failed = True
                continue
            parts = [json.loads(part.read_text()) for part, _ in mine]
            merged = merge_parts(parts, [Path(f).name for f in suite.files])
            path = write_snapshot(merged, args.out_dir / f"{target}-{suite.name}.json")
            written.append(path)
            rungs = sum(len(g["rungs"]) for g in merged.get("buckets", []))
            print(f"{path.name}: {summarize(merged)}, {rungs} rungs, {path.stat().st_size / 1e6:.2f} MB")
    if written:
        print(_answers_corpus(written))
    print(f"done in {time.monotonic() - started:.0f} s")
    return 1 if failed else RECORDED_WITH_FAILED_PROBES if unanswered else 0


if __name__ == "__main__":
    sys.exit(main())
