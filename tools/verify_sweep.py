"""Sweep probe depth verify against depth full on this GPU: per problem, the time of each and whether
a supported answer's outputs or gradients miss the float32 reference.

    python -m tools.verify_sweep                        # probes/hopper-suite.yaml and configs/*.yaml
    python -m tools.verify_sweep --max-seconds 540 --resume   # go on where the last run stopped

Each distinct problem (by cache key) is asked at depth full and then at depth verify, each time by
a fresh selector with a memory store (nothing cached between problems or depths; the engine, its
handle and the driver's JIT cache are shared, as in one process). The result is written after every
problem to tools/results/verify-sweep-<device>.json (and to $OUT when it is set), so a run stopped
by a time limit keeps what it measured; --resume skips the problems that file holds. Exit status 0
when no supported answer misses the reference, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SUITES = [ROOT / "probes" / "hopper-suite.yaml", *sorted((ROOT / "configs").glob("*.yaml"))]


def device_tag(device_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100': the GPU's model as result file names write it."""
    found = re.search(r"\b(GB\d{3}|[ABHLV]\d{2,3})\b", device_name.upper())
    return found.group(1).lower() if found else "gpu"


def _problems(paths: list[Path]) -> list[tuple[str, str, Any]]:
    """(suite, name, config) of every distinct problem of the files, first occurrence kept."""
    from fusedattn_select.config_files import load_config_file

    seen: set[str] = set()
    problems = []
    for path in paths:
        loaded = load_config_file(path)
        for entry in loaded.entries:
            key = entry.config.cache_key()
            if key not in seen:
                seen.add(key)
                problems.append((loaded.name, entry.name, entry.config))
    return problems


def _answer(selection: Any) -> str:
    if selection.selected:
        return selection.backend.value
    outcomes = {v.outcome.value for v in selection.verdicts}
    return "NONE" if "unsupported" in outcomes else "failed" if "failed" in outcomes else "no data"


def _ask(engine: Any, cfg: Any, depth: str) -> dict[str, Any]:
    """One fresh selector's answer at `depth`: answer, wall ms, and what verify found."""
    from fusedattn_select.selection.selector import Selector
    from fusedattn_select.store.memory import MemoryStore

    selector = Selector(engine, store=MemoryStore())
    started = time.perf_counter()
    selection = selector.select(cfg, depth)
    row = {"answer": _answer(selection), "ms": round((time.perf_counter() - started) * 1e3, 2),
           "plan_form": selection.plan_form, "message": selection.message}
    if depth == "verify":
        row["verified"] = selection.selected and all(v.verified for v in selection.verdicts)
        row["numerics_rejected"] = any(v.stage == "numerics" and v.outcome.value == "unsupported"
                                       for v in selection.verdicts)
        row["details"] = [f"{v.phase.value}: {v.detail}" for v in selection.verdicts]
    return row


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    both = [r for r in rows if r["full"]["answer"] != "failed" and r["verify"]["answer"] != "failed"]
    ratios = [r["verify"]["ms"] / r["full"]["ms"] for r in both if r["full"]["ms"] > 0]
    supported_full = [r for r in rows if r["full"]["answer"] in ("F16", "FP8")]
    missed = [r for r in supported_full if r["verify"]["numerics_rejected"]]
    return {
        "problems": len(rows),
        "supported_at_full": len(supported_full),
        "verified": sum(r["verify"]["verified"] for r in rows),
        "supported_not_checked": sum(r["verify"]["answer"] in ("F16", "FP8") and not r["verify"]["verified"]
                                     for r in rows),
        "supported_missing_the_reference": len(missed),
        "missing": [f"{r['suite']}:{r['name']}: {r['verify']['message']}" for r in missed],
        "failed_at_verify": sum(r["verify"]["answer"] == "failed" for r in rows),
        "median_full_ms": round(statistics.median(r["full"]["ms"] for r in rows), 2) if rows else None,
        "median_verify_ms": round(statistics.median(r["verify"]["ms"] for r in rows), 2) if rows else None,
        "median_verify_over_full": round(statistics.median(ratios), 3) if ratios else None,
    }


def _environment(engine: Any) -> dict[str, Any]:
    import torch

    return {"fingerprint": engine.fingerprint().to_dict(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(engine.device), "engine_init_ms": round(engine.init_ms, 1)}


def _write(document: dict[str, Any], path: Path) -> None:
    document["summary"] = _summary(document["rows"])
    text = json.dumps(document, indent=1) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    out = os.environ.get("OUT")
    if out:
        Path(out, path.name).write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suites", nargs="*", type=Path, default=DEFAULT_SUITES, help="config files (default: "
                        "probes/hopper-suite.yaml and configs/*.yaml)")
    parser.add_argument("-o", "--output", type=Path,
                        help="result file (default tools/results/verify-sweep-<device>.json)")
    parser.add_argument("--resume", action="store_true", help="keep the rows the result file holds; ask the rest")
    parser.add_argument("--max-seconds", type=float, default=0.0,
                        help="stop (result written) after this long; 0: never")
    parser.add_argument("--limit", type=int, default=0, help="ask at most this many problems; 0: all")
    args = parser.parse_args(argv)

    from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine

    started = time.perf_counter()
    engine = CudnnEngine()
    environment = _environment(engine)
    print(json.dumps(environment), flush=True)
    path = args.output or ROOT / "tools" / "results" / f"verify-sweep-{device_tag(environment['device'])}.json"
    document: dict[str, Any] = {"tool": "tools/verify_sweep.py", "environment": environment, "rows": []}
    if args.resume and path.exists():
        document["rows"] = json.loads(path.read_text())["rows"]
    done = {row["key"] for row in document["rows"]}
    todo = [p for p in _problems(args.suites) if p[2].cache_key() not in done]
    if args.limit:
        todo = todo[:args.limit]
    document["complete"] = False
    for index, (suite, name, cfg) in enumerate(todo):
        if args.max_seconds and time.perf_counter() - started > args.max_seconds:
            print(f"stopped after {index} problems (--max-seconds); --resume goes on", flush=True)
            break
        row = {"suite": suite, "name": name, "key": cfg.cache_key(), "full": _ask(engine, cfg, "full"),
               "verify": _ask(engine, cfg, "verify"),
               "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        document["rows"].append(row)
        print(f"{suite}:{name}: full {row['full']['answer']} {row['full']['ms']} ms, verify "
              f"{row['verify']['answer']} {row['verify']['ms']} ms", flush=True)
        _write(document, path)
    else:
        document["complete"] = not args.limit
    _write(document, path)
    summary = document["summary"]
    print(json.dumps(summary, indent=1))
    return 1 if summary["supported_missing_the_reference"] else 0


if __name__ == "__main__":
    sys.exit(main())
