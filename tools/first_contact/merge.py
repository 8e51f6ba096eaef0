"""One result document from runs of the first-contact bench that each measured some of its parts,
on one machine with one tree (one command may run at most 10 minutes on the lent GPU, less than
the whole bench with the compiled module still to build):

    python -m tools.first_contact.merge -o tools/results/first-contact-h100.json a.json b.json c.json

A part measured by more than one run is taken from the last, except row 2's models: a run's models
replace those of the same name and keep the others (`model_runs`), and a run that measured none of
them leaves row 2 as it was. The runs must name one device and one
set of versions; each run's command, commit, date, parts, processes per side and wall time stay in
`merged_from` (a merged document brings its own list), `part_runs` names the run each part comes
from, and the verdicts are worked out again from the merged parts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from tools.bench.common import clean_json
from tools.bench_first_contact import TOP_LEVEL, _heading, write
from tools.first_contact import parts, targets


RUN_FIELDS = ("command", "git_commit", "date", "parts_selected", "processes_per_side", "wall_s", "budget_s")


def _run(document: dict[str, Any]) -> dict[str, Any]:
    return {key: document.get(key) for key in RUN_FIELDS}


def _sources(document: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, int]:
    """For a document without `part_runs`: each of its parts' run, the last of `runs` that selected it."""
    found = {part: index for index, run in enumerate(runs) for part in run.get("parts_selected") or []}
    return {part: found.get(part, len(runs) - 1) for part in document.get("parts") or {}}


def _models_merged(before: dict[str, Any] | None, found: dict[str, Any], offset: int, run: int) -> dict[str, Any]:
    """Row 2's part: a run's models replace those of the same name (`--models` measures some), the
    others stay; `model_runs` names the run each model comes from (a merged document's own are moved
    by `offset`, the runs listed before its own; a run's models come from its run `run`)."""
    models = found.get("models") if isinstance(found.get("models"), dict) else {}
    own = {name: offset + index for name, index in (found.get("model_runs") or {}).items()}
    model_runs = {name: own.get(name, offset + run) for name in models}
    if not before or not isinstance(before.get("models"), dict):
        return dict(found, model_runs=model_runs)
    models = {**before["models"], **models}
    model_runs = {**before.get("model_runs", {}), **model_runs}
    return dict(found, models=models, model_runs=model_runs, status=parts.overall_status(models))


def merge(documents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The merged document; ValueError naming the field where two runs differ in device or versions."""
    if not documents:
        raise ValueError("no run to merge")
    first = documents[0]
    for other in documents[1:]:
        for key in TOP_LEVEL:
            if key not in ("nvidia_smi", "host") and other.get(key) != first.get(key):
                raise ValueError(f"{key}: {first.get(key)!r} in one run, {other.get(key)!r} in another")
    merged: dict[str, Any] = {key: value for key, value in first.items()
                              if key not in ("command", "parts", "parts_selected", "targets", "table", "wall_s")}
    merged["parts"], runs, part_runs = {}, [], {}
    for document in documents:
        # A merged document brings its own runs, so the record keeps every run however often it is merged.
        earlier = document.get("merged_from") or [_run(document)]
        sources = document.get("part_runs") or _sources(document, earlier)
        for part, found in (document.get("parts") or {}).items():
            if part == "generate" and part in merged["parts"] and not found.get("models"):
                continue  # a run that measured none of row 2's models (skipped, failed) leaves the earlier ones
            merged["parts"][part] = _models_merged(merged["parts"].get(part), found, len(runs), sources[part]) \
                if part == "generate" else found
            part_runs[part] = len(runs) + sources[part]
        runs.extend(earlier)
    merged["merged_from"], merged["part_runs"] = runs, part_runs
    merged["command"] = " && ".join(str(document.get("command")) for document in documents)
    merged["git_commit"] = "+".join(dict.fromkeys(str(document.get("git_commit")) for document in documents))
    merged["date"] = documents[-1].get("date")
    merged["wall_s"] = sum(float(document.get("wall_s") or 0) for document in documents)
    merged["parts_selected"] = list(merged["parts"])
    verdicts = targets.evaluate(merged)
    merged["targets"] = [v.as_json() for v in verdicts]
    merged["table"] = targets.render(verdicts, _heading(merged) + f" (merged from {len(runs)} runs)")
    return clean_json(merged)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.first_contact.merge", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True, help="write the merged document here")
    parser.add_argument("runs", nargs="+", help="the runs' JSON documents, in the order they ran")
    args = parser.parse_args(argv)
    try:
        documents = []
        for path in args.runs:
            with open(path) as handle:
                documents.append(json.load(handle))
        merged = merge(documents)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write(merged, args.output)
    print(merged["table"], end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
