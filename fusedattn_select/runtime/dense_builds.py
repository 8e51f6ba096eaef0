"""Where a steady shape's own (dense) plans are built: in a worker process, so the caller never waits.

When a shape is promoted, why a worker process builds, and FUSEDATTN_SELECT_DENSE_BUILDS: see
docs/shape-buckets.md, 'Repeated shapes get their own plans, without a stall'.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from typing import Callable

from fusedattn_select import settings
from fusedattn_select.config import AttnConfig
from fusedattn_select.layouts import dense_strides
from fusedattn_select.probing.frontend import INSTALL_CUDA
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store.store_settings import cache_switched_off, default_cache_dir
from fusedattn_select.store.sqlite import DATABASE_NAME
from fusedattn_select.selection.plan_warmup import plan_target
from fusedattn_select.types import Backend, Phase, ProbeDepth
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.run_settings import run_settings

log = logging.getLogger("fusedattn_select")

MODES = settings.DENSE_BUILD_MODES
PROCESS, INLINE = MODES


def plan_phases(cfg: AttnConfig, backend: Backend, return_lse: bool,
                backward_cfg: AttnConfig | None = None) -> list[tuple[AttnConfig, Backend, Phase]]:
    """The (config, backend, phase) of each plan attention() runs for `cfg` selected for `backend`:
    the forward (the training forward when an inference call wants the log-sum-exp: it writes the
    softmax stats), and the backward when training (F16 from `backward_cfg` when FP8 training runs
    its backward in the input precision)."""
    forward_cfg = cfg.replace(is_training=True) if return_lse and not cfg.is_training else cfg
    wanted = [(forward_cfg, backend, Phase.FORWARD)]
    if cfg.is_training:
        wanted.append((backward_cfg, Backend.F16, Phase.BACKWARD) if backward_cfg is not None
                      else (cfg, backend, Phase.BACKWARD))
    return wanted


def in_background(selector: Selector) -> tuple[str, int] | None:
    """(store directory, device ordinal) a worker hands plans over with, or None: build inline (the
    mode says so, or this selector has no persistent store or no live cuDNN engine)."""
    if run_settings.get().dense_builds != PROCESS:
        return None
    target, _ = plan_target(selector, ProbeDepth.FULL)
    if target is None:
        return None
    return str(target.store.directory), int(target.builder.device)


def ask(selector: Selector, cfg: AttnConfig, return_lse: bool) -> Future | None:
    """The worker's job building `cfg`'s own plans into the store, or None: build them inline (see
    `in_background`; or the worker cannot start, or died at startup twice in this process)."""
    return _ask({"config": cfg.to_dict(), "return_lse": return_lse}, in_background(selector),
                "for dense plans (%s: %s); building them inline")


def _ask(job: dict, where: tuple[str, int] | None, failed: str) -> Future | None:
    """`job` submitted to the worker with the store and device `where`; None (logged with `failed`)
    where there is no worker."""
    if where is None or dispatcher.worker_deaths >= MAX_DEATHS:
        return None
    try:
        return _submit(dict(job, store_dir=where[0], device=where[1]))
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        log.warning("fusedattn_select: no worker process " + failed, type(err).__name__, err)
        return None


def fresh_store_target(device: int) -> tuple[str, int] | None:
    """(the default store directory, device) where a worker can decide before this process makes
    its selector (which imports cuDNN and opens the store, holding the GIL from the caller's calls:
    docs/performance.md, first contact): plans go to a worker, the store is persistent and holds no file
    yet, or the running worker was started ahead for it (its build-ahead jobs may have filled it since).
    None otherwise: the caller reads the store first."""
    if run_settings.get().dense_builds != PROCESS or cache_switched_off() or os.environ.get(settings.SNAPSHOT):
        return None  # (an invalid value of either is reported where the selector is made)
    directory = default_cache_dir()
    where = (str(directory), device)
    worker = dispatcher.worker
    if worker is not None and worker.ahead_for == where and worker.running_here():
        return where
    return None if (directory / DATABASE_NAME).exists() else where


def ask_decide(selector: Selector | None, signature: tuple, where: tuple[str, int] | None = None) -> Future | None:
    """The worker's job deciding a call signature (an entries.key without optional tensors) as
    attention() would, with everything it selects and builds stored, then building the next buckets
    of its problem class ahead; None where there is no worker (see `ask`). `where` (store directory,
    device) stands for `selector`'s. Its result is a JSON text: {"reason": why it falls back or "",
    "forms": [bucket forms it selected, as dicts]}."""
    where = where or (in_background(selector) if selector is not None else None)
    if where is None:  # no worker: nothing to describe the signature to
        return None
    opts = signature[0]
    # Compact strides of the call's dim order (tiers.dummies): the worker allocates what it decides
    # on, and a slice of a long cache would cost it the cache's whole span; what the caller's own
    # strides decide is decided again in the calling process (tiers.for_callers_geometry).
    tensors = [[list(signature[i + 2]), list(dense_strides(signature[i + 2], signature[i + 3])),
                str(signature[i + 1]).rsplit(".", 1)[-1]] for i in (1, 5, 9)]
    return _ask({"kind": "decide", "options": dataclasses.asdict(opts), "tensors": tensors}, where,
                "to prepare plans (%s: %s); building them here")


def cudnn_missing() -> str:
    """Why this process can run no cuDNN graph ("" when it can): its cuDNN frontend is not installed.
    Checked once (a frontend installed later in the process is not seen) and said once, as a warning."""
    why = dispatcher.no_cudnn
    if why is not None:
        return why
    try:
        found = importlib.util.find_spec("cudnn") is not None
    except ValueError:  # a module put in sys.modules without a spec: whatever it is, it is there
        found = True
    why = "" if found else f"the cuDNN frontend (module cudnn) is not installed; {INSTALL_CUDA} to run cuDNN"
    with dispatcher.lock:
        first = dispatcher.no_cudnn is None
        dispatcher.no_cudnn = why
    if why and first:
        log.warning("fusedattn_select: %s. attention() runs the calls torch SDPA can run on torch from their "
                    "first call", why)
    return why


def ahead_target(device: int) -> tuple[tuple[str, int] | None, str]:
    """((the default store directory, device), "") where a worker can build plans ahead, worked out
    as fresh_store_target does, without this process's selector (which imports cuDNN and opens the
    store, holding the GIL); else (None, why not). What only the worker can tell (cuDNN that
    does not load, a store that refuses plans) comes back as the answer of each job."""
    mode = run_settings.get().dense_builds
    if mode != PROCESS:
        return None, f"{settings.DENSE_BUILDS}={mode} builds plans where a call needs them"
    if os.environ.get(settings.SNAPSHOT):
        return None, f"{settings.SNAPSHOT} answers from snapshot files: no live cuDNN engine"
    missing = cudnn_missing()
    if missing:
        return None, f"{missing}: no live cuDNN engine"
    off = cache_switched_off()
    if off:
        return None, f"no persistent store to hand plans over with ({off})"
    if dispatcher.worker_deaths >= MAX_DEATHS:
        return None, "the worker process could not start"
    return (str(default_cache_dir()), device), ""


def queue_ahead(calls: Callable[[], tuple[list[AttnConfig], str]], what: str, device: int) -> Future | None:
    """Queue, in the worker and at the priority of build-ahead work, the bucket of each call config
    `calls()` gives (in their order; with a note of what it left out); returns at once. `calls()` and
    the queueing run on a thread of their own (not the thread preparing first calls); its Future
    gives how many buckets were queued. None, logged, where no worker can build them."""
    target, why = ahead_target(device)
    if target is None:
        log.warning("fusedattn_select: build ahead for %s: nothing queued (%s)", what, why)
        return None
    return dispatcher.ahead_queuer.submit(lambda: _queue_ahead(calls, what, target))


def _queue_ahead(calls: Callable[[], tuple[list[AttnConfig], str]], what: str, where: tuple[str, int]) -> int:
    try:
        configs, left_out = calls()
    except Exception as err:  # noqa: BLE001 - on a thread of its own: said, not raised
        log.warning("fusedattn_select: build ahead for %s: nothing queued (%s: %s)", what, type(err).__name__, err)
        raise
    queued = 0
    try:
        for cfg in configs:
            job = _submit({"kind": "ahead", "config": cfg.to_dict(), "return_lse": False, "store_dir": where[0],
                           "device": where[1], "bucket": [cfg.batch_size, cfg.seqlen_q, cfg.seqlen_kv]})
            queued += 1
            dispatcher.counters["ahead_queued"] += 1
            with dispatcher.ahead_lock:
                dispatcher.ahead.add(job)
            job.add_done_callback(_count_ahead)
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        log.warning("fusedattn_select: build ahead for %s: the worker took %d of %d buckets (%s: %s)", what,
                    queued, len(configs), type(err).__name__, err)
        return queued
    log.info("fusedattn_select: build ahead for %s: queued %d buckets in the worker process%s", what, queued,
             f"; left out: {left_out}" if left_out else "")
    return queued


def _count_ahead(job: Future) -> None:
    """Count a finished build-ahead job and forget it; the first failure and the first skip say why."""
    err = job.exception()
    outcome = "ahead_failed" if err is not None else "ahead_skipped" if job.result() else "ahead_built"
    with dispatcher.ahead_lock:
        dispatcher.ahead.discard(job)
        first = dispatcher.counters[outcome] == 0
        dispatcher.counters[outcome] += 1
    if first and err is not None:
        log.warning("fusedattn_select: the worker could not build a bucket ahead (%s); later failures are "
                    "counted in dispatch_info()['ahead_failed']", err)
    elif first and outcome == "ahead_skipped":
        log.info("fusedattn_select: the worker built a bucket ahead no plans: %s; later ones are counted in "
                 "dispatch_info()['ahead_skipped']", job.result())


def learned_forms(job: Future, what: str) -> list[AttnConfig]:
    """The bucket forms a finished decide job selected (none, logged, when the job failed)."""
    try:
        answer = json.loads(job.result())
        return [AttnConfig.from_dict(form) for form in answer.get("forms", [])]
    except Exception as err:  # noqa: BLE001 - the caller prepares the signature itself
        log.warning("fusedattn_select: the worker preparing %s failed (%s: %s); preparing it here",
                    what, type(err).__name__, err)
        return []


def report(job: Future, key: str) -> bool:
    """Log a finished job's outcome when it is not "plans stored"; whether the worker stored them."""
    err = job.exception()
    if err is not None:  # nothing about this problem: the caller builds the plans itself
        log.warning("fusedattn_select: the worker building %s's own plans failed (%s: %s); building them here",
                    key, type(err).__name__, err)
        return False
    if job.result():
        log.info("fusedattn_select: the worker stored no plans for %s: %s", key, job.result())
        return False
    return True


