"""Shared warmup: the ranks of a group split a model's problems, warm their shares, then share results.

1. The ranks exchange their platforms, depth, agree and problems (the same set in any order is the
   same work); a rank called differently makes every rank raise DistributedError before any work.
2. The ranks of each platform split the distinct problems (work.split: deterministic, by cost) and
   each warms its share with selection.local_warmup.warmup (probe, and at depth full, plan builds stored
   in its store).
3. They exchange decisions, and serialized plans when some rank of the platform uses another
   store; each rank checks and stores what it lacks and reads every decision into memory.
4. With agree=True (default) they then agree on every problem (agreement.py).

Every rank ends with every decision, and on live cuDNN with every plan, while each problem was
probed and built once per platform. Ranks of different platforms never take each other's
results: each platform's ranks do its work among themselves.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Sequence

from fusedattn_select.distributed.agreement import (
    AgreementReport,
    PlatformGroup,
    conclude,
    distinct_names,
    local_statement,
    platform_groups,
)
from fusedattn_select.distributed.facts import RankFacts, require_same
from fusedattn_select.distributed.group import DEFAULT_TIMEOUT_S, Communicator, DistributedError, tell_others
from fusedattn_select.distributed.group import refuse as group_refuse
from fusedattn_select.distributed.sharing import ACCEPTED, PRESENT, Share, outgoing, receive_decision, receive_plan
from fusedattn_select.distributed.work import (
    Configs,
    WorkItem,
    problem_difference,
    split,
    work_digest,
    work_items,
)
from fusedattn_select.selection import local_warmup
from fusedattn_select.selection.local_warmup import Progress, WarmupReport, check_callers, failed_writes, job_count
from fusedattn_select.selection.selector import Selector, default_selector
from fusedattn_select.types import ProbeDepth

log = logging.getLogger("fusedattn_select")

START = "warmup start"  # a shared warmup's first exchange: where a rank that will not warm says why


@dataclass(frozen=True)
class Received:
    """What this rank took from the other ranks, and every row it did not take, with the reason."""

    decisions: int = 0
    plans: int = 0
    plans_present: int = 0  # plans its store already held
    plan_bytes: int = 0
    skipped: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SharedWarmupReport:
    """One rank's view of a shared warmup.

    `combined` has one row per distinct problem as the rank that warmed it found it (in the given
    order); `local` is this rank's own share; `owners` maps each cache key to the rank that warmed it.
    """

    rank: int
    ranks: tuple[int, ...]
    combined: WarmupReport
    local: WarmupReport
    owners: dict[str, int]
    received: Received
    plan_bytes_sent: int
    platforms: tuple[PlatformGroup, ...]
    wall_seconds: float
    agreement: AgreementReport | None = None

    def summary(self) -> str:
        text = (f"rank {self.rank} of {len(self.ranks)}: warmed {len(self.local.rows)} of "
                f"{len(self.combined.rows)} problems ({self.local.summary()}); received "
                f"{self.received.decisions} decisions and {self.received.plans} plans "
                f"({self.received.plan_bytes / 1e6:.1f} MB, {self.received.plans_present} already stored); "
                f"{self.wall_seconds:.2f} s")
        if self.received.skipped:
            text += f"; {len(self.received.skipped)} rows not taken"
        return text

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "ranks": list(self.ranks),
            "combined": self.combined.to_dict(),
            "local": self.local.to_dict(),
            "owners": dict(self.owners),
            "received": {**dataclasses.asdict(self.received),
                         "skipped": [{"row": r, "reason": why} for r, why in self.received.skipped]},
            "plan_bytes_sent": self.plan_bytes_sent,
            "wall_seconds": round(self.wall_seconds, 6),
            "agreement": self.agreement.to_dict() if self.agreement is not None else None,
        }


def warmup(configs: Configs, depth: str | ProbeDepth = "full", group: object = None, *,
           selector: Selector | None = None, jobs: int | None = None, progress: Progress | None = None,
           agree: bool = True, timeout: float = DEFAULT_TIMEOUT_S) -> SharedWarmupReport:
    """Warm `configs` once across the ranks of `group` (default: the whole job); every rank ends with all.

    `configs`, `selector`, `jobs` and `progress` are what selection.local_warmup.warmup takes (a
    ConfigFile, its entries, AttnConfigs, (name, AttnConfig) pairs) and are checked as it checks
    them, before any work: the ConfigError is this rank's, told first to the other ranks at the first
    exchange (each raises DistributedError naming it). Every rank must call it with the same
    problems, `depth` and `agree`, else every rank raises DistributedError naming them before any
    work. `jobs` and
    `progress` apply to this rank's share. With `agree`, ends with agree() on every problem.
    Raises DistributedError on every rank when one rank raised or `timeout` seconds passed
    without a rank arriving; without a process group it is a local warmup.
    """
    try:
        probe_depth = ProbeDepth.parse(depth, "depth")
        job_count(jobs)  # local warmup's checks, in its order: a bad argument fails here, not inside an exchange
        items, duplicates = work_items(configs, probe_depth)
        check_callers(selector, progress)
        selector = selector if selector is not None else default_selector()
    except Exception as err:  # noqa: BLE001 - told to every rank, then raised: not only this library's errors
        tell_others(START, err, group, timeout)  # else the other ranks would only see this rank go missing
        raise
    comm = Communicator(group, timeout)
    started = time.perf_counter()
    failed_before = failed_writes(selector.store)

    starts = comm.exchange(START, lambda: _Start(
        RankFacts.of(comm.rank, comm.host, selector), probe_depth, agree,
        {item.key: item.name for item in items}, work_digest(items)))
    _check_start(starts)
    facts = [start.facts for start in starts]
    me = facts[comm.ranks.index(comm.rank)]
    peers = [f for f in facts if f.platform == me.platform]
    shares = split(items, [p.rank for p in peers])
    mine = shares[comm.rank]
    local: list[WarmupReport] = []

    def warm_share() -> Share:
        report = local_warmup.warmup([(i.name, i.config) for i in mine], jobs=jobs, depth=probe_depth,
                                     selector=selector, progress=progress)
        local.append(report)
        with_plans = any(not p.shares_store_with(me) for p in peers if p.rank != me.rank)
        return outgoing(selector, mine, report.rows, probe_depth, with_plans)

    results = comm.exchange("warmup share", warm_share)
    received: list[Received] = []
    problems = distinct_names([(item.name, item.config) for item in items])
    selections: list = []

    def take_and_state() -> _Taken:
        received.append(_take(selector, facts, results, me, items, probe_depth))
        statement = None
        if agree:
            statement, own = local_statement(comm, selector, problems, probe_depth, strict=False)
            selections.extend(own)
        store = selector.store
        return _Taken(comm.rank, failed_writes(store) - failed_before, str(store.path) if store and store.path else "",
                      statement)

    taken = comm.exchange("warmup results", take_and_state)
    statements = [t.statement for t in taken]
    agreement = conclude(comm, statements, problems, selections, selector, strict=False) if agree else None
    owners = {item.key: rank for rank, share in shares.items() for item in share}
    combined = _combined(items, duplicates, facts, results, peers, local[0])
    report = SharedWarmupReport(
        rank=comm.rank, ranks=comm.ranks, combined=dataclasses.replace(combined, **_failed_saves(taken, comm.rank)),
        local=local[0], owners=owners, received=received[0],
        plan_bytes_sent=results[comm.ranks.index(comm.rank)].plan_bytes,
        platforms=platform_groups(facts), wall_seconds=time.perf_counter() - started, agreement=agreement,
    )
    (log.info if comm.lowest else log.debug)("fusedattn_select: shared warmup: %s", report.summary())
    return report


def refuse(reason: str, group: object = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Take part in a shared warmup's first exchange with `reason` (why this rank will not warm: bad
    input, no engine) in place of its part: every other rank's warmup() raises a DistributedError naming
    this rank and `reason` (group.refuse), as this call does here."""
    group_refuse(START, reason, group, timeout)


