"""init_from_torchrun on ranks that each see one GPU (CUDA_VISIBLE_DEVICES set per rank, as srun
--gpus-per-task=1 or a per-rank launcher does): LOCAL_RANK is the rank's place on its node, not an
index among the devices it sees.

Two real processes with torchrun's variables (env://, a free local port) join over gloo; each
sees one GPU, so it runs on any machine with a CUDA device.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_USE_AGENT_STORE", "CUDA_VISIBLE_DEVICES")
RANK_SCRIPT = """
import json, os, sys
import torch
from fusedattn_select import distributed
try:
    joined = distributed.init_from_torchrun(timeout=30)
    result = {"joined": joined, "device": torch.cuda.current_device(), "count": torch.cuda.device_count()}
except Exception as err:
    result = {"error": f"{type(err).__name__}: {err}"}
print(json.dumps(result), flush=True)
os._exit(0)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ranks_that_each_see_one_gpu_join_and_use_it(tmp_path):
    # torch.cuda.set_device(LOCAL_RANK) raised "invalid device ordinal" on rank 1, after it had
    # joined the process group: the rank could not join, and the command line exited 1.
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env=dict(base, WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="0"))
             for rank in range(2)]
    try:
        results = [json.loads(proc.communicate(timeout=120)[0].strip().splitlines()[-1]) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert results == [{"joined": True, "device": 0, "count": 1}] * 2, results
