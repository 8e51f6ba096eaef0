"""`warmup` under torchrun where the ranks cannot finish together, each rank a fresh process with
torchrun's variables meeting at a free local port (env://, as torchrun without its agent):

- a replay (--target) whose ranks cannot compare their snapshots through torchrun's store: rank 1 with
  nobody at MASTER_ADDR:MASTER_PORT, and rank 0 hosting the store with rank 1 never arriving. Each says
  "could not compare" naming the address and the timeout, answers nothing and exits 1;
- a shared warmup (FUSEDATTN_SELECT_SNAPSHOT, gloo, no GPU) whose other rank ends before leaving: rank 0
  reports the answers the ranks agreed, says it "could not leave the job cleanly", and still ends with
  its answers' exit code (its process groups are destroyed either way).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from tests.cli.test_cli_warmup_torchrun import GPT2, H100, ROOT, TORCHRUN_VARIABLES, finish, free_port, start_rank

# Rank 1 of the shared warmup: the real command, except that where it would leave the job it ends at
# once (a rank killed after the warmup). Only rank 0, the command under test, leaves as shipped.
VANISHING_RANK = f"""
import os, sys
sys.path.insert(0, {str(ROOT)!r})
from fusedattn_select.cli import warmup_job
from fusedattn_select.cli.main import main
warmup_job.leave_job = lambda group, timeout: os._exit(0)
sys.exit(main(sys.argv[1:]))
"""


def rank_env(tmp_path: Path, rank: int, world: int, port: int, **env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    base.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port), FUSEDATTN_SELECT_CACHE_DIR=str(tmp_path / f"cache{rank}"), **env)
    return base


def test_a_replaying_rank_with_nobody_at_the_address_could_not_compare_and_exits_1(tmp_path):
    port = free_port()
    started = time.monotonic()
    [(code, out, err)] = finish([start_rank(tmp_path, 1, 2, port, [GPT2, "--target", "h100", "--timeout", "2"])])
    assert (code, out) == (1, ""), err
    assert time.monotonic() - started < 30
    assert err.startswith(f"error: warmup: rank 1 could not compare its snapshots with the other ranks' through "
                          f"torchrun's store at 127.0.0.1:{port} within 2 s: "), err
    assert len(err.splitlines()) == 1, err


def test_a_replaying_rank_0_whose_peer_never_arrives_could_not_compare_and_exits_1(tmp_path):
    port = free_port()
    [(code, out, err)] = finish([start_rank(tmp_path, 0, 2, port, [GPT2, "--target", "h100", "--timeout", "2"])])
    assert (code, out) == (1, ""), err
    # c10d's own C++ warnings about the timed-out socket may come first: our line is the last.
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == err.splitlines()[-1], err
    assert errors[0].startswith(f"error: warmup: rank 0 could not compare its snapshots with the other ranks' "
                                f"through torchrun's store at 127.0.0.1:{port} within 2 s: "), err
    assert "Traceback" not in err


def test_a_rank_whose_peer_ends_before_leaving_says_it_could_not_leave_cleanly(tmp_path):
    port = free_port()
    snapshot = {"FUSEDATTN_SELECT_SNAPSHOT": str(H100)}
    argv = [GPT2, "--json", "--timeout", "5", "--memory-ok"]
    rank0 = start_rank(tmp_path, 0, 2, port, argv, **snapshot)
    rank1 = subprocess.Popen([sys.executable, "-c", VANISHING_RANK, "warmup", *argv], cwd=ROOT,
                             env=rank_env(tmp_path, 1, 2, port, **snapshot),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (code0, out0, err0), (code1, _, err1) = finish([rank0, rank1])
    assert code1 == 0, err1
    report = json.loads(out0)  # rank 0 reports what the ranks agreed before rank 1 went
    assert {row["name"] for row in report["rows"]} >= {"gpt2/train-bf16"}
    assert report["agreement"]["disagreements"] == []
    left = [line for line in err0.splitlines() if "could not leave" in line]
    assert left and left[0].startswith("warning: warmup: rank 0 could not leave the job cleanly: "), err0
    assert "Traceback" not in err0 and "terminate called" not in err0
    assert code0 == 0, err0  # the answers' code: every gpt2 problem is F16 on the H100 recording