@dataclass(frozen=True)
class _Start:
    """What a rank says before any work: itself, the arguments the split and the exchanges depend
    on (depth sets each item's cost; agree whether a statement follows), its problems (cache key ->
    name) and a digest of its items' keys and costs (what split() reads)."""

    facts: RankFacts
    depth: ProbeDepth
    agree: bool
    problems: dict[str, str]
    work: str


@dataclass(frozen=True)
class _Taken:
    """What a rank says once it has taken the others' results: the writes its persistent store could not
    do in this warmup (its share, what it took, its statement), that store's path, and its statement
    (None without agreement)."""

    rank: int
    failed_saves: int
    store_path: str
    statement: object


def _failed_saves(taken: Sequence[_Taken], me: int) -> dict:
    """The job's failed saves for the combined report: their count over every rank, and where they
    failed (this rank's database when only it failed or none did, else each failing rank's with its
    rank), so that every rank's report, and so its exit code, says what the job did not keep."""
    failing = [t for t in taken if t.failed_saves]
    if not failing or [t.rank for t in failing] == [me]:
        path = next(t.store_path for t in taken if t.rank == me)
    else:
        path = ", ".join(f"{t.store_path or 'the store'} (rank {t.rank})" for t in failing)
    return {"failed_saves": sum(t.failed_saves for t in failing), "store_path": path}


