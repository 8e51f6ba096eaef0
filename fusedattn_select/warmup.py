"""warmup(): answer (and with depth="full", build) every problem of a model before it runs.

A first answer costs a probe: a few ms with depth="fast", hundreds of ms with "full", which also
compiles the kernels. warmup() pays that once per distinct problem, on several threads (cuDNN
builds release the GIL: 4 builds took 1236 ms in sequence and 387 ms on 4 threads), and leaves the
answers in the decision cache and the persistent store for every later call and process.

Every rank of a job may call it at once. Threads of one process share the selector's single
flight; processes share the persistent store, and each problem is probed under the store's
`key_lock`, so eight ranks warming the same problems probe each one once in total and the other
seven read its answer from the store.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Iterable, Union

from .backend import Backend, Outcome, ProbeDepth, Selection
from .config import AttnConfig, NamedConfig
from .errors import ConfigError

log = logging.getLogger("fusedattn_select")

ConfigItem = Union[AttnConfig, NamedConfig, tuple[str, AttnConfig]]
Progress = Callable[[int, int, str], None]

MAX_DEFAULT_JOBS = 8


class WarmupOutcome(str, enum.Enum):
    """What warming one problem found."""

    ACCEPTED = "accepted"  # a fused backend runs it
    REJECTED = "rejected"  # no fused backend: a verdict (cached), with its reasons
    FAILED = "failed"  # the probe hit an incident (out of memory, CUDA error): not cached, retry later

    def __str__(self) -> str:
        return self.value


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
        }


@dataclass(frozen=True)
class WarmupReport:
    """Rows in the order the problems were given; `duplicates` counts entries sharing a key."""

    rows: tuple[WarmupRow, ...]
    wall_seconds: float
    depth: ProbeDepth
    jobs: int
    duplicates: int = 0

    def count(self, outcome: WarmupOutcome) -> int:
        return sum(1 for row in self.rows if row.outcome is outcome)

    @property
    def totals(self) -> dict[str, int]:
        return {
            **{outcome.value: self.count(outcome) for outcome in WarmupOutcome},
            "problems": len(self.rows),
            "duplicates": self.duplicates,
            "from_cache": sum(1 for row in self.rows if row.from_cache),
        }

    def summary(self) -> str:
        return (
            f"{self.count(WarmupOutcome.ACCEPTED)} accepted, {self.count(WarmupOutcome.REJECTED)} rejected, "
            f"{self.count(WarmupOutcome.FAILED)} failed in {self.wall_seconds:.2f} s"
        )

    def to_dict(self) -> dict:
        return {
            "rows": [row.to_dict() for row in self.rows],
            "totals": self.totals,
            "wall_seconds": round(self.wall_seconds, 6),
            "depth": self.depth.value,
            "jobs": self.jobs,
        }

    def format_table(self) -> str:
        """A plain-text table, one line per problem, then the summary line."""
        header = ("name", "backend", "outcome", "seconds", "answer", "reason")
        lines = [
            (
                row.name + (f" (= {', '.join(row.also_named)})" if row.also_named else ""),
                row.backend.value,
                row.outcome.value,
                f"{row.seconds:.3f}",
                "cached" if row.from_cache else "probed",
                row.reason,
            )
            for row in self.rows
        ]
        widths = [max(len(cells[i]) for cells in [header, *lines]) for i in range(len(header) - 1)]

        def render(cells: tuple[str, ...]) -> str:
            aligned = [cell.rjust(w) if i == 3 else cell.ljust(w) for i, (cell, w) in enumerate(zip(cells, widths))]
            return "  ".join([*aligned, cells[-1]]).rstrip()

        return "\n".join([render(header), *(render(cells) for cells in lines), self.summary()])


def warmup(configs: Iterable[ConfigItem], jobs: int | None = None, depth: str | ProbeDepth = "full",
           selector: object | None = None, progress: Progress | None = None) -> WarmupReport:
    """Select every distinct problem in `configs` now, `jobs` at a time; returns a WarmupReport.

    `configs` holds AttnConfig, (name, AttnConfig) pairs or NamedConfig entries of a config file;
    entries with the same cache key are probed once. `jobs` defaults to min(8, CPU count).
    `progress(done, total, name)` is called on the calling thread after each problem. A probe
    that fails (or raises) fails its row only; the others go on.
    """
    probe_depth = _depth(depth)
    workers = _jobs(jobs)
    problems, duplicates = _distinct(configs)
    if selector is None:
        from .selector import default_selector

        selector = default_selector()

    started = time.perf_counter()
    rows: dict[str, WarmupRow] = {}
    total = len(problems)
    if problems:
        with ThreadPoolExecutor(max_workers=min(workers, total), thread_name_prefix="fusedattn-warmup") as pool:
            futures = {
                pool.submit(_warm_one, selector, name, cfg, key, probe_depth): key
                for key, (name, cfg, _) in problems.items()
            }
            try:
                for done, future in enumerate(as_completed(futures), start=1):
                    row = future.result()
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
    )
    log.info("fusedattn_select: warmup (%s, %d jobs): %s", probe_depth.value, workers, report.summary())
    return report


# ----- internals --------------------------------------------------------------------------------
def _depth(value: str | ProbeDepth) -> ProbeDepth:
    try:
        return ProbeDepth(value)
    except ValueError:
        raise ConfigError("depth", value, "must be 'fast' or 'full'") from None


def _jobs(jobs: int | None) -> int:
    if jobs is None:
        return max(1, min(MAX_DEFAULT_JOBS, os.cpu_count() or 1))
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs <= 0:
        raise ConfigError("jobs", jobs, "must be a positive integer, or None for min(8, CPU count)")
    return jobs


def _named(index: int, item: object) -> tuple[str, AttnConfig]:
    if isinstance(item, NamedConfig):
        return item.name, item.config
    if isinstance(item, AttnConfig):
        return describe(item), item
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], AttnConfig):
        return item
    raise ConfigError(
        f"configs[{index}]", item, "must be an AttnConfig, a (name, AttnConfig) pair or a NamedConfig",
    )


def _distinct(configs: Iterable[ConfigItem]) -> tuple[dict[str, tuple[str, AttnConfig, list[str]]], int]:
    """Problems by cache key in first-seen order, each with the other names it was given; duplicates."""
    if isinstance(configs, (AttnConfig, NamedConfig)):
        configs = [configs]
    problems: dict[str, tuple[str, AttnConfig, list[str]]] = {}
    duplicates = 0
    for index, item in enumerate(configs):
        name, cfg = _named(index, item)
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


def _cross_process_lock(selector: object, key: str) -> contextlib.AbstractContextManager:
    """The store's per-key lock, unless the selector already takes it around its probes.

    Taking it here as well would let a selector thread that leads the probe of `key` wait for
    this lock while this thread waits for that probe's answer.
    """
    store = getattr(selector, "store", None)
    if store is None or not hasattr(store, "key_lock") or getattr(selector, "takes_key_locks", False):
        return contextlib.nullcontext()
    return store.key_lock(selector.fingerprint, key)


def _warm_one(selector: object, name: str, cfg: AttnConfig, key: str, depth: ProbeDepth) -> WarmupRow:
    started = time.perf_counter()
    try:
        with _cross_process_lock(selector, key):
            selection = selector.select(cfg, depth)
    except Exception as err:  # one broken problem must not stop the warmup of the others
        log.warning("fusedattn_select: warmup of %s raised %s: %s", name, type(err).__name__, err, exc_info=True)
        return WarmupRow(name, key, Backend.NONE, WarmupOutcome.FAILED, f"{type(err).__name__}: {err}",
                         time.perf_counter() - started, from_cache=False)
    return _row(name, key, selection, time.perf_counter() - started)


def _row(name: str, key: str, selection: Selection, seconds: float) -> WarmupRow:
    if any(v.outcome is Outcome.FAILED for v in selection.verdicts):
        outcome = WarmupOutcome.FAILED
    elif selection.backend is Backend.NONE:
        outcome = WarmupOutcome.REJECTED
    else:
        outcome = WarmupOutcome.ACCEPTED
    return WarmupRow(name, key, selection.backend, outcome, selection.message, seconds, selection.from_cache)


def _with_aliases(row: WarmupRow, aliases: list[str]) -> WarmupRow:
    if not aliases:
        return row
    return WarmupRow(row.name, row.cache_key, row.backend, row.outcome, row.reason, row.seconds,
                     row.from_cache, tuple(aliases))
