"""warmup(): answer (and with depth="full", build) every problem of a model before it runs.

A first answer costs a probe: a few ms with depth="fast", hundreds of ms with "full", which also
compiles the kernels. warmup() pays that once per distinct problem, `jobs` at a time, and leaves
the answers in the decision cache and the persistent store for every later call and process.

Builds hold the GIL (4 builds on 4 threads took longer than in sequence: docs/performance.md), so `workers="processes"` runs the builds in worker processes that share
the persistent store; the calling process then reads every answer back from the store. Threads
stay the default: every rank of a job may warm at once, and eight ranks with eight worker
processes each would start 64 CUDA contexts.

With depth="verify" each answer also runs the graphs twice on seeded data against a float32
reference (probing/cudnn/numerics.py; needs torch), and plans are built as with "full".

With depth="full" it also builds the execution plans attention() will run for each accepted
problem (forward, and backward when training: the same graphs and plan keys as dispatch for dense
tensors of the problem's layout: plan_store/keys.py) and stores them serialized, so a later process's
attention() on that problem loads them instead of building them (much slower). This needs
the live cuDNN engine, cudnn-frontend and a persistent store, not torch; problems attention() does
not run as described (THD, paged KV, cuda_graph=True, ...) get no plans, with the reason in the row.

Every rank of a job may call it at once. Threads of one process share the selector's single
flight; processes share the persistent store, and each problem is probed under the store's
`key_lock`, so eight ranks warming the same problems probe each one once in total and the other
seven read its answer from the store.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Union

from fusedattn_select.config import AttnConfig
from fusedattn_select.config_files import ConfigFile, NamedConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.planning.forms import DENSE
from fusedattn_select.planning.planner import plan_forms
from fusedattn_select.probing.choice import live_engine_on
from fusedattn_select.result import Selection
from fusedattn_select.selection.plan_warmup import PlanTarget, persist_plans, plan_target
from fusedattn_select.selection.selector import Selector, default_selector
from fusedattn_select.store import PersistentStore, Store
from fusedattn_select.types import Backend, Outcome, ProbeDepth, TextEnum

log = logging.getLogger("fusedattn_select")

ConfigItem = Union[AttnConfig, NamedConfig, tuple[str, AttnConfig]]
# What warmup() takes as `configs`: one problem, a ConfigFile, or an iterable of problems.
Configs = Union[Iterable[ConfigItem], ConfigItem, ConfigFile]
Progress = Callable[[int, int, str], None]

MAX_DEFAULT_JOBS = 8


class WarmupOutcome(TextEnum):
    """What warming one problem found."""

    ACCEPTED = "accepted"  # a fused backend runs it
    REJECTED = "rejected"  # no fused backend: a verdict (cached), with its reasons, or no data (WarmupRow.no_data)
    FAILED = "failed"  # the probe hit an incident (out of memory, CUDA error): not cached, retry later


@dataclass(frozen=True)
class WarmupRow:
    """One distinct problem (cache key); `also_named` lists other entries with the same key."""

    name: str
    cache_key: str
    backend: Backend
    outcome: WarmupOutcome
    reason: str
    seconds: float
    from_cache: bool
    also_named: tuple[str, ...] = ()
    plans_built: int = 0   # execution plans built and stored by this warmup (depth full)
    plans_stored: int = 0  # plans the store already held (another process or an earlier warmup)
    plan_note: str = ""    # why this problem got no (or not all) plans
    # Some probe hit an incident (or raised): the answer is not cached, so it is neither shared nor read
    # back. A refusal beside it still makes the row rejected, as `why` and `matrix` class it.
    probe_failed: bool = False
    # NONE for want of data (Selection.no_data: a snapshot that did not record it, no engine), not a
    # refusal: the row is rejected, but nothing said no.
    no_data: bool = False

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "cache_key": self.cache_key,
            "backend": self.backend.value,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "seconds": round(self.seconds, 6),
            "from_cache": self.from_cache,
            "also_named": list(self.also_named),
            "plans": {"built": self.plans_built, "stored": self.plans_stored, "note": self.plan_note},
            "probe_failed": self.probe_failed,
            "no_data": self.no_data,
        }


@dataclass(frozen=True)
class WarmupReport:
    """Rows in the order the problems were given; `duplicates` counts entries sharing a key."""

    rows: tuple[WarmupRow, ...]
    wall_seconds: float
    depth: ProbeDepth
    jobs: int
    duplicates: int = 0
    plan_note: str = ""  # why no execution plans were built at all ("" when they were considered)
    # Writes of answers and plans the persistent store could not do (disk full, read-only, locked),
    # in this process and its workers: what they held lasts only as long as the process.
    failed_saves: int = 0
    store_path: str = ""  # the database those writes were for ("" without a persistent store)

    def count(self, outcome: WarmupOutcome) -> int:
        return sum(1 for row in self.rows if row.outcome is outcome)

    @property
    def totals(self) -> dict[str, int]:
        return {
            **{outcome.value: self.count(outcome) for outcome in WarmupOutcome},
            "problems": len(self.rows),
            "duplicates": self.duplicates,
            "from_cache": sum(1 for row in self.rows if row.from_cache),
            "plans_built": sum(row.plans_built for row in self.rows),
            "plans_stored": sum(row.plans_stored for row in self.rows),
            "failed_saves": self.failed_saves,
        }

    def summary(self) -> str:
        text = (
            f"{self.count(WarmupOutcome.ACCEPTED)} accepted, {self.count(WarmupOutcome.REJECTED)} rejected, "
            f"{self.count(WarmupOutcome.FAILED)} failed in {self.wall_seconds:.2f} s"
        )
        built, stored = self.totals["plans_built"], self.totals["plans_stored"]
        if built or stored:
            text += f"; execution plans: {built} built, {stored} already stored"
        if self.failed_saves:
            text += (f"; {self.failed_saves} saves of answers and plans to {self.store_path or 'the store'} "
                     "failed: they last only as long as this process")
        return text

    def to_dict(self) -> dict:
        return {
            "rows": [row.to_dict() for row in self.rows],
            "totals": self.totals,
            "wall_seconds": round(self.wall_seconds, 6),
            "depth": self.depth.value,
            "jobs": self.jobs,
            "plan_note": self.plan_note,
            "store_path": self.store_path or None,
        }


WORKERS = ("threads", "processes")


def warmup(configs: Configs, jobs: int | None = None,
           depth: str | ProbeDepth = "full", selector: Selector | None = None, progress: Progress | None = None,
           workers: str = "threads") -> WarmupReport:
    """Select every distinct problem in `configs` now, `jobs` at a time; returns a WarmupReport.

    `configs` holds AttnConfig, (name, AttnConfig) pairs or NamedConfig entries of a config file,
    or is a ConfigFile (its entries); entries with the same cache key are probed once. `jobs`
    defaults to min(8, CPU count). `progress(done, total, name)` is called on the calling thread
    after each problem; `selector` is a Selector (None: the process-wide one). A probe
    that fails (or raises) fails its row only; the others go on. With depth "full", accepted
    problems also get their execution plans built and stored (see the module docstring); a plan
    that does not build flips the problem to NONE as it would in attention(). `workers` is
    "threads" or "processes" (spawned worker processes sharing the persistent store). Writes the
    persistent store could not do (its own warning says why, once) are counted in `failed_saves`.
    """
    probe_depth = ProbeDepth.parse(depth, "depth")
    workers_kind = workers
    workers = job_count(jobs)
    problems, duplicates = distinct_problems(configs)
    check_callers(selector, progress)
    if selector is None:
        selector = default_selector()
    plans, plan_note = plan_target(selector, probe_depth)
    if plan_note and problems and probe_depth.answers(ProbeDepth.FULL):
        log.info("fusedattn_select: warmup builds no execution plans: %s", plan_note)
    use_processes = _use_processes(workers_kind, selector, plans, workers, len(problems))

    started = time.perf_counter()
    failed_before = failed_writes(selector.store)
    failed_in_workers = 0
    rows: dict[str, WarmupRow] = {}
    total = len(problems)
    if problems:
        with _executor(use_processes, min(workers, total)) as pool:
            if use_processes:
                futures = {
                    pool.submit(_warm_in_worker, name, cfg.to_dict(), key, probe_depth.value,
                                str(plans.store.path.parent), plans.builder.device): key
                    for key, (name, cfg, _) in problems.items()
                }
            else:
                futures = {
                    pool.submit(_warm_one, selector, name, cfg, key, probe_depth, plans): key
                    for key, (name, cfg, _) in problems.items()
                }
            try:
                for done, future in enumerate(as_completed(futures), start=1):
                    row = future.result()
                    if use_processes:
                        row, worker_failed = row
                        failed_in_workers += worker_failed
                        if not row.probe_failed and not worker_failed:
                            # The worker stored the answer; read it back so this process's cache has
                            # it (a failed probe stored nothing, and a store that failed the worker's
                            # write would fail this process's again: neither is retried here).
                            selector.select(problems[futures[future]][1], probe_depth)
                    rows[futures[future]] = row
                    if progress is not None:
                        progress(done, total, row.name)
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    report = WarmupReport(
        rows=tuple(
            _with_aliases(rows[key], aliases) for key, (_, _, aliases) in problems.items()
        ),
        wall_seconds=time.perf_counter() - started,
        depth=probe_depth,
        jobs=workers,
        duplicates=duplicates,
        plan_note=plan_note,
        failed_saves=failed_writes(selector.store) - failed_before + failed_in_workers,
        store_path=str(selector.store.path) if selector.store is not None and selector.store.path else "",
    )
    no_data = sum(1 for row in report.rows if row.no_data)
    log.info("fusedattn_select: warmup (%s, %d jobs): %s%s", probe_depth.value, workers, report.summary(),
             f"; {no_data} of the rejected have no data (only a live probe can answer them)" if no_data else "")
    return report


# ----- internals --------------------------------------------------------------------------------
def _use_processes(kind: str, selector: Selector, plans: PlanTarget | None, jobs: int, problems: int) -> bool:
    if kind not in WORKERS:
        raise ConfigError("workers", kind, "must be one of " + ", ".join(repr(w) for w in WORKERS))
    if kind == "processes" and plans is None:
        raise ConfigError(
            "workers", kind,
            "needs the live cuDNN engine, a persistent store and depth 'full' (worker processes share "
            "their answers through the store); use 'threads'",
        )
    return kind == "processes" and jobs > 1 and problems > 1


def _executor(processes: bool, workers: int) -> Executor:
    if not processes:
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fusedattn-warmup")
    # spawn, not fork: a forked child of a process that initialised CUDA cannot use the GPU.
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


_worker_selectors: dict[tuple[str, int], Selector] = {}


def worker_selector(store_dir: str, device: int) -> Selector:
    """The selector of a worker process: its own live engine on `device`, the caller's persistent store."""
    selector = _worker_selectors.get((store_dir, device))
    if selector is None:
        selector = _worker_selectors[(store_dir, device)] = Selector(live_engine_on(device),
                                                                     store=PersistentStore(store_dir))
    return selector


