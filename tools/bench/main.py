"""The run: parent (every selected section, then bench.json and bench.md) or one worker."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
import traceback
from typing import Any, Sequence

from tools.bench.common import RESULT_STATUS_OK, SCHEMA, Partial, clean_json, error_status, failed, log, skipped
from tools.bench.document import render_markdown, write_outputs
from tools.bench.environment import meta, utc_now
from tools.bench.options import RUN_ORDER, SECTION_TITLES, SECTIONS, parse_args
from tools.bench.runner import Runner
from tools.bench.sections import RUNS, WORKERS


def run_worker_main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    res = Partial(args.worker_out)
    try:
        WORKERS[args.worker](json.loads(args.worker_args), res)
        res.setdefault("status", RESULT_STATUS_OK)
        code = 0
    except BaseException as err:  # noqa: BLE001 -- reported to the parent through the result file
        res["status"] = error_status(err)
        res["traceback"] = traceback.format_exc()[-3000:]
        log(traceback.format_exc())
        code = 1
    res.save()
    return code


def _meta(runner: Runner) -> dict[str, Any]:
    try:
        out = meta(runner)
    except Exception as err:  # noqa: BLE001
        out = {"device": "n/a", "env_status": failed(err)}
    out.setdefault("date_utc", utc_now())
    out.setdefault("mode", runner.plan["mode"])
    for key in ("torch", "cudnn_backend", "cudnn_frontend", "driver"):
        out.setdefault(key, "n/a")
    print("versions: " + "; ".join(f"{k} {out.get(k)}" for k in (
        "device", "gpu", "driver", "cudnn_backend", "cudnn_frontend", "torch", "library")), flush=True)
    return out


def run(runner: Runner) -> dict:
    """Every selected section in RUN_ORDER (a failing one records its failure); the document."""
    args = runner.args
    print(f"fusedattn-select bench: {runner.plan['mode']} mode, budget {args.budget:.0f} s, "
          f"sections {', '.join(args.sections)}, out {runner.out}", flush=True)
    doc_meta = _meta(runner)
    sections: dict[str, Any] = {}
    for name in RUN_ORDER:
        if name not in args.sections:
            sections[name] = {"status": skipped("not selected (--sections)")}
            continue
        print(f"== {SECTION_TITLES[name]}", flush=True)
        try:
            result = RUNS[name](runner)
        except Exception as err:  # noqa: BLE001 -- a section never aborts the run
            result = {"status": error_status(err), "traceback": traceback.format_exc()}
        result.setdefault("status", RESULT_STATUS_OK)
        result.pop("_wall_s", None)
        sections[name] = result
    doc = {
        "schema": SCHEMA,
        "meta": doc_meta,
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in runner.plan.items()},
        "sections": {name: sections.get(name, {"status": skipped("not run")}) for name in SECTIONS},
        "notes": runner.notes + [
            "Workers run with CUDA_CACHE_DISABLE=1 (unless a run says otherwise) and their own "
            "FUSEDATTN_SELECT_CACHE_DIR; their output is in bench.log.",
        ],
        "wall_seconds": time.time() - runner.start,
    }
    shutil.rmtree(runner.tmp, ignore_errors=True)
    return clean_json(doc)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        print(render_markdown(json.loads(args.render.read_text())), end="")
        return 0
    if args.worker:
        return run_worker_main(args)
    runner = Runner(args)
    doc = run(runner)
    json_path, md_path = write_outputs(doc, runner.out)
    print("", flush=True)
    print(md_path.read_text(), flush=True)
    print(f"wrote {json_path} and {md_path}", flush=True)
    return 0