class _Worker:
    """The worker process (`python -m fusedattn_select.runtime.dense_worker FD`) and its jobs: one
    JSON line per job on its stdin, one per answer on its own pipe FD (so what the libraries it loads
    print cannot corrupt them). A plain subprocess, not multiprocessing: a spawned multiprocessing
    child imports the caller's main module again, which runs a script without an
    `if __name__ == "__main__"` guard a second time."""

    def __init__(self, ahead_for: tuple[str, int] | None = None) -> None:
        # What this process imports; the worker decides as attention() waiting would, with no compiled module.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                   **{settings.FIRST_CALLS: "wait", settings.NATIVE: "0"})
        warm = [] if ahead_for is None else [str(ahead_for[1])]
        read_fd, write_fd = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fusedattn_select.runtime.dense_worker", str(write_fd), *warm],
                stdin=subprocess.PIPE, env=env, text=True, bufsize=1, pass_fds=(write_fd,))
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.answers = os.fdopen(read_fd, "r")
        self.jobs: dict[int, Future] = {}
        self.next_id = 0
        self.answered = 0
        self.closed = False
        self.ahead_for = ahead_for  # (store directory, device) it was started ahead for (prestart)
        # A forked child has the parent's worker but not its reader thread: jobs it sent would never be answered
        # (and `lock` may be held there for ever), so a child starts its own (`running_here`).
        self.started_by = os.getpid()
        self.lock = threading.Lock()
        threading.Thread(target=self._read_answers, name="fusedattn-dense-builds", daemon=True).start()

    def submit(self, job: dict) -> Future:
        future: Future = Future()
        with self.lock:
            self.next_id += 1
            self.jobs[self.next_id] = future
            try:
                self.process.stdin.write(json.dumps(dict(job, id=self.next_id)) + "\n")
                self.process.stdin.flush()
            except (OSError, ValueError):
                self.jobs.pop(self.next_id)
                raise
        return future

    def _read_answers(self) -> None:
        try:
            for line in self.answers:
                try:
                    answer = json.loads(line)
                    if "warning" in answer:  # said unasked: through this process's logging, not the worker's stderr
                        log.warning("fusedattn_select: %s", answer["warning"])
                        continue
                    with self.lock:
                        future = self.jobs.pop(answer["id"], None)
                except (ValueError, KeyError, TypeError):
                    continue
                if future is None:
                    continue
                self.answered += 1
                if "error" in answer:
                    future.set_exception(RuntimeError(answer["error"]))
                else:
                    future.set_result(str(answer.get("result", "")))
        finally:
            code = self.process.wait()
            with self.lock:
                left, self.jobs = list(self.jobs.values()), {}
            if not self.closed and self.answered == 0:
                dispatcher.worker_deaths += 1  # it never answered: it may not be able to start at all
            for future in left:
                future.set_exception(RuntimeError(f"the worker process exited with code {code}"))

    def running_here(self) -> bool:
        """Whether this is this process's worker (not a forked child's parent's) and it still runs."""
        return self.started_by == os.getpid() and self.process.poll() is None

    def close(self) -> None:
        """End the worker: it finishes the job it is on and exits at the end of its input."""
        self.closed = True
        try:
            self.process.stdin.close()
        except OSError:
            pass


MAX_DEATHS = 2  # workers that died before answering anything: then this process builds inline


def prestart(where: tuple[str, int]) -> None:
    """Start the worker process now, before its first job, where none runs: it pays its start-up
    (imports, CUDA context, cuDNN's libraries) on device where[1] while the caller loads its model,
    rather than beside the caller's first calls. Nothing is said where it cannot start: the first
    job tries again and says why."""
    if dispatcher.worker_deaths >= MAX_DEATHS:
        return
    try:
        _running(where)
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        log.debug("fusedattn_select: the worker process was not started ahead (%s: %s)", type(err).__name__, err)


def _running(ahead_for: tuple[str, int] | None = None) -> _Worker:
    with dispatcher.worker_lock:  # the Dispatcher owns the worker: one per process
        worker = dispatcher.worker
        if worker is None or not worker.running_here():
            worker = dispatcher.worker = _Worker(ahead_for)
            atexit.register(worker.close)
    return worker


def _submit(job: dict) -> Future:
    return _running().submit(job)
