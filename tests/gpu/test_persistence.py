"""Persisted decisions and execution plans across processes, on a real GPU.

(a) A process started over a cache warmed by `fusedattn-select warmup configs/llama-3-8b.yaml`
    answers every entry without a probe and runs attention() forward + backward on a training
    entry without building a plan (it deserializes them), bit-exact with a process that built its
    plans cold; the two processes' start-up times are printed.
(b) Eight processes warming the same configs into one empty store at once: no errors, a sound
    database, each graph probed once and each plan built once in total.
(c) warmup on 4 threads against 1 thread (fresh processes, empty stores): the speed-up is printed;
    only identical verdicts are asserted.

Every process here is a fresh interpreter (subprocess) with its own FUSEDATTN_SELECT_CACHE_DIR, so
nothing is shared through this test process's memory. Timed processes run with the driver's JIT
cache disabled (CUDA_CACHE_DISABLE=1), so "cold" means cold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gpu_setup import GPU_MARKS, torch

pytestmark = GPU_MARKS

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "llama-3-8b.yaml"
STEP_ENTRY = "llama-3-8b/train-bf16-deterministic"  # deterministic backward: bit-exact across processes
RANKS = 8
TIMEOUT_S = 300

WORKER = textwrap.dedent(r'''
    import json, os, sys, time
    started = time.perf_counter()
    mode, config_path = sys.argv[1], sys.argv[2]
    import fusedattn_select as fas
    from fusedattn_select.config_files import load_config_file
    from fusedattn_select.selection.selector import default_selector

    config_file = load_config_file(config_path)
    entries = [(f"{config_file.name}/{e.name}", e.config) for e in config_file.entries]
    result = {}

    if mode == "warmup":
        from fusedattn_select.plan_store.calls import dispatch_config
        from fusedattn_select.selection.rules import apply_rules
        from fusedattn_select.selection.local_warmup import warmup

        selector = default_selector()  # cuDNN initialised before the start signal (its warm-up graph: at the first probe)
        ready, go = os.environ.get("FAS_READY_FILE"), os.environ.get("FAS_GO_FILE")
        if go:
            open(ready, "w").close()
            deadline = time.time() + 240
            while not os.path.exists(go):
                if time.time() > deadline:
                    raise SystemExit("no start signal")
                time.sleep(0.005)
        jobs = int(os.environ.get("FAS_JOBS", "0")) or None
        report = warmup(entries, jobs=jobs, depth="full", selector=selector,
                        workers=os.environ.get("FAS_WORKERS", "threads"))
        distinct = {}
        for _, cfg in entries:
            distinct.setdefault(cfg.cache_key(), cfg)
        fingerprint = selector.fingerprint
        expected_probes = sum(
            0 if any(apply_rules(cfg, fingerprint, p) for p in cfg.phases) else len(cfg.phases)
            for cfg in distinct.values())
        accepted = {row.cache_key for row in report.rows if row.backend.value != "NONE"}
        expected_plans = sum(len(cfg.phases) for key, cfg in distinct.items()
                             if key in accepted and dispatch_config(cfg) is not None)
        info = selector.cache_info()
        result.update(
            probes=info["probes"], probe_failures=info["probe_failures"], persistent_hits=info["persistent_hits"],
            expected_probes=expected_probes, plans_built=report.totals["plans_built"],
            plans_stored=report.totals["plans_stored"], expected_plans=expected_plans,
            wall_seconds=report.wall_seconds, jobs=report.jobs, failed=report.totals["failed"],
            verdicts={row.name: [row.backend.value, row.outcome.value] for row in report.rows},
            plan_notes={row.name: row.plan_note for row in report.rows if row.plan_note},
            torch_imported="torch" in sys.modules,
            entries=info["entries"], distinct=len(distinct),
        )
    elif mode == "step":
        import torch
        from fusedattn_select.runtime.api import attention, dispatch_info

        device = os.environ.get("FAS_DEVICE", "cuda")
        selector = default_selector()
        selections = {name: fas.select(cfg).backend.value for name, cfg in entries}
        cfg = dict(entries)[os.environ["FAS_STEP_ENTRY"]]
        gen = torch.Generator(device=device).manual_seed(1234)

        def make(heads, seqlen, dim):
            shape = (cfg.batch_size, seqlen, heads, dim)  # bshd, as the entry's layout
            t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
            return t.to(torch.bfloat16).requires_grad_(True)

        q = make(cfg.num_heads_q, cfg.seqlen_q, cfg.head_dim_qk)
        k = make(cfg.num_heads_kv, cfg.seqlen_kv, cfg.head_dim_qk)
        v = make(cfg.num_heads_kv, cfg.seqlen_kv, cfg.resolved_head_dim_v)
        out = attention(q, k, v, mask=cfg.mask, deterministic=cfg.deterministic)
        grad = torch.randn(out.shape, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        torch.save({"out": out.detach().cpu(), "dq": dq.cpu(), "dk": dk.cpu(), "dv": dv.cpu()},
                   os.environ["FAS_OUT_FILE"])
        info, cache = dispatch_info(), selector.cache_info()
        result.update(
            seconds=seconds, probes=cache["probes"], persistent_hits=cache["persistent_hits"],
            plan_builds=info.get("plan_builds"), plan_build_ms=info.get("plan_build_ms"),
            plan_loads=info.get("plan_loads"), plan_load_ms=info.get("plan_load_ms"),
            plan_load_failures=info.get("plan_load_failures"), fused_calls=info["fused_calls"],
            fallback_calls=info["fallback_calls"], selections=selections,
        )
    print("FAS_RESULT " + json.dumps(result))
''')


def _env(cache_dir: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FUSEDATTN_SELECT_SNAPSHOT", "FUSEDATTN_SELECT_CACHE")}
    env["FUSEDATTN_SELECT_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["CUDA_CACHE_DISABLE"] = "1"
    env.update(extra)
    return env


def _result(stdout: str, stderr: str, returncode: int) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("FAS_RESULT ")]
    assert returncode == 0 and lines, f"worker failed (rc {returncode}):\n{stderr[-4000:]}\n{stdout[-2000:]}"
    return json.loads(lines[-1][len("FAS_RESULT "):])


def _worker(mode: str, cache_dir: Path, **extra: str) -> tuple[dict, float]:
    """Run WORKER in a fresh interpreter; (its result, the process's wall seconds)."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", WORKER, mode, str(CONFIG)], cwd=ROOT, env=_env(cache_dir, **extra),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    wall = time.perf_counter() - started
    return _result(proc.stdout, proc.stderr, proc.returncode), wall


# ----- (a) a second process over a warmed cache -------------------------------------------------
def test_a_process_over_a_warmed_cache_probes_nothing_and_loads_its_plans_bit_exact(tmp_path):
    cold, cold_wall = _worker("step", tmp_path / "cold", FAS_STEP_ENTRY=STEP_ENTRY,
                              FAS_OUT_FILE=str(tmp_path / "cold.pt"))

    warm_dir = tmp_path / "warm"
    started = time.perf_counter()
    cli = subprocess.run([sys.executable, "-m", "fusedattn_select.cli", "warmup", str(CONFIG), "--json"], cwd=ROOT,
                         env=_env(warm_dir), capture_output=True, text=True, timeout=TIMEOUT_S)
    warmup_wall = time.perf_counter() - started
    assert cli.returncode in (0, 1), cli.stderr[-4000:]  # 1: some entry has no fused backend
    report = json.loads(cli.stdout)
    assert report["totals"]["failed"] == 0, report
    assert report["totals"]["plans_built"] >= 2, report

    warm, warm_wall = _worker("step", warm_dir, FAS_STEP_ENTRY=STEP_ENTRY, FAS_OUT_FILE=str(tmp_path / "warm.pt"))

    print(f"\n(a) warmup CLI: {report['totals']['plans_built']} plans built and stored, "
          f"{report['totals']['accepted']} accepted / {report['totals']['rejected']} rejected, "
          f"{report['wall_seconds']:.2f} s in warmup() ({warmup_wall:.2f} s process)")
    for label, r, wall in (("cold", cold, cold_wall), ("warm", warm, warm_wall)):
        print(f"(a) {label} start: select {len(r['selections'])} entries + one fwd+bwd step "
              f"({STEP_ENTRY}): {r['seconds']:.3f} s in-process, {wall:.3f} s process wall; "
              f"probes {r['probes']}, plan builds {r['plan_builds']} ({r['plan_build_ms']} ms), "
              f"plan loads {r['plan_loads']} ({r['plan_load_ms']} ms)")
    print(f"(a) cold/warm start: {cold['seconds'] / warm['seconds']:.2f}x in-process, "
          f"{cold_wall / warm_wall:.2f}x process wall")

    assert warm["selections"] == cold["selections"]
    assert warm["selections"][STEP_ENTRY] == "F16"
    assert cold["probes"] > 0 and cold["plan_builds"] == 2 and cold["plan_loads"] == 0
    assert warm["probes"] == 0, warm
    assert warm["plan_builds"] == 0 and warm["plan_loads"] == 2 and warm["plan_load_failures"] == 0, warm
    assert warm["fused_calls"] == cold["fused_calls"] == 1 and warm["fallback_calls"] == 0

    cold_tensors, warm_tensors = torch.load(tmp_path / "cold.pt"), torch.load(tmp_path / "warm.pt")
    for name in ("out", "dq", "dk", "dv"):
        assert torch.equal(cold_tensors[name], warm_tensors[name]), f"{name} differs between cold and loaded plans"
        assert torch.isfinite(warm_tensors[name].float()).all()


# ----- (b) eight processes warming one store at once ---------------------------------------------
def test_eight_processes_warming_one_empty_store_probe_and_build_each_graph_once(tmp_path):
    from fusedattn_select.store import PersistentStore

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    go = tmp_path / "go"
    procs = []
    for rank in range(RANKS):
        env = _env(shared, FAS_READY_FILE=str(tmp_path / f"ready-{rank}"), FAS_GO_FILE=str(go))
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, "warmup", str(CONFIG)], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 240
    while sum((tmp_path / f"ready-{r}").exists() for r in range(RANKS)) < RANKS:
        if time.time() > deadline or any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    started = time.perf_counter()
    go.touch()
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
        results.append(_result(stdout, stderr, proc.returncode))
    wall = time.perf_counter() - started

    expected_probes = results[0]["expected_probes"]
    expected_plans = results[0]["expected_plans"]
    probes = [r["probes"] for r in results]
    builds = [r["plans_built"] for r in results]
    print(f"\n(b) {RANKS} processes, one store, {wall:.2f} s after the start signal: probes per process {probes} "
          f"(total {sum(probes)}, distinct keys x graphs {expected_probes}); plan builds per process {builds} "
          f"(total {sum(builds)}, distinct plans {expected_plans})")
    assert all(r["failed"] == 0 and r["probe_failures"] == 0 for r in results), results
    assert all(r["expected_probes"] == expected_probes and r["expected_plans"] == expected_plans for r in results)
    assert all(r["verdicts"] == results[0]["verdicts"] for r in results)
    assert sum(probes) == expected_probes
    assert sum(builds) == expected_plans
    assert all(r["plans_built"] + r["plans_stored"] == expected_plans for r in results)

    store = PersistentStore(shared)
    assert store.integrity_check() == ["ok"]
    info = store.info()
    assert info["plans"] == expected_plans
    print(f"(b) store: {info['entries']} decisions, {info['plans']} plans, {info['bytes']} bytes")


