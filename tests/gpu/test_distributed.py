"""Shared warmup and agreement on two GPUs (two ranks under torchrun, two cache directories).

Needs two CUDA devices (the `nvidia-h200-x2` machine); launches
`torchrun --nproc_per_node 2 tests/gpu/distributed_rank.py configs/llama-3-8b.yaml DIR` with
NCCL_NVLS_ENABLE=0 (NVLink multicast stays off there) and reads each rank's result:
- the plan builds of all ranks add up to the distinct plans (each built once, not once per rank);
- each rank ends with every plan: the attention() steps afterwards build nothing, they load;
- both ranks hold identical decisions;
- a forced disagreement (rank 1 answering from an edited snapshot) is NONE on both, naming rank 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cudnn")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                       reason="needs two CUDA devices"),
]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "llama-3-8b.yaml"
SNAPSHOT = ROOT / "fusedattn_select" / "snapshots" / "h200-configs.json"  # rank 1 answers from an edited copy


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    base = tmp_path_factory.mktemp("distributed")
    env = {k: v for k, v in os.environ.items() if k not in ("FUSEDATTN_SELECT_SNAPSHOT", "FUSEDATTN_SELECT_CACHE")}
    env.update(NCCL_NVLS_ENABLE="0", CUDA_CACHE_DISABLE="1", FUSEDATTN_SELECT_FIRST_CALLS="wait",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "tests" / "gpu" / "distributed_rank.py"), str(CONFIG), str(base)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    errors = "\n".join(f"{p.name}:\n{p.read_text()}" for p in sorted(base.glob("rank*.error")))
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{errors or proc.stderr[-5000:]}"
    results = [json.loads((base / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        print(f"\nrank {r['rank']} ({r['device']}): {r['summary']}; step builds {r['step_builds']}, "
              f"loads {r['step_loads']}, errors {r['step_errors']}; plan bytes sent {r['plan_bytes_sent']}, received {r['plan_bytes_received']}")
    return results


def test_each_plan_is_built_once_across_the_ranks(ranks):
    expected = ranks[0]["expected_plans"]
    assert expected > 0
    assert sum(r["plans_built"] for r in ranks) == expected, ranks
    assert all(r["plans_built"] > 0 for r in ranks), "the work was split, not done by one rank"
    assert all(r["plans_stored_before"] == 0 for r in ranks), "the two cache directories started empty"


def test_every_rank_ends_with_every_plan_and_the_attention_steps_build_nothing(ranks):
    for r in ranks:
        assert not r["skipped"], r["skipped"]
        assert r["plans_received"] + r["plans_built"] == r["expected_plans"], r
        assert not r["step_errors"], r["step_errors"]
        assert r["step_builds"] == 0, r
        assert r["step_loads"] > 0


def test_both_ranks_hold_identical_decisions(ranks):
    assert ranks[0]["decisions"] == ranks[1]["decisions"]
    assert ranks[0]["agreed_after_warmup"] and ranks[1]["agreed_after_warmup"]
    assert sorted(ranks[0]["local_rows"] + ranks[1]["local_rows"]) == sorted(ranks[0]["decisions"])


def test_a_forced_disagreement_is_none_on_both_ranks_naming_the_rank(ranks):
    # Ranks are named with their platform, whatever GPUs the test runs on: rank 0 probes its own
    # device; rank 1 answers from the edited snapshot, so its platform is the recording device.
    recorded_on = json.loads(SNAPSHOT.read_text())["fingerprint"]["device_name"]
    for r in ranks:
        backend, message = r["forced"]
        assert backend == "NONE"
        assert f"rank 1 on {recorded_on} " in message and "rejected in the edited copy" in message
        assert f"rank 0 on {ranks[0]['device']} " in message and "[cudnn]: F16" in message
    assert ranks[0]["forced"] == ranks[1]["forced"]
    assert ranks[0]["forced_later"] == "NONE"  # the live rank's later select() returns the agreed NONE