def _check_start(starts: Sequence[_Start]) -> None:
    """Raise DistributedError, before any work, when ranks were called differently."""
    require_same(START, "depth", [(s.facts.rank, s.depth.value) for s in starts])
    require_same(START, "agree", [(s.facts.rank, s.agree) for s in starts])
    difference = problem_difference([(s.facts.rank, s.problems) for s in starts])
    if difference:
        raise DistributedError(START, f"ranks were given different problems: {difference}")
    if len({s.work for s in starts}) > 1:  # the same problems at one depth cost the same, unless the code differs
        raise DistributedError(START, "ranks split the same problems differently (is fusedattn_select "
                               "one version on every rank?): " + "; ".join(
                                   f"rank {s.facts.rank} work digest {s.work}" for s in starts))


def _take(selector: Selector, facts: Sequence[RankFacts], results: Sequence[Share], me: RankFacts,
          items: Sequence[WorkItem], depth: ProbeDepth) -> Received:
    """Store and hold what the other ranks of this platform warmed."""
    configs = {item.key: item.config for item in items}
    decisions = plans = present = plan_bytes = 0
    skipped: list[tuple[str, str]] = []
    for sender, share in zip(facts, results):
        if sender.rank == me.rank or sender.platform != me.platform:
            continue
        shared_store = sender.shares_store_with(me)
        for row in share.decisions:
            reason = receive_decision(selector, configs[row.key], row, depth, shared_store)
            if reason:
                skipped.append((f"decision {row.key} from rank {sender.rank}", reason))
            else:
                decisions += 1
        if shared_store:
            continue
        for plan in share.plans:
            outcome = receive_plan(selector, plan, sender, me)
            if outcome == ACCEPTED:
                plans, plan_bytes = plans + 1, plan_bytes + plan.size
            elif outcome == PRESENT:
                present += 1
            else:
                skipped.append((f"plan {plan.plan_key[:16]} from rank {sender.rank}", outcome))
    for row, reason in skipped:
        log.warning("fusedattn_select: shared warmup: not taken: %s: %s", row, reason)
    return Received(decisions, plans, present, plan_bytes, tuple(skipped))


def _combined(items: Sequence[WorkItem], duplicates: int, facts: Sequence[RankFacts], results: Sequence[Share],
              peers: Sequence[RankFacts], local: WarmupReport) -> WarmupReport:
    """One row per problem, from the rank of this platform that warmed it, in the given order."""
    platform_ranks = {p.rank for p in peers}
    rows = {row.cache_key: row for f, share in zip(facts, results) if f.rank in platform_ranks for row in share.rows}
    ordered = tuple(dataclasses.replace(rows[item.key], also_named=item.also_named) for item in items)
    return WarmupReport(rows=ordered, wall_seconds=local.wall_seconds, depth=local.depth, jobs=local.jobs,
                        duplicates=duplicates, plan_note=local.plan_note)
