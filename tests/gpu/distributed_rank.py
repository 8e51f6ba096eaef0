"""One rank of the 2-GPU job of tests/gpu/test_distributed.py (run under torchrun).

    torchrun --nproc_per_node 2 tests/gpu/distributed_rank.py CONFIG.yaml BASE_DIR

Each rank uses GPU LOCAL_RANK and its own cache directory BASE_DIR/node<RANK> (two "nodes"), warms
CONFIG at depth full with fusedattn_select.distributed.warmup over an NCCL default group (the
package exchanges over its own gloo group), runs one attention() step per dispatchable problem
with the plans it now holds, then agrees once more with rank 1 answering from an edited copy of the
H200 snapshot (a forced disagreement). Writes BASE_DIR/rank<RANK>.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from fusedattn_select import distributed
from fusedattn_select.config_files import load_config_file
from fusedattn_select.plan_store.calls import dispatch_config
from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.selector import Selector, set_default_selector
from fusedattn_select.store import PersistentStore

ROOT = Path(__file__).resolve().parents[2]
STEP_ENTRIES = ("train-bf16", "train-bf16-sbhd", "prefill", "decode")  # dense calls attention() expresses
EDITED_ENTRY = "train-bf16"


def edited_h200_snapshot(base: Path) -> Path:
    """The H200 recording with EDITED_ENTRY's forward verdict turned into a rejection (a test fixture)."""
    data = json.loads((ROOT / "fusedattn_select" / "snapshots" / "h200-configs.json").read_text())
    entry = next(e for e in data["entries"] if e["suite"] == "llama-3-8b.yaml" and e["name"] == EDITED_ENTRY)
    next(v for v in entry["verdicts"] if v["phase"] == "forward").update(
        outcome="unsupported", stage="check_support", message="rejected in the edited copy")
    path = base / "h200-configs-edited.json"
    path.write_text(json.dumps(data))
    return path


def step(cfg, layout: str) -> None:
    """One attention() call (forward, and backward when training) at exactly the problem's shape."""
    from fusedattn_select.runtime.api import attention
    from tools.bench.tensors import qkv  # random q, k, v in `layout`'s dim order

    q, k, v = qkv(torch, cfg, layout, requires_grad=cfg.is_training)
    with torch.set_grad_enabled(cfg.is_training):
        out = attention(q, k, v, layout=layout, mask=cfg.mask, deterministic=cfg.deterministic)
        if cfg.is_training:
            out.float().sum().backward()
    torch.cuda.synchronize()


def main() -> None:
    config_path, base = sys.argv[1], Path(sys.argv[2])
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "NVLink multicast must stay off on this machine"
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    selector = Selector(CudnnEngine(local_rank), store=PersistentStore(base / f"node{rank}"))
    set_default_selector(selector)
    config_file = load_config_file(config_path)
    named = [(e.name, e.config) for e in config_file.entries]

    started = time.perf_counter()
    report = distributed.warmup(named, depth="full", timeout=300)
    warm_s = time.perf_counter() - started
    probes_after_warmup = selector.cache_info()["probes"]
    decisions = {n: [s.backend.value, s.message] for n, s in ((n, selector.select(c, "full")) for n, c in named)}

    from fusedattn_select.runtime.plans import plan_stats

    before = plan_stats()
    layouts = {"bshd_bshd_bshd": "bshd", "sbhd_sbhd_sbhd": "sbhd"}
    stepped = [n for n, c in named if n in STEP_ENTRIES]
    step_errors = {}
    for name in stepped:
        cfg = dict(named)[name]
        try:
            step(cfg, layouts[cfg.qkv_layout])
        except Exception as err:  # reported, so that the other checks still run
            step_errors[name] = f"{type(err).__name__}: {err}"
    after = plan_stats()
    expected_plans = sum(len(c.phases) for n, c in named if decisions[n][0] != "NONE"
                         and dispatch_config(c) is not None)

    # Forced disagreement: rank 1 answers from an edited snapshot, rank 0 from live cuDNN.
    agree_selector = selector
    if rank == 1:
        agree_selector = Selector(SnapshotEngine.load(edited_h200_snapshot(base)))
    agreement = distributed.agree(named, selector=agree_selector, depth="full")
    result = {
        "rank": rank, "device": torch.cuda.get_device_name(local_rank), "warm_s": warm_s,
        "plans_built": report.local.totals["plans_built"], "plans_stored_before": report.local.totals["plans_stored"],
        "plans_received": report.received.plans, "plans_present": report.received.plans_present,
        "plan_bytes_received": report.received.plan_bytes, "plan_bytes_sent": report.plan_bytes_sent,
        "skipped": list(report.received.skipped), "expected_plans": expected_plans,
        "probes": probes_after_warmup, "decisions": decisions, "stepped": stepped,
        "step_errors": step_errors, "step_builds": after["builds"] - before["builds"], "step_loads": after["loads"] - before["loads"],
        "local_rows": [r.name for r in report.local.rows], "agreed_after_warmup": report.agreement.agreed,
        "forced": [agreement.selections[EDITED_ENTRY].backend.value, agreement.selections[EDITED_ENTRY].message],
        "forced_later": selector.select(dict(named)[EDITED_ENTRY]).backend.value,
        "summary": report.summary(),
    }
    (base / f"rank{rank}.json").write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        # torchrun's own output is dominated by nanobind's exit-time leak report: keep the traceback apart.
        import traceback

        Path(sys.argv[2], f"rank{os.environ.get('RANK', '?')}.error").write_text(traceback.format_exc())
        raise
