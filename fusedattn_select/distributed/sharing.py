"""What ranks of one platform send each other after warming their shares, and the checks on receipt.

Decisions travel as verdict rows (a few hundred bytes each). Serialized plans (~82 KB each) travel
only when some rank of the platform uses another store (another node, or another cache directory):
ranks that share a persistent store already hold each other's plans. A received plan is used only
as `cache import` would: its sender's fingerprint description must hash to the key it claims and
equal the receiver's, and the blob must match its size and sha256; it then goes into the store
with put_plan, so dispatch finds it there (and checks it again when it loads it).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Sequence

from fusedattn_select.config import AttnConfig
from fusedattn_select.distributed.agreement import pin
from fusedattn_select.distributed.facts import RankFacts
from fusedattn_select.distributed.work import WorkItem
from fusedattn_select.plan_store.persistence import persists_plans
from fusedattn_select.planning.planner import plan_forms
from fusedattn_select.probing.engine_protocol import PlanBuilder
from fusedattn_select.selection.local_warmup import WarmupRow
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Backend, Outcome, ProbeDepth, Verdict

log = logging.getLogger("fusedattn_select")


@dataclass(frozen=True)
class DecisionRow:
    """The verdicts of one problem as its owner holds them."""

    key: str
    verdicts: tuple[Verdict, ...]
    depth: ProbeDepth


@dataclass(frozen=True)
class PlanRow:
    """One serialized plan, filed under the sender's fingerprint key."""

    plan_key: str
    fingerprint_key: str
    size: int
    sha256: str
    blob: bytes = field(repr=False)


@dataclass(frozen=True)
class Share:
    """One rank's results: its warmup rows, decisions, and plans when another store needs them."""

    rows: tuple[WarmupRow, ...]
    decisions: tuple[DecisionRow, ...]
    plans: tuple[PlanRow, ...]

    @property
    def plan_bytes(self) -> int:
        return sum(p.size for p in self.plans)


def outgoing(selector: Selector, share: Sequence[WorkItem], rows: Sequence[WarmupRow], depth: ProbeDepth,
             with_plans: bool) -> Share:
    """The Share of this rank's warmed items: failed rows carry no decision (incidents are not cached)."""
    by_key = {row.cache_key: row for row in rows}
    decisions: list[DecisionRow] = []
    plans: list[PlanRow] = []
    for item in share:
        row = by_key[item.key]
        if row.probe_failed:
            continue
        decisions.append(decision_row(selector, item.config, depth))
        if with_plans and row.backend is not Backend.NONE:
            plans.extend(stored_plans(selector, item.config, row.backend))
    return Share(tuple(rows), tuple(decisions), tuple(plans))


def decision_row(selector: Selector, cfg: AttnConfig, depth: ProbeDepth) -> DecisionRow:
    """The stored verdicts of a warmed problem, else (no store, or a rule decided) the selector's."""
    key = cfg.cache_key()
    stored = selector.store.get(selector.fingerprint, key) if selector.store is not None else None
    if stored is not None:
        return DecisionRow(key, tuple(stored[0]), stored[1])
    return DecisionRow(key, tuple(selector.select(cfg, depth).verdicts), depth)


def stored_plans(selector: Selector, cfg: AttnConfig, backend: Backend) -> list[PlanRow]:
    """The serialized plans the store holds for what attention() runs of `cfg` (none without an
    engine that builds plans): the plans warmup built, found by the same plan forms and keys."""
    engine, store, fingerprint = selector.engine, selector.store, selector.fingerprint
    if not isinstance(engine, PlanBuilder) or store is None or not persists_plans(store):
        return []
    forms, _ = plan_forms(selector, cfg, selector.select(cfg, ProbeDepth.FULL))
    rows = []
    for form in forms:
        for phase in form.phases:
            key = engine.plan_key(form, backend, phase)
            if isinstance(key, Verdict):
                continue  # no such graph: warmup built no plan for it either
            blob = store.get_plan(fingerprint, key)
            if blob is not None:
                rows.append(PlanRow(key, fingerprint.key(), len(blob), hashlib.sha256(blob).hexdigest(), blob))
    return rows


# ----- on receipt ---------------------------------------------------------------------------------
ACCEPTED, PRESENT = "accepted", "present"
ANSWERS = (Outcome.SUPPORTED, Outcome.UNSUPPORTED)  # the only verdicts a store keeps


def plan_refusal(row: PlanRow, sender: RankFacts, me: RankFacts) -> str:
    """Why this rank must not use `row` from `sender` ("" when it may), as `cache import` checks."""
    if not sender.fingerprint_checks_out():
        return f"rank {sender.rank}'s fingerprint description does not hash to its key {sender.fingerprint_key[:12]}"
    if row.fingerprint_key != sender.fingerprint_key:
        return f"filed under fingerprint {row.fingerprint_key[:12]}, not rank {sender.rank}'s"
    if row.fingerprint_key != me.fingerprint_key or sender.source != me.source:
        return f"from another platform ({sender.describe()})"
    if len(row.blob) != row.size:
        return f"blob has {len(row.blob)} bytes, the row says {row.size} (truncated)"
    if hashlib.sha256(row.blob).hexdigest() != row.sha256:
        return "sha256 of the blob does not match the row"
    return ""


def receive_plan(selector: Selector, row: PlanRow, sender: RankFacts, me: RankFacts) -> str:
    """ACCEPTED, PRESENT (the store already held it), or why the plan was not taken."""
    refusal = plan_refusal(row, sender, me)
    if refusal:
        return refusal
    store = selector.store
    if store is None or not persists_plans(store):
        return "this rank's store keeps no plans"
    if store.get_plan(selector.fingerprint, row.plan_key) is not None:
        return PRESENT
    if not store.put_plan(selector.fingerprint, row.plan_key, row.blob):
        return "the store refused the plan (see the warning)"
    return ACCEPTED


def receive_decision(selector: Selector, cfg: AttnConfig, row: DecisionRow, depth: ProbeDepth,
                     shared_store: bool) -> str:
    """Hold `row` as this rank's answer for `cfg` (store, then memory); "" or why it was not taken."""
    if any(v.outcome not in ANSWERS for v in row.verdicts):
        return "holds no answer (a failed probe, or no data), which is never cached"
    store = selector.store
    if store is None:
        pin(selector, cfg, row.verdicts, row.depth)
        return ""
    if not shared_store or store.get(selector.fingerprint, row.key) is None:
        store.put(selector.fingerprint, row.key, row.verdicts, row.depth)
        if store.get(selector.fingerprint, row.key) is None:  # refused (full, locked): memory only
            pin(selector, cfg, row.verdicts, row.depth)
            return ""
    selector.select(cfg, depth)  # a store hit, read into memory: never a probe
    return ""
