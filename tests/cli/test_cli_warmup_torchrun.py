"""`warmup` as the ranks of a torchrun job: each rank a fresh process with torchrun's variables, the
ranks meeting at a free local port (env://, as torchrun without its agent), answering from recorded
snapshots (FUSEDATTN_SELECT_SNAPSHOT: a shared warmup over gloo without a GPU)."""

from __future__ import annotations

import json
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


def edited_snapshot(tmp_path: Path, entry_name: str = "train-bf16") -> Path:
    """The H100 recording with gpt2/`entry_name`'s forward verdict turned into a rejection: a rank
    whose platform rejects a problem the others accept."""
    data = json.loads(H100.read_text())
    entry = next(e for e in data["entries"] if e["suite"] == "gpt2.yaml" and e["name"] == entry_name)
    forward = next(v for v in entry["verdicts"] if v["phase"] == "forward")
    forward.update(outcome="unsupported", stage="check_support", message="rejected in the edited copy")
    path = tmp_path / "h100-configs-edited.json"
    path.write_text(json.dumps(data))
    return path


def test_a_shared_warmup_exits_with_its_answers_code_on_every_rank_every_time(tmp_path):
    # gloo's threads aborted the interpreter's exit on one rank in about half the runs (exit 134).
    for run in range(4):
        port = free_port()
        results = finish([start_rank(tmp_path / str(run), rank, 2, port, [GPT2, "--timeout", "20"],
                                     FUSEDATTN_SELECT_SNAPSHOT=str(H100)) for rank in (0, 1)])
        assert [code for code, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
        assert "5 accepted, 0 rejected" in results[0][1] and results[1][1] == ""


def test_a_shared_warmup_reports_and_exits_with_what_the_ranks_agreed(tmp_path):
    edited, port = edited_snapshot(tmp_path), free_port()
    results = finish([start_rank(tmp_path, rank, 2, port, [GPT2, "--json", "--timeout", "20"],
                                 FUSEDATTN_SELECT_SNAPSHOT=str(snapshot))
                      for rank, snapshot in ((0, H100), (1, edited))])
    # Rank 0's own snapshot says F16, rank 1's NONE: agreement pins NONE on both, so both exit 1.
    assert [code for code, _, _ in results] == [1, 1], [err[-2000:] for _, _, err in results]
    document = json.loads(results[0][1])
    row = next(r for r in document["rows"] if r["name"] == "gpt2/train-bf16")
    assert (row["backend"], row["outcome"]) == ("NONE", "rejected") and row["reason"].startswith("ranks disagree")
    assert document["agreement"]["selections"]["gpt2/train-bf16"] == "NONE"
    assert [d["name"] for d in document["agreement"]["disagreements"]] == ["gpt2/train-bf16"]
    stderr = results[0][2] + results[1][2]
    assert stderr.count("ranks disagree: rank 0 on") == 1, stderr  # said once, by the lowest rank


def test_ranks_replaying_different_snapshots_stop_before_answering_naming_the_ranks(tmp_path):
    edited, port = edited_snapshot(tmp_path), free_port()
    results = finish([start_rank(tmp_path, 0, 2, port, [GPT2, "--snapshot", str(H100), "--timeout", "20"]),
                      start_rank(tmp_path, 1, 2, port, [GPT2, "--snapshot", str(edited), "--timeout", "20"])])
    assert [(code, out) for code, out, _ in results] == [(2, ""), (2, "")], [err for _, _, err in results]
    assert results[0][2] == ("error: warmup: ranks replay different snapshots or problems, so their answers could "
                             f"differ: rank 0: h100-configs.json (digest {results[0][2].split('digest ')[1][:12]}); "
                             f"rank 1: h100-configs-edited.json (digest {results[0][2].split('digest ')[2][:12]})\n")
    assert results[1][2] == ""  # said once, by rank 0

