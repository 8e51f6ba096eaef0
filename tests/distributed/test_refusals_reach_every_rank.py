"""distributed.warmup and distributed.agree where one rank refuses before the first exchange (a bad
argument, or a bad FUSEDATTN_SELECT_* setting its default selector reads) or fails there with an error not
of this library (its default selector cannot be made): that rank raises its own error, and every other rank raises a DistributedError naming that rank AND the error, at once,
instead of giving up after the timeout on a rank gone missing.

Real ranks on CPU (gloo, a file:// rendezvous), one fresh interpreter each, answering from the bundled
H100 recording.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed import rank_processes

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[2]
WORLD, REFUSING, TIMEOUT_S = 3, 2, 30

RANK = f"""
import datetime, json, os, sys, time
sys.path.insert(0, {str(ROOT)!r})
import torch.distributed as dist
from fusedattn_select import distributed, load_config_file
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.selector import Selector

call, rank, world, init, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
refusing = rank == {REFUSING}
crash = call.endswith("-crash")
call = call.removesuffix("-crash")
if refusing and call == "agree" and not crash:  # the default selector reads this setting: a bad one on this rank only
    os.environ["FUSEDATTN_SELECT_SNAPSHOT"] = "/nowhere/h100.json"
if refusing and crash:  # making the default selector fails with an error not of this library (as CUDA's init can)
    import fusedattn_select.selection.selector as selector_module
    def failing():
        raise RuntimeError("CUDA error: no CUDA-capable device is detected")
    selector_module.selector_for = failing
selector = None if refusing and (call == "agree" or crash) else Selector(
    SnapshotEngine.load({str(ROOT / "fusedattn_select" / "snapshots" / "h100-configs.json")!r}))
suite = load_config_file({str(ROOT / "configs" / "gpt2.yaml")!r})
started = time.monotonic()
try:
    if call == "warmup":
        distributed.warmup(suite, depth="fast", selector=selector, jobs=0 if refusing and not crash else None,
                           timeout={TIMEOUT_S})
    else:
        distributed.agree(suite, selector=selector, timeout={TIMEOUT_S})
    found = {{"raised": None}}
except Exception as err:
    found = {{"raised": type(err).__name__, "error": str(err), "step": getattr(err, "step", None),
              "failed_ranks": [f.rank for f in getattr(err, "failures", ())]}}
found["seconds"] = time.monotonic() - started
with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
    json.dump(found, f)
os._exit(0)  # gloo's threads may abort the interpreter's teardown
"""


@pytest.mark.parametrize("call, step, refusal", [
    ("warmup", "warmup start", "ConfigError: jobs=0: must be a positive integer"),
    ("agree", "agreement", "ConfigError: FUSEDATTN_SELECT_SNAPSHOT='/nowhere/h100.json': must name existing"),
    ("warmup-crash", "warmup start", "RuntimeError: CUDA error: no CUDA-capable device is detected"),
    ("agree-crash", "agreement", "RuntimeError: CUDA error: no CUDA-capable device is detected"),
])
def test_a_rank_that_refuses_before_the_first_exchange_is_named_with_its_reason_by_every_rank(
        tmp_path, call, step, refusal):
    init = tmp_path / "init"
    results = rank_processes.run_ranks(
        lambda rank: ["-c", RANK, call, str(rank), str(WORLD), str(init), str(tmp_path)], tmp_path, WORLD, 90)
    mine = results[REFUSING]
    assert f"{mine['raised']}: {mine['error']}".startswith(refusal), mine  # this rank raises its own error
    for rank, found in enumerate(results):
        if rank == REFUSING:
            continue
        assert (found["raised"], found["step"], found["failed_ranks"]) == ("DistributedError", step, [REFUSING]), found
        assert f"failed on rank {REFUSING}: rank {REFUSING} (" in found["error"], found
        assert refusal in found["error"], found  # why, not only who
    assert max(found["seconds"] for found in results) < TIMEOUT_S / 2, json.dumps(results)  # told, not timed out