def _warm_in_worker(name: str, config: dict, key: str, depth: str, store_dir: str,
                    device: int) -> tuple[WarmupRow, int]:
    """Warm one problem in a worker process (its own live engine, the caller's persistent store):
    its row, and how many of its writes to the store failed (a worker runs one problem at a time)."""
    selector = worker_selector(store_dir, device)
    failed_before = failed_writes(selector.store)
    probe_depth = ProbeDepth.parse(depth)
    plans, _ = plan_target(selector, probe_depth)
    row = _warm_one(selector, name, AttnConfig.from_dict(config), key, probe_depth, plans)
    return row, failed_writes(selector.store) - failed_before


def failed_writes(store: Store | None) -> int:
    """How many writes `store` could not persist since it was opened (info()["failed_writes"])."""
    return int(store.info().get("failed_writes") or 0) if store is not None else 0


def check_callers(selector: object, progress: object) -> None:
    """ConfigError for a `selector` that is no Selector or a `progress` that cannot be called: found
    before any probe, not when the first problem is done (distributed.warmup and agree check the same)."""
    if selector is not None and not isinstance(selector, Selector):
        raise ConfigError("selector", selector, "must be a Selector, or None for the process-wide one")
    if progress is not None and not callable(progress):
        raise ConfigError("progress", progress, "must be a function progress(done, total, name), or None")


