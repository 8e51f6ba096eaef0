"""The worker process of dense_builds: `python -m fusedattn_select.runtime.dense_worker FD [DEVICE]` (with DEVICE it
`warm`s up first: dense_builds.prestart). Reads one JSON job per line on stdin (a dense build, "decide" or "ahead":
`_answer`, `_run_ahead`) and answers each job asked for with one JSON line, {"id", "result"} or {"id", "error"}, on the
pipe FD, where it also says what went wrong unasked, {"warning"}, for the caller to log; exits at the end of its
input, or when nobody reads its answers."""

from __future__ import annotations

import itertools
import json
import os
import queue
import sys
import threading
from typing import Any

from fusedattn_select.buckets import Bucket, larger_buckets
from fusedattn_select.config import AttnConfig
from fusedattn_select.planning.forms import PlanKind
from fusedattn_select.runtime.dense_builds import plan_phases
from fusedattn_select.selection.local_warmup import worker_selector
from fusedattn_select.selection.selector import set_default_selector

AHEAD = 3            # buckets built ahead per problem class: the next lengths up
AHEAD_MAX_TOKENS = 32768
ASKED, AHEAD_PRIORITY = 0, 1


def _store_plans(selector: Any, cfg: AttnConfig, backend: Any, return_lse: bool, device: int) -> str:
    """Build the plans of `cfg` selected for `backend` into the store; "" or why not (recorded)."""
    import torch

    from fusedattn_select.runtime import plans

    for plan_cfg, plan_backend, phase in plan_phases(cfg, backend, return_lse):
        try:
            plans.obtain_plan(plan_cfg, plan_backend, phase, torch.device("cuda", device), selector=selector)
        except plans.PlanBuildError as err:
            selector.record_build_failure(cfg, err.verdict)
            return err.verdict.reason()
    return ""


def build(config: dict, return_lse: bool, store_dir: str, device: int) -> str:
    """The dense answer of `config` (stored), then its plans (stored); "" or why not."""
    selector = worker_selector(store_dir, device)
    cfg = AttnConfig.from_dict(config)
    selection = selector.select_dense(cfg)
    if not selection.selected:
        return selection.message
    return _store_plans(selector, cfg, selection.backend, return_lse, device)


def decide(job: dict) -> tuple[str, tuple[AttnConfig, bool] | None]:
    """(the JSON answer of a decide job, (the bucketed problem it ran, return_lse) or None)."""
    import torch

    from fusedattn_select.runtime import entries
    from fusedattn_select.runtime.options import NO_INPUTS, CallOptions

    set_default_selector(worker_selector(job["store_dir"], job["device"]))
    fields = dict(job["options"], window_size=tuple(job["options"]["window_size"]))
    opts = CallOptions(**fields)
    device = torch.device("cuda", job["device"])
    q, k, v = (torch.empty_strided(shape, stride, dtype=getattr(torch, dtype), device=device)
               for shape, stride, dtype in job["tensors"])
    found = entries.new_entry(entries.key(q, k, v, opts, NO_INPUTS), q, k, v, NO_INPUTS, None)
    del q, k, v
    torch.cuda.empty_cache()  # the geometry's memory back to the device: this process lives as long as the caller
    runs = found.heads.entry if found.heads is not None else found
    forms = [runs.cfg.to_dict()] if runs.fused and runs.bucketed else []
    ahead = (runs.call_cfg, opts.return_lse) if forms else None
    return json.dumps({"reason": found.reason, "forms": forms}), ahead


def ahead_buckets(call_cfg: AttnConfig) -> list[Bucket]:
    """The buckets built ahead for `call_cfg`'s class: the next AHEAD lengths up, within AHEAD_MAX_TOKENS."""
    own = Bucket.of(call_cfg.batch_size, call_cfg.seqlen_q, call_cfg.seqlen_kv)
    return [b for b in larger_buckets(own, batch_doublings=0, length_doublings=AHEAD) if b.seqlen_kv <= AHEAD_MAX_TOKENS]


def build_ahead(call_cfg: AttnConfig, bucket: Bucket, return_lse: bool, store_dir: str, device: int) -> str:
    """Select and build the plans of `call_cfg`'s class at `bucket`, into the store; "" or why not."""
    selector = worker_selector(store_dir, device)
    cfg = call_cfg.replace(seqlen_q=bucket.seqlen_q, seqlen_kv=bucket.seqlen_kv)
    selection = selector.select_own(cfg)
    form = selector.bucket_for(cfg)
    if not selection.selected or form is None or selection.plan.kind is not PlanKind.BUCKET:
        return selection.message or f"runs {selection.plan_form} plans, not a bucket's"
    return _store_plans(selector, form, selection.backend, return_lse, device)


