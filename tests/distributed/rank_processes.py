"""Run a script as real ranks: one process per rank, each writing rank<N>.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_ranks(argv_of: Callable[[int], list[str]], out: Path, world: int, limit_s: float) -> list[dict]:
    """`python *argv_of(rank)` for every rank (the script first); each rank's `out`/rank<N>.json, in rank order."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, *argv_of(rank)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(world)]
    try:
        for proc in procs:
            _, stderr = proc.communicate(timeout=limit_s)
            assert proc.returncode == 0, f"a rank exited with {proc.returncode}:\n{stderr[-3000:]}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]