def job_count(jobs: int | None) -> int:
    """How many problems warmup() runs at a time for `jobs`; ConfigError naming jobs unless a positive int or None."""
    if jobs is None:
        return max(1, min(MAX_DEFAULT_JOBS, os.cpu_count() or 1))
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs <= 0:
        raise ConfigError("jobs", jobs, "must be a positive integer, or None for min(8, CPU count)")
    return jobs


def _is_pair(item: object) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], AttnConfig)


def named_problem(index: int, item: object) -> tuple[str, AttnConfig]:
    """(name, config) of the `index`-th config item; an unnamed AttnConfig is named by `describe`."""
    if isinstance(item, NamedConfig):
        return item.name, item.config
    if isinstance(item, AttnConfig):
        return describe(item), item
    if _is_pair(item):
        return item  # type: ignore[return-value]
    raise ConfigError(
        f"configs[{index}]", item, "must be an AttnConfig, a (name, AttnConfig) pair or a NamedConfig",
    )


CONFIGS_ALLOWED = ("must be an AttnConfig, a (name, AttnConfig) pair, a NamedConfig, a ConfigFile "
                   "(load_config_file), or an iterable of AttnConfigs, pairs and NamedConfigs")


def config_items(configs: object) -> Iterable[object]:
    """The items of warmup()'s `configs`: one problem, the entries of a ConfigFile, or the iterable
    itself; ConfigError naming `configs` for anything else (None, a number, a string)."""
    if isinstance(configs, (AttnConfig, NamedConfig)) or _is_pair(configs):
        return [configs]
    if isinstance(configs, ConfigFile):  # the file itself where its .entries were meant
        return configs.entries
    # A string iterates over its characters and a mapping over its keys: never a list of problems.
    if configs is None or isinstance(configs, (str, bytes, Mapping)) or not isinstance(configs, Iterable):
        raise ConfigError("configs", configs, CONFIGS_ALLOWED)
    return configs


