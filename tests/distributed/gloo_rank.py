"""One rank of a CPU (gloo) job for tests/distributed/test_distributed_gloo.py.

    python gloo_rank.py SCENARIO RANK WORLD INIT_FILE OUT_DIR SPEC_JSON

Answers come from recorded snapshots (SnapshotEngine), never from a GPU. Each rank writes what it
found to OUT_DIR/rank<RANK>.json, including a DistributedError it raised (the error is the result
several scenarios test).
"""

from __future__ import annotations

import datetime
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import torch.distributed as dist

from fusedattn_select import distributed
from fusedattn_select.distributed import group, work
from fusedattn_select.config_files import load_config_file
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.selector import Selector, set_default_selector
from fusedattn_select.store import PersistentStore, database

HELD: list = []  # connections holding a store's write lock until the rank exits


class RaisingSnapshotEngine(SnapshotEngine):
    """TEST DOUBLE for a rank whose selection breaks: a snapshot engine that raises on one problem."""

    fail_key = ""

    def probe(self, cfg, backend, phase, depth):
        if cfg.cache_key() == self.fail_key:
            raise RuntimeError("injected failure while probing")
        return super().probe(cfg, backend, phase, depth)


def problems(spec: dict, rank: int = 0) -> list:
    """The named problems of spec "configs", or of this rank's list in "configs_by_rank" (cycled)."""
    by_rank = spec.get("configs_by_rank")
    out = []
    for path in by_rank[rank % len(by_rank)] if by_rank else spec["configs"]:
        config_file = load_config_file(path)
        out += [(f"{config_file.name}/{e.name}", e.config) for e in config_file.entries]
    return out


def selector_for(spec: dict, rank: int) -> Selector:
    snapshot = spec["snapshots"][rank % len(spec["snapshots"])]
    if spec.get("fail_rank") == rank:
        engine = RaisingSnapshotEngine.load(snapshot)
        engine.fail_key = dict(problems(spec))[spec["fail_problem"]].cache_key()
    else:
        engine = SnapshotEngine.load(snapshot)
    stores = spec.get("stores")
    if spec.get("locked_rank") == rank:  # hold_write_lock's store gives up at once (before it opens)
        database.BUSY_TIMEOUT_S, database.LOCKED_RETRY_S = 0.02, 0.05
    store = PersistentStore(stores[rank % len(stores)]) if stores else None
    selector = Selector(engine, store=store)
    set_default_selector(selector)
    return selector


def per_rank(spec: dict, rank: int) -> dict:
    """The keyword arguments this rank passes where ranks are called differently (spec "per_rank":
    argument name -> one value per rank, cycled)."""
    return {name: values[rank % len(values)] for name, values in spec.get("per_rank", {}).items()}


def scenario_agree(spec: dict, rank: int) -> dict:
    selector = selector_for(spec, rank)
    named = problems(spec, rank)
    report = distributed.agree(named, **{"strict": spec.get("strict", False), **per_rank(spec, rank)},
                               timeout=spec.get("timeout", 30))
    later = {name: selector.select(cfg) for name, cfg in named}
    return {
        "selections": {n: [s.backend.value, s.message] for n, s in report.selections.items()},
        "later": {n: [s.backend.value, s.message] for n, s in later.items()},
        "disagreements": [[d.name, d.message] for d in report.disagreements],
        "platforms": [[list(p.ranks), p.description] for p in report.platforms],
        "mixed_platforms": report.mixed_platforms,
        "probes": selector.cache_info()["probes"],
    }


