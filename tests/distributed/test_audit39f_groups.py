"""The package's gloo groups inside a job that calls it in ways the training loop can: ranks at
different steps (one rank in agree() while another is in warmup(), or already leaving), and a job
that destroys its process group and makes a new one in the same processes.

Each test starts real processes (this file run as a script, one per rank, a file:// rendezvous) over
real torch.distributed gloo groups, answering from the bundled H100 recording, and reads what every
rank found.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import pytest

from tests.distributed import rank_processes

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "fusedattn_select" / "snapshots" / "h100-configs.json"
GPT2 = ROOT / "configs" / "gpt2.yaml"
LIMIT_S = 90


def run_ranks(tmp_path: Path, scenario: str, world: int = 2) -> list[dict]:
    """Run `scenario` on `world` gloo ranks; every rank's result, in rank order."""
    return rank_processes.run_ranks(lambda rank: [__file__, scenario, str(rank), str(world), str(tmp_path)],
                                    tmp_path, world, LIMIT_S)


def test_ranks_in_different_calls_raise_the_same_distributed_error_naming_each_rank_s_step(tmp_path):
    # Rank 0 in agree(), rank 1 in warmup(), both at depth full: each read the other's statement as
    # its own and raised AttributeError ('_Start' object has no attribute 'strict').
    results = run_ranks(tmp_path, "different_calls")
    for r in results:
        assert r["type"] == "DistributedError", r
        assert "ranks reached different steps" in r["error"], r
        assert "rank 0 at agreement" in r["error"] and "rank 1 at warmup start" in r["error"], r


def test_a_rank_that_leaves_while_the_others_warm_is_named_by_them(tmp_path):
    # Rank 1 stops before warming (as a rank whose store cannot keep answers does) and leaves; rank
    # 0's warmup said only that gloo's connection was reset by its peer.
    results = run_ranks(tmp_path, "one_leaves")
    assert results[0]["type"] == "DistributedError" and results[0]["step"] == "warmup start", results[0]
    assert "rank 1 at leave" in results[0]["error"] and "rank 0 at warmup start" in results[0]["error"], results[0]
    assert results[1]["type"] == "DistributedError" and results[1]["step"] == "leave", results[1]
    assert "ranks reached different steps" in results[1]["error"], results[1]


def test_agreement_works_again_after_the_job_makes_its_process_group_anew(tmp_path):
    # The package kept the gloo group of the destroyed process group and gave it to the new one:
    # ValueError "Process group ... is not initialized in the world group map" on every later call.
    results = run_ranks(tmp_path, "group_made_anew")
    for r in results:
        assert r["attempts"] == ["5 agreed", "5 agreed", "5 agreed"], r


# ----- one rank (run as a script) ------------------------------------------------------------------
def _problems():
    from fusedattn_select.config_files import load_config_file

    return load_config_file(GPT2)


def _init(rank: int, world: int, out: Path, name: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{out / name}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))


def _scenario_different_calls(rank: int, world: int, out: Path) -> dict:
    from fusedattn_select import distributed

    _init(rank, world, out, "init")
    call = distributed.agree if rank == 0 else distributed.warmup
    try:
        call(_problems(), depth="full", timeout=20)
        return {"type": None}
    except Exception as err:  # noqa: BLE001 - the error each rank raises is the result
        return {"type": type(err).__name__, "error": str(err)}


def _scenario_one_leaves(rank: int, world: int, out: Path) -> dict:
    from fusedattn_select import distributed
    from fusedattn_select.distributed import group

    _init(rank, world, out, "init")
    try:
        if rank == 1:
            group.leave(20)
        else:
            distributed.warmup(_problems(), timeout=20)
        return {"type": None}
    except distributed.DistributedError as err:
        return {"type": type(err).__name__, "step": err.step, "error": str(err)}


def _scenario_group_made_anew(rank: int, world: int, out: Path) -> dict:
    import torch.distributed as dist

    from fusedattn_select import distributed

    attempts = []
    for attempt in range(3):
        _init(rank, world, out, f"init{attempt}")
        try:
            report = distributed.agree(_problems(), timeout=20)
            attempts.append(f"{len(report.selections) - len(report.disagreements)} agreed")
        except Exception as err:  # noqa: BLE001 - the error is the result
            attempts.append(f"{type(err).__name__}: {err}")
        dist.barrier()
        dist.destroy_process_group()
    return {"attempts": attempts}


def _main() -> None:
    scenario, rank, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    from fusedattn_select.probing.snapshot import SnapshotEngine
    from fusedattn_select.selection.selector import Selector, set_default_selector

    set_default_selector(Selector(SnapshotEngine.load(H100), store=None))
    result = globals()[f"_scenario_{scenario}"](rank, world, out)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    # gloo's threads can abort interpreter teardown; the result is written, so leave without it.
    os._exit(0)


if __name__ == "__main__":
    _main()
else:
    pytest.importorskip("torch.distributed")