def distinct_problems(configs: Configs,
                      ) -> tuple[dict[str, tuple[str, AttnConfig, list[str]]], int]:
    """Problems by cache key in first-seen order, each with the other names it was given; duplicates."""
    configs = config_items(configs)
    problems: dict[str, tuple[str, AttnConfig, list[str]]] = {}
    duplicates = 0
    for index, item in enumerate(configs):
        name, cfg = named_problem(index, item)
        key = cfg.cache_key()
        if key in problems:
            duplicates += 1
            problems[key][2].append(name)
        else:
            problems[key] = (name, cfg, [])
    return problems, duplicates


def describe(cfg: AttnConfig) -> str:
    """A short name for an unnamed problem: dtype, batch, heads, lengths, head dims, mask, pass."""
    head_dims = f"d{cfg.head_dim_qk}" + (
        f"/{cfg.resolved_head_dim_v}" if cfg.resolved_head_dim_v != cfg.head_dim_qk else ""
    )
    return (
        f"{cfg.qkv_dtype} b{cfg.batch_size} h{cfg.num_heads_q}/{cfg.num_heads_kv} "
        f"s{cfg.seqlen_q}/{cfg.seqlen_kv} {head_dims} {cfg.mask} {'train' if cfg.is_training else 'infer'}"
    )