def _run_ahead(job: dict) -> dict | None:
    """Build one bucket ahead; the answer of a job the caller queued (it has an id), else None, or a warning
    where a job nobody waits for failed."""
    config = job["config"] if isinstance(job["config"], AttnConfig) else AttnConfig.from_dict(job["config"])
    bucket = job["bucket"] if isinstance(job["bucket"], Bucket) else Bucket(*job["bucket"])
    try:
        why = build_ahead(config, bucket, job["return_lse"], job["store_dir"], job["device"])
    except Exception as err:  # noqa: BLE001 - ahead of need: the caller builds it when it needs it
        if "id" not in job:
            return {"warning": f"building ahead failed ({type(err).__name__}: {err})"}
        return {"id": job["id"], "error": f"{type(err).__name__}: {err}"}
    return {"id": job["id"], "result": why} if "id" in job else None


def _answer(job: dict, jobs: queue.PriorityQueue, order: Any) -> dict:
    """Run one job asked for; queue its build-ahead work."""
    if job.get("kind") == "decide":
        result, ahead = decide(job)
        if ahead is not None:  # one job per bucket: a job asked for meanwhile waits for one build at most
            for bucket in ahead_buckets(ahead[0]):
                jobs.put((AHEAD_PRIORITY, next(order), {"kind": "ahead", "config": ahead[0], "bucket": bucket,
                                                       "return_lse": ahead[1], "store_dir": job["store_dir"],
                                                       "device": job["device"]}))
        return {"id": job["id"], "result": result}
    return {"id": job["id"], "result": build(job["config"], job["return_lse"], job["store_dir"], job["device"])}


def _read(jobs: queue.PriorityQueue, order: Any) -> None:
    try:
        for line in sys.stdin:
            job = json.loads(line)
            jobs.put((AHEAD_PRIORITY if job.get("kind") == "ahead" else ASKED, next(order), job))
    finally:  # end of input (the caller is done): after the jobs asked for, before any build ahead
        jobs.put((ASKED, next(order), None))


def warm(device: int) -> str:
    """Pay this process's one-time costs before its first job: torch, the runtime's modules, the CUDA context
    on `device`, cuDNN's engine libraries (a warm-up graph on an engine of its own; the first job's selector
    builds a small one again, libraries loaded). "" or why it failed (the jobs meet it again and report it)."""
    try:
        import torch

        from fusedattn_select.probing.choice import live_engine_on
        from fusedattn_select.runtime import entries, plans  # noqa: F401 - what the first job imports

        with torch.cuda.device(device):
            torch.empty(1, device="cuda")
            live_engine_on(device).warm_up()
    except Exception as err:  # noqa: BLE001 - the jobs meet it again and answer why
        return f"the worker's warm-up failed ({type(err).__name__}: {err})"
    return ""


def main() -> None:
    answers = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    jobs: queue.PriorityQueue = queue.PriorityQueue()
    order = itertools.count()
    threading.Thread(target=_read, args=(jobs, order), daemon=True).start()
    if len(sys.argv) > 2 and (why := warm(int(sys.argv[2]))):
        _write(answers, {"warning": why})
    while True:
        _, _, job = jobs.get()
        if job is None:
            return
        if job.get("kind") == "ahead":
            answer = _run_ahead(job)
            if answer is None:
                continue
        else:
            try:
                answer = _answer(job, jobs, order)
            except Exception as err:  # noqa: BLE001 - reported to the caller, who builds inline instead
                answer = {"id": job["id"], "error": f"{type(err).__name__}: {err}"}
        _write(answers, answer)


def _write(answers: Any, answer: dict) -> None:
    try:
        answers.write(json.dumps(answer) + "\n")
    except BrokenPipeError:  # the calling process exited while this job ran: nobody to answer
        os._exit(0)


def lowest_cpu_priority() -> None:
    """Run this process, and the threads it starts, at the lowest CPU priority (nice 19, whatever the
    caller's); why, and which calls wait on its jobs: docs/dispatch.md, 'First contact'."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    except (AttributeError, OSError):  # no priorities on this platform: builds at the caller's priority
        pass


if __name__ == "__main__":
    lowest_cpu_priority()
    main()