# ----- (c) warmup threads ----------------------------------------------------------------------
def test_warmup_on_four_threads_against_one(tmp_path):
    one, one_wall = _worker("warmup", tmp_path / "one", FAS_JOBS="1")
    four, four_wall = _worker("warmup", tmp_path / "four", FAS_JOBS="4")
    print(f"\n(c) warmup of {CONFIG.name} (depth full, {one['plans_built']} plans): 1 thread "
          f"{one['wall_seconds']:.2f} s, 4 threads {four['wall_seconds']:.2f} s: "
          f"{one['wall_seconds'] / four['wall_seconds']:.2f}x (process wall {one_wall:.2f} s vs {four_wall:.2f} s); "
          f"torch imported by warmup: {one['torch_imported']}")
    assert one["jobs"] == 1 and four["jobs"] == 4
    assert one["verdicts"] == four["verdicts"]
    assert one["failed"] == four["failed"] == 0


def test_warmup_in_four_worker_processes_against_four_threads(tmp_path):
    threads, _ = _worker("warmup", tmp_path / "threads", FAS_JOBS="4")
    processes, _ = _worker("warmup", tmp_path / "processes", FAS_JOBS="4", FAS_WORKERS="processes")
    print(f"\n(d) warmup of {CONFIG.name} (depth full) on 4 threads {threads['wall_seconds']:.2f} s, "
          f"in 4 worker processes {processes['wall_seconds']:.2f} s: "
          f"{threads['wall_seconds'] / processes['wall_seconds']:.2f}x")
    assert processes["verdicts"] == threads["verdicts"]
    assert processes["failed"] == 0
    assert processes["probes"] == 0  # the workers probed; the caller read every answer from the store
    assert processes["entries"] == processes["distinct"]
    assert processes["plans_built"] == threads["plans_built"]