def _warm_plans(selector: Selector, cfg: AttnConfig, selection: Selection,
                plans: PlanTarget) -> tuple[Selection, dict]:
    """Build and store the plans attention() will run for an accepted problem; the fields for its row.

    A graph that passed the probe but does not build flips its answer, as attention() would; when
    that leaves the problem to its dense plans, those are built next."""
    forms, note = plan_forms(selector, cfg, selection)
    fields = {"plans_built": 0, "plans_stored": 0, "plan_note": note}
    flipped = False
    for form in forms:
        if form is not cfg and not selector.select(form, ProbeDepth.FULL).selected:
            continue  # a bucket cuDNN rejects: calls of that size run their dense plans
        try:
            result = persist_plans(form, selection.backend, plans)
        except Exception as err:  # noqa: BLE001 - plans are a head start; the answer stands without them
            log.warning("fusedattn_select: building the plans of %s raised %s: %s", form.cache_key(),
                        type(err).__name__, " ".join(str(err).split()))
            log.debug("fusedattn_select: where building the plans of %s raised", form.cache_key(), exc_info=True)
            return selection, dict(fields, plan_note=f"plans not stored: {type(err).__name__}: {err}")
        fields["plans_built"] += result.built
        fields["plans_stored"] += result.stored
        fields["plan_note"] = result.note or fields["plan_note"]
        if result.failure is not None and result.failure.outcome is Outcome.UNSUPPORTED:
            selector.record_build_failure(form, result.failure)
            flipped = True
    if not flipped:
        return selection, fields
    again = selector.select(cfg, ProbeDepth.FULL)
    if again.selected and again.plan == DENSE and selection.plan != DENSE:
        again, more = _warm_plans(selector, cfg, again, plans)
        fields = {"plans_built": fields["plans_built"] + more["plans_built"],
                  "plans_stored": fields["plans_stored"] + more["plans_stored"],
                  "plan_note": more["plan_note"] or fields["plan_note"]}
    return again, fields


def _warm_one(selector: Selector, name: str, cfg: AttnConfig, key: str, depth: ProbeDepth,
              plans: PlanTarget | None = None) -> WarmupRow:
    started = time.perf_counter()
    plan_fields: dict = {}
    try:
        selection = selector.select(cfg, depth)
        if plans is not None and selection.backend is not Backend.NONE and not any(
                v.outcome is Outcome.FAILED for v in selection.verdicts):
            selection, plan_fields = _warm_plans(selector, cfg, selection, plans)
    except Exception as err:  # one broken problem must not stop the warmup of the others
        log.warning("fusedattn_select: warmup of %s raised %s: %s", name, type(err).__name__,
                    " ".join(str(err).split()))
        log.debug("fusedattn_select: where the warmup of %s raised", name, exc_info=True)  # (-vv: the traceback)
        return WarmupRow(name, key, Backend.NONE, WarmupOutcome.FAILED, f"{type(err).__name__}: {err}",
                         time.perf_counter() - started, from_cache=False, probe_failed=True)
    row = _row(name, key, selection, time.perf_counter() - started)
    return dataclasses.replace(row, **plan_fields) if plan_fields else row


def _row(name: str, key: str, selection: Selection, seconds: float) -> WarmupRow:
    # As `why` and `matrix` class an answer: a selected backend is accepted whatever another backend's
    # probe did, a refusal is an answer even beside a failed probe, and a failed probe alone is none.
    outcomes = {v.outcome for v in selection.verdicts}
    if selection.backend is not Backend.NONE:
        outcome = WarmupOutcome.ACCEPTED
    elif Outcome.FAILED in outcomes and Outcome.UNSUPPORTED not in outcomes:
        outcome = WarmupOutcome.FAILED
    else:
        outcome = WarmupOutcome.REJECTED
    return WarmupRow(name, key, selection.backend, outcome, selection.message, seconds, selection.from_cache,
                     probe_failed=Outcome.FAILED in outcomes, no_data=selection.no_data)


def _with_aliases(row: WarmupRow, aliases: list[str]) -> WarmupRow:
    if not aliases:
        return row
    return dataclasses.replace(row, also_named=tuple(aliases))
