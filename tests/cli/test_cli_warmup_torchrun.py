"""`warmup` as the ranks of a torchrun job: each rank a fresh process with torchrun's variables, the
ranks meeting at a free local port (env://, as torchrun without its agent), answering from recorded
snapshots (FUSEDATTN_SELECT_SNAPSHOT: a shared warmup over gloo without a GPU)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "fusedattn_select" / "snapshots"
H100 = SNAPSHOTS / "h100-configs.json"
GPT2 = str(ROOT / "configs" / "gpt2.yaml")
TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_USE_AGENT_STORE", "FUSEDATTN_SELECT_SNAPSHOT")
LIMIT_S = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_rank(tmp_path: Path, rank: int, world: int, port: int, argv: list[str], **env: str) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    base.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port), FUSEDATTN_SELECT_CACHE_DIR=str(tmp_path / f"cache{rank}"), **env)
    return subprocess.Popen([sys.executable, "-m", "fusedattn_select.cli", "warmup", *argv], cwd=ROOT, env=base,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each rank, in rank order."""
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=LIMIT_S)
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return results


def test_a_rank_that_cannot_reach_rank_0_exits_1_after_its_timeout(tmp_path):
    started = time.monotonic()
    [(code, out, err)] = finish([start_rank(tmp_path, 1, 2, free_port(), [GPT2, "--timeout", "2"],
                                            FUSEDATTN_SELECT_SNAPSHOT=str(H100))])
    assert (code, out) == (1, ""), err
    assert time.monotonic() - started < 20
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: warmup: rank 1 of WORLD_SIZE=2 could not join the job's process group, so "
                          "nothing was warmed: DistributedError: distributed join: rank 1 could not reach rank 0 at "
                          "MASTER_ADDR:MASTER_PORT=127.0.0.1:"), err
    assert "within 2 s" in err
