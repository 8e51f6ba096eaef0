"""Where a steady shape's own (dense) plans are built: in a worker process, so the caller never waits.

A call signature that bucket plans run gets its shape's own plans once it is steady (entries.count_call).
Building them takes ~150 ms of cuDNN work that holds the GIL (measured on an H100 with cudnn-frontend
1.32: a build on another thread stopped the calling thread's Python for 130-150 ms of a 150 ms
build), so a thread would stall the caller as much as building inline. Instead one spawned worker
process per calling process selects the shape's own graphs and builds its plans into the persistent
store; the caller keeps running bucket plans meanwhile, sees the job done at a later call, and then
reads the answer and loads the plans from the store (a few ms) instead of building them.

FUSEDATTN_SELECT_DENSE_BUILDS (read at import) picks where: "process" (the default) or "inline" (build
in the calling thread, stalling that one call). Without a persistent store that keeps plans, or without the live
cuDNN engine, there is nothing to hand plans over with: those processes build inline. The worker
starts at the first promotion (a few seconds: imports and CUDA context, which then holds its own
GPU memory) and lives as long as the process.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Optional

from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.selection.selector import Selector
from fusedattn_select.selection.warmup import plan_target, worker_selector
from fusedattn_select.types import Backend, Phase, ProbeDepth

log = logging.getLogger("fusedattn_select")

ENV_VAR = "FUSEDATTN_SELECT_DENSE_BUILDS"
PROCESS, INLINE = "process", "inline"
MODES = (PROCESS, INLINE)


def mode() -> str:
    """FUSEDATTN_SELECT_DENSE_BUILDS: "process" (unset or empty) or "inline"; ConfigError otherwise."""
    value = os.environ.get(ENV_VAR, "") or PROCESS
    if value not in MODES:
        raise ConfigError(ENV_VAR, value, "must be one of " + ", ".join(repr(m) for m in MODES))
    return value


configured = mode()  # read at import, like FUSEDATTN_SELECT_DENSE_AFTER


def plan_phases(cfg: AttnConfig, backend: Backend, return_lse: bool,
                backward_cfg: Optional[AttnConfig] = None) -> list[tuple[AttnConfig, Backend, Phase]]:
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


def in_background(selector: Selector) -> Optional[tuple[str, int]]:
    """(store directory, device ordinal) a worker hands plans over with, or None: build inline (the
    mode says so, or this selector has no persistent store or no live cuDNN engine)."""
    if configured != PROCESS:
        return None
    target, _ = plan_target(selector, ProbeDepth.FULL)
    if target is None:
        return None
    store, _, device = target
    return str(store.directory), int(device)


_lock = threading.Lock()
_pool: Optional[ProcessPoolExecutor] = None


def submit(cfg: AttnConfig, return_lse: bool, where: tuple[str, int]) -> Future:
    """Select `cfg`'s own graphs and build their plans into the store, in the worker process; the
    future's result is "" when the plans are stored, else why not (the answer or the build failure)."""
    global _pool
    with _lock:
        if _pool is None:
            # spawn, not fork: a forked child of a process that initialised CUDA cannot use the GPU.
            _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            atexit.register(_shutdown)
        pool = _pool
    return pool.submit(_build_in_worker, cfg.to_dict(), return_lse, where[0], where[1])


def _shutdown() -> None:
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)


def _build_in_worker(config: dict, return_lse: bool, store_dir: str, device: int) -> str:
    """In the worker: the dense answer of `config` (stored), then its plans (stored); "" or why not."""
    import torch

    from fusedattn_select.runtime import plans

    selector = worker_selector(store_dir, device)
    cfg = AttnConfig.from_dict(config)
    selection = selector.select_dense(cfg)
    if not selection.selected:
        return selection.message
    for plan_cfg, backend, phase in plan_phases(cfg, selection.backend, return_lse):
        try:
            plans.obtain_plan(plan_cfg, backend, phase, torch.device("cuda", device), selector=selector)
        except plans.PlanBuildError as err:
            selector.record_build_failure(cfg, err.verdict)
            return err.verdict.reason()
    return ""
