"""Distributed warmup wall time: 1 rank against 2 ranks (one store, and two stores), same model file.

    python -m tools.bench_distributed [--config configs/llama-3-8b.yaml] [--depth full] [--repeats 2]

Each measurement is a fresh `torchrun --standalone --nproc_per_node N` job over empty cache
directories (CUDA_CACHE_DISABLE=1: cold kernels), one GPU per rank. The time is the
fusedattn_select.distributed.warmup call, from a barrier after every rank's cuDNN engine is up to
the last rank's return (process start and cuDNN initialisation are excluded; they are paid once
per process whatever the warmup does). "2 ranks, 2 stores" gives each rank its own cache
directory, as two nodes have: plans then travel between the ranks. Writes JSON and markdown to
--out (default tools/results) and, when $OUT is set, there too. Needs as many GPUs as ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = (("1 rank", 1, "shared"), ("2 ranks, 1 store", 2, "shared"), ("2 ranks, 2 stores", 2, "separate"))
TARGET_RATIO = 0.6


def worker(config: str, base: str, stores: str, depth: str) -> None:
    """One rank: warm `config` and write base/rank<RANK>.json."""
    import torch.distributed as dist

    from fusedattn_select import distributed
    from fusedattn_select.config_files import load_config_file
    from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine
    from fusedattn_select.selection.selector import Selector, set_default_selector
    from fusedattn_select.store import PersistentStore

    several = distributed.init_from_torchrun()
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    store_dir = Path(base) / (f"node{rank}" if stores == "separate" else "node")
    selector = Selector(CudnnEngine(local_rank), store=PersistentStore(store_dir))
    set_default_selector(selector)
    named = [(e.name, e.config) for e in load_config_file(config).entries]
    if several:
        dist.barrier()
    started = time.perf_counter()
    report = distributed.warmup(named, depth=depth)
    seconds = time.perf_counter() - started
    result = {"rank": rank, "seconds": seconds, "plans_built": report.local.totals["plans_built"],
              "plans_received": report.received.plans, "plan_bytes_received": report.received.plan_bytes,
              "probes": selector.cache_info()["probes"], "problems": len(report.local.rows)}
    Path(base, f"rank{rank}.json").write_text(json.dumps(result))
    if several:
        dist.destroy_process_group()


def measure(config: Path, ranks: int, stores: str, depth: str) -> dict:
    base = Path(tempfile.mkdtemp(prefix="fas-bench-dist-"))
    env = {k: v for k, v in os.environ.items() if k not in ("FUSEDATTN_SELECT_SNAPSHOT", "FUSEDATTN_SELECT_CACHE")}
    env.update(NCCL_NVLS_ENABLE="0", CUDA_CACHE_DISABLE="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(ranks), "-m", "tools.bench_distributed", "--worker", str(config), str(base), stores,
                           depth], cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    job_s = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"torchrun failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    rows = [json.loads((base / f"rank{r}.json").read_text()) for r in range(ranks)]
    shutil.rmtree(base, ignore_errors=True)
    return {"seconds": max(r["seconds"] for r in rows), "job_seconds": job_s, "ranks": rows}


def environment() -> dict:
    import torch

    info = {"torch": torch.__version__, "gpus": torch.cuda.device_count(),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"}
    try:
        import cudnn

        info.update(cudnn_frontend=cudnn.__version__, cudnn_backend=cudnn.backend_version())
    except ImportError as err:
        info["cudnn"] = f"unavailable ({err})"
    return info


def markdown(document: dict) -> str:
    env, base = document["environment"], document["settings"][0]["median_seconds"]
    lines = [f"# Distributed warmup: {Path(document['config']).name}, depth {document['depth']}", "",
             f"{env['device']} x{env['gpus']}, torch {env['torch']}, cudnn-frontend {env.get('cudnn_frontend')}, "
             f"cuDNN {env.get('cudnn_backend')}; {document['repeats']} fresh jobs per row (median); cold kernels; "
             "time of the warmup call (max over ranks), process start and cuDNN init excluded.", "",
             "| setting | warmup s (median) | runs | x 1 rank | plans built per rank | plans received per rank "
             "| MB received per rank | job wall s |", "|---|---|---|---|---|---|---|---|"]
    for s in document["settings"]:
        last = s["runs"][-1]["ranks"]
        received_mb = ", ".join(f"{r['plan_bytes_received'] / 1e6:.2f}" for r in last)
        lines.append(
            f"| {s['name']} | {s['median_seconds']:.2f} | {', '.join(f'{r:.2f}' for r in s['seconds'])} | "
            f"{s['median_seconds'] / base:.2f} | {', '.join(str(r['plans_built']) for r in last)} | "
            f"{', '.join(str(r['plans_received']) for r in last)} | "
            f"{received_mb} | "
            f"{statistics.median(r['job_seconds'] for r in s['runs']):.1f} |")
    lines += ["", f"Target: 2 ranks <= {TARGET_RATIO}x one rank's time."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, metavar=("CONFIG", "BASE", "STORES", "DEPTH"), help=argparse.SUPPRESS)
    parser.add_argument("--config", default=str(ROOT / "configs" / "llama-3-8b.yaml"))
    parser.add_argument("--depth", default="full", choices=("fast", "full"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "tools" / "results"))
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    settings = []
    for name, ranks, stores in SETTINGS:
        runs = [measure(Path(args.config), ranks, stores, args.depth) for _ in range(args.repeats)]
        seconds = [r["seconds"] for r in runs]
        settings.append({"name": name, "ranks": ranks, "stores": stores, "seconds": seconds,
                         "median_seconds": statistics.median(seconds), "runs": runs})
        print(f"{name}: {', '.join(f'{s:.2f}' for s in seconds)} s", flush=True)
    document = {"config": args.config, "depth": args.depth, "repeats": args.repeats,
                "environment": environment(), "settings": settings}
    slug = document["environment"]["device"].replace("NVIDIA ", "").replace(" ", "-").lower()
    text = markdown(document)
    print(text)
    for folder in filter(None, (args.out, os.environ.get("OUT"))):
        Path(folder).mkdir(parents=True, exist_ok=True)
        Path(folder, f"bench-distributed-{slug}.json").write_text(json.dumps(document, indent=1))
        Path(folder, f"bench-distributed-{slug}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