def scenario_absent(spec: dict, rank: int) -> dict:
    """Rank 1 never takes part; the others must give up after `timeout` instead of hanging."""
    selector_for(spec, rank)
    if rank == 1:
        time.sleep(spec["timeout"] + 1.5)
        return {"skipped": True}
    started = time.perf_counter()
    try:
        distributed.agree(problems(spec), timeout=spec["timeout"])
    finally:
        print(f"rank {rank} waited {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return {}


def scenario_lowest_stuck(spec: dict, rank: int) -> dict:
    """Rank 0 takes part in the first exchange, then is stuck (alive) longer than `timeout` before the
    second; the others must give up after `timeout`, not after the job's group's own timeout."""
    selector_for(spec, rank)
    named = problems(spec)
    distributed.agree(named, timeout=spec["timeout"])
    if rank == 0:
        time.sleep(spec["stuck"])
        return {"stuck": True}
    started = time.perf_counter()
    try:
        distributed.agree(named, timeout=spec["timeout"])
    except distributed.DistributedError as err:
        return {"error": str(err), "waited": time.perf_counter() - started}
    return {"waited": time.perf_counter() - started}


def hold_write_lock(spec: dict, rank: int, selector: Selector) -> None:
    """On spec "locked_rank": another connection holds this rank's store's write lock (as a stuck
    process would) so that its saves fail (selector_for shortened the store's patience)."""
    if spec.get("locked_rank") != rank:
        return
    other = sqlite3.connect(selector.store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    HELD.append(other)


def scenario_leave_late(spec: dict, rank: int) -> dict:
    """Both ranks agree; then rank 1 stays away from leave() longer than `timeout`: rank 0's leave() must
    raise after `timeout` and still destroy its process groups."""
    selector_for(spec, rank)
    distributed.agree(problems(spec), timeout=spec["timeout"])
    if rank == 1:
        time.sleep(spec["timeout"] + 3)
        return {"late": True}
    started = time.perf_counter()
    try:
        group.leave(spec["timeout"])
        error = None
    except distributed.DistributedError as err:
        error = {"error": str(err), "step": err.step}
    return {"raised": error, "waited": time.perf_counter() - started, "initialized": dist.is_initialized()}


def scenario_warmup(spec: dict, rank: int) -> dict:
    if spec.get("other_costs_rank") == rank:  # TEST DOUBLE for a rank running another version's cost rule
        work._cost = lambda cfg, depth, cost=work._cost: cost(cfg, depth) + 1
    selector = selector_for(spec, rank)
    hold_write_lock(spec, rank, selector)
    named = problems(spec, rank)
    report = distributed.warmup(named, **{"depth": "full", **per_rank(spec, rank)}, timeout=spec.get("timeout", 30))
    probes_after_warmup = selector.cache_info()["probes"]
    later = {name: selector.select(cfg, "full") for name, cfg in named}
    info = selector.cache_info()
    return {
        "probes": probes_after_warmup,
        "probes_after_select": info["probes"],
        "later": {n: [s.backend.value, s.message, s.from_cache] for n, s in later.items()},
        "local_rows": [row.cache_key for row in report.local.rows],
        "combined_rows": [[row.name, row.backend.value, row.outcome.value] for row in report.combined.rows],
        "owners": report.owners,
        "decisions_received": report.received.decisions,
        "skipped": list(report.received.skipped),
        "agreed": report.agreement.agreed,
        "disagreements": [[d.name, d.message] for d in report.agreement.disagreements],
        "stored": stored_outcomes(spec, rank, selector, named),
        "failed_saves": [report.combined.failed_saves, report.combined.store_path, str(selector.store.path)
                         if selector.store is not None else ""],
    }


def stored_outcomes(spec: dict, rank: int, selector: Selector, named: list) -> dict:
    """Each problem's stored outcome per pass, read by a fresh open of this rank's store (None: not stored)."""
    if not spec.get("stores"):
        return {}
    store = PersistentStore(spec["stores"][rank % len(spec["stores"])])
    entries = {name: store.get(selector.fingerprint, cfg.cache_key()) for name, cfg in named}
    return {name: [v.outcome.value for v in entry[0]] if entry else None for name, entry in entries.items()}


def main() -> None:
    scenario, rank, world, init_file, out_dir, spec_json = sys.argv[1:7]
    rank, world = int(rank), int(world)
    spec = json.loads(spec_json)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        result = globals()[f"scenario_{scenario}"](spec, rank)
    except distributed.DistributedError as err:
        result = {"error": str(err), "step": err.step, "failed_ranks": [f.rank for f in err.failures]}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    if scenario not in ("absent", "lowest_stuck", "leave_late"):
        dist.barrier()  # no rank tears gloo down while another still uses it
        dist.destroy_process_group()
    # gloo's threads can abort interpreter teardown ("terminate called without an active
    # exception"); the result is written, so leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
