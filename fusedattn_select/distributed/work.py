"""The work of a shared warmup: distinct problems as items with a stable key, split across ranks.

An item is one distinct problem: its probe (every pass) and, at depth full, the plans of every
pass. Probe and plans stay together because a full probe compiles the kernels the plan build then
reuses in the same process (a later build of the same kernels in-process is several times faster
than a cold one), so splitting one problem's passes across ranks would pay the compile twice. The
key is the problem's cache key; a shape bucket becomes an item with the bucket's key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping, Sequence

from fusedattn_select.config import AttnConfig
from fusedattn_select.plan_store.calls import dispatch_config

# warmup's own inputs, naming and de-duplication: a shared warmup splits the problems warmup() runs
from fusedattn_select.selection.local_warmup import Configs, config_items, distinct_problems, named_problem
from fusedattn_select.types import ProbeDepth


def named_problems(configs: Configs) -> list[tuple[str, AttnConfig]]:
    """(name, config) pairs in the given order; an unnamed AttnConfig is named by `describe`. Takes
    what warmup() takes (local_warmup.config_items) and refuses the rest with a ConfigError."""
    return [named_problem(index, item) for index, item in enumerate(config_items(configs))]


@dataclass(frozen=True)
class WorkItem:
    """One unit of shared warmup; `cost` is relative (graphs probed, plus plans built at depth full)."""

    key: str
    name: str
    config: AttnConfig
    cost: int
    also_named: tuple[str, ...] = ()


def work_items(configs: Configs, depth: ProbeDepth) -> tuple[list[WorkItem], int]:
    """Distinct problems in first-seen order, and how many entries repeated an earlier problem."""
    items, duplicates = distinct_problems(configs)
    return [WorkItem(key, name, cfg, _cost(cfg, depth), tuple(aliases))
            for key, (name, cfg, aliases) in items.items()], duplicates


def _cost(cfg: AttnConfig, depth: ProbeDepth) -> int:
    passes = len(cfg.phases)
    if depth.answers(ProbeDepth.FULL) and dispatch_config(cfg) is not None:
        return 2 * passes  # a full probe and a plan build per pass
    return passes


def work_digest(items: Sequence[WorkItem]) -> str:
    """A digest of the item keys and costs (what split() reads), equal on ranks given the same work."""
    return hashlib.sha256(",".join(sorted(f"{item.key}:{item.cost}" for item in items)).encode()).hexdigest()[:16]


def problem_difference(stated: Sequence[tuple[int, Mapping[str, str]]]) -> str:
    """"" when every rank holds the same problems (cache key -> name, in any order: the same set is
    the same work), else what differs between the first rank and the first rank unlike it."""
    (first_rank, first), *others = stated
    for rank, problems in others:
        only = [(r, [key for key in mine if key not in theirs], mine)
                for r, mine, theirs in ((first_rank, first, problems), (rank, problems, first))]
        if any(keys for _, keys, _ in only):
            return f"rank {first_rank} has {len(first)} problems and rank {rank} {len(problems)}: " + "; ".join(
                f"{len(keys)} only on rank {r} ({_named(keys, names)})" for r, keys, names in only if keys)
    return ""


def _named(keys: Sequence[str], names: Mapping[str, str], shown: int = 3) -> str:
    text = ", ".join(f"{names[key]} [{key}]" for key in keys[:shown])
    return text + (f" and {len(keys) - shown} more" if len(keys) > shown else "")


def split(items: Sequence[WorkItem], ranks: Sequence[int]) -> dict[int, tuple[WorkItem, ...]]:
    """Each rank's share: costliest items first, each to the least-loaded rank (ties: lower rank).

    Depends only on the items' keys and costs and on `ranks`, so every rank computes the same split.
    """
    ordered = sorted(ranks)
    load = {rank: 0 for rank in ordered}
    shares: dict[int, list[WorkItem]] = {rank: [] for rank in ordered}
    for item in sorted(items, key=lambda i: (-i.cost, i.key)):
        rank = min(ordered, key=lambda r: (load[r], r))
        shares[rank].append(item)
        load[rank] += item.cost
    return {rank: tuple(share) for rank, share in shares.items()}
