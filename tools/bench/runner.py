"""The parent side of a run: time left per section, cache folders, and one worker subprocess."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from tools.bench.common import ROOT, failed, first_line, is_ok, skipped
from tools.bench.options import RUN_ORDER, plan_for, section_deadlines


class Runner:
    """What the sections share in the parent: the plan, deadlines, output folder and notes."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.plan = plan_for(args.quick)
        if getattr(args, "dispatch_files", None):
            self.plan["dispatch_files"] = args.dispatch_files
        self.start = time.time()
        self.deadline = self.start + args.budget
        order = [s for s in RUN_ORDER if s in args.sections]
        self.deadlines = section_deadlines(self.start, args.budget, args.quick, order)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_path = self.out / "bench.log"
        self.log_path.write_text("")
        self.tmp = Path(tempfile.mkdtemp(prefix="fusedattn-bench-"))
        self.count = 0
        self.notes: list[str] = []

    def remaining(self, section: str) -> float:
        return min(self.deadlines.get(section, self.deadline), self.deadline + 15) - time.time()

    def cache_dir(self) -> str:
        path = Path(tempfile.mkdtemp(prefix="cache-", dir=self.tmp))
        os.chmod(path, 0o700)
        return str(path)

    def worker(self, name: str, wargs: Mapping, section: str, env: Mapping[str, str] | None = None,
               label: str = "") -> dict:
        """Run one worker subprocess; returns its result (with _wall_s) or {"status": "failed: ..."}."""
        self.count += 1
        tag = f"{self.count:02d}-{name}{('-' + label) if label else ''}"
        out_file = self.tmp / f"{tag}.json"
        limit = self.remaining(section) + 20
        if limit < 5:
            return {"status": skipped()}
        wargs = dict(wargs)
        wargs.setdefault("deadline", time.time() + max(1.0, limit - 25))
        cmd = [sys.executable, "-m", "tools.bench", "--worker", name,
               "--worker-args", json.dumps(wargs), "--worker-out", str(out_file)]
        penv = self._worker_env(env)
        started = time.perf_counter()
        timed_out = False
        worker_log = self.tmp / f"{tag}.log"
        with open(worker_log, "w") as log_file:
            try:
                proc = subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=penv,
                                      timeout=limit, cwd=str(ROOT))
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc, timed_out = None, True
        wall = time.perf_counter() - started
        try:
            text = worker_log.read_text(errors="replace")
        except OSError:
            text = ""
        with open(self.log_path, "a") as log:
            log.write(f"===== {tag} (rc {rc}, {wall:.1f} s) {json.dumps(dict(wargs))}\n{text}\n")
        result = _worker_result(out_file, wall, rc, timed_out, limit, text)
        print(f"  [{time.time() - self.start:6.1f} s] {tag}: {result.get('status')} ({wall:.1f} s)", flush=True)
        return result

    def worker_section(self, name: str, wargs: Mapping, section: str, notes: list[str]) -> dict:
        """A section one worker measures: its result, with the section's notes."""
        res = self.worker(name, wargs, section)
        res["notes"] = notes
        return res

    def _worker_env(self, env: Mapping[str, str | None] | None) -> dict[str, str]:
        """This process's environment for a worker: the checkout importable, the driver's JIT cache
        off, its own empty decision store, no snapshot; then `env` (None removes a variable)."""
        penv = dict(os.environ)
        penv["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), penv.get("PYTHONPATH", "")) if p)
        penv["CUDA_CACHE_DISABLE"] = "1"
        penv["FUSEDATTN_SELECT_CACHE_DIR"] = self.cache_dir()
        penv.pop("FUSEDATTN_SELECT_SNAPSHOT", None)
        for key, value in (env or {}).items():
            if value is None:
                penv.pop(key, None)
            else:
                penv[key] = value
        return penv


def _worker_result(out_file: Path, wall: float, rc: int | None, timed_out: bool, limit: float,
                   text: str) -> dict[str, Any]:
    """What a worker left in its result file, with its wall time and a status for how it ended."""
    result: dict = {}
    try:
        result = json.loads(out_file.read_text())
    except (OSError, ValueError):
        result = {}
    result["_wall_s"] = wall
    if timed_out:
        result["status"] = f"partial: timed out after {limit:.0f} s" if len(result) > 1 else \
            failed(f"timed out after {limit:.0f} s")
    elif rc != 0 and is_ok(result.get("status")):
        result["status"] = failed(f"worker exited with {rc}")
    elif rc != 0 and "status" not in result:
        last = [line for line in text.splitlines() if line.strip()]
        result["status"] = failed(f"worker exited with {rc}: {first_line(last[-1] if last else '')}")
    return result
