"""Selection: the selector's answer for one problem, as callers receive it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from fusedattn_select.config import AttnConfig
from fusedattn_select.planning.forms import AS_ASKED, PlanForm
from fusedattn_select.types import Backend, Outcome, Phase, Provenance, Verdict


class Change(NamedTuple):
    """One field in which an alternative differs from the problem asked."""

    field: str
    asked: Any
    instead: Any

    def describe(self) -> str:
        return f"{self.field} {self.asked} -> {self.instead}"


# Verdicts given by a cache: an alternative shows where they were first answered (its `origin`).
_CACHED = (Provenance.MEMORY_CACHE, Provenance.PERSISTENT_CACHE)


@dataclass(frozen=True)
class Alternative:
    """Another problem, one or two fields away from the one asked, that the engine which answered
    NONE answers with a backend: a suggestion, never an answer for the problem asked.

    `kind` names the change in the user's words ("pad head dim", "fp16 instead of bf16");
    `changes` lists every field that differs, derived ones too; `config` is that problem and
    `verdicts` the answers of `engine` for it, or for `answered_by` where a snapshot answers it
    through the recorded problem at its default scale; `extra_flops_percent` is what a padded head
    dim costs in attention FLOPs, per pass; `note` says what using it takes; `origin` is the
    engine's own provenance (live_probe, snapshot), shown where the decision cache gave the verdicts.
    """

    kind: str
    changes: tuple[Change, ...]
    backend: Backend
    config: AttnConfig
    verdicts: tuple[Verdict, ...]
    note: str = ""
    extra_flops_percent: tuple[tuple[Phase, float], ...] = ()
    plan: PlanForm = AS_ASKED
    engine: str = ""
    origin: Provenance | None = None
    answered_by: AttnConfig | None = None

    @property
    def plan_form(self) -> str:
        return self.plan.describe()

    @property
    def provenance(self) -> tuple[Provenance, ...]:
        """Where its verdicts were answered: a live probe, a snapshot row, a rule; also when the
        decision cache gave them (from_cache)."""
        return tuple(dict.fromkeys(self.origin if v.provenance in _CACHED and self.origin else v.provenance
                                   for v in self.verdicts))

    @property
    def from_cache(self) -> bool:
        return any(v.provenance in _CACHED for v in self.verdicts)

    def describe(self) -> str:
        """One line: the change, the answer, its cost and where the answer came from."""
        changes = ", ".join(c.describe() for c in self.changes)
        cost = "".join(f"; +{pct:.1f}% {phase.value} attention FLOPs" for phase, pct in self.extra_flops_percent)
        provenance = "/".join(p.value for p in self.provenance) + (", cached" if self.from_cache else "")
        provenance += f" from {self.engine}" if self.engine else ""
        note = f"; {self.note}" if self.note else ""
        return f"{self.kind} ({changes}): {self.backend.value}{cost} [{provenance}]{note}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "changes": [{"field": c.field, "asked": c.asked, "instead": c.instead} for c in self.changes],
            "backend": self.backend.value,
            "extra_flops_percent": {phase.value: round(percent, 2) for phase, percent in self.extra_flops_percent}
            or None,
            "note": self.note,
            "plan_form": self.plan_form,
            "provenance": [p.value for p in self.provenance],
            "from_cache": self.from_cache,
            "engine": self.engine,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "config": self.config.to_dict(),
            "answered_by": None if self.answered_by is None else self.answered_by.to_dict(),
        }


@dataclass(frozen=True)
class Selection:
    """The selector's answer for one problem.

    `backend` is the chosen backend (or NONE), `message` is "" when one is selected and otherwise
    the reasons joined by "; ". `reasons` holds one line per rejected graph or rule; `verdicts`
    holds every per-phase answer with its provenance. `notice` says when the engine is not what
    the caller named (no GPU here: answered from a bundled snapshot). `no_data` is True when the
    backend is NONE only because the source holds no answer, not because of a verdict.
    `plan` says which graphs the verdicts are about and attention() runs (planning.forms.PlanForm:
    the problem's shape bucket, a decode step's heads as batch, its exact shape, or the problem as
    asked); `plan_form` is its text.
    `alternatives` (empty unless asked: select(cfg, alternatives=True), or `why`) are other problems
    the same engine supports, one or two fields away, found with `alternative_probes` engine calls
    (graph probes on a GPU); neither takes part in equality: an answer is the same with or without them.
    """

    backend: Backend
    message: str
    reasons: tuple[str, ...] = ()
    verdicts: tuple[Verdict, ...] = ()
    candidate: Backend = Backend.NONE
    from_cache: bool = False
    probe_ms: float = 0.0
    config: "AttnConfig | None" = field(default=None, compare=False)
    cache_key: str = ""
    engine: str = ""
    notice: str = ""
    plan: PlanForm = AS_ASKED
    alternatives: tuple[Alternative, ...] = field(default=(), compare=False)
    alternative_probes: int = field(default=0, compare=False)

    @property
    def selected(self) -> bool:
        return self.backend is not Backend.NONE

    @property
    def no_data(self) -> bool:
        """NONE for want of data: every verdict that is not a "yes" is NO_DATA (no refusal, no incident)."""
        unanswered = [v for v in self.verdicts if not v.supported]
        return bool(unanswered) and all(v.outcome is Outcome.NO_DATA for v in unanswered)

    @property
    def provenance(self) -> tuple[Provenance, ...]:
        return tuple(dict.fromkeys(v.provenance for v in self.verdicts))

    @property
    def plan_form(self) -> str:
        """Which graphs run, as users read it ("bucket B=4 S_q=1024 S_kv=1024 (ragged thd_thd_thd,
        padding)", "dense"; "" for the problem as asked)."""
        return self.plan.describe()

    def as_asked(self, cfg: AttnConfig) -> Selection:
        """This answer with `cfg` as its config: another spelling of a cached problem (the same cache key,
        say a causal window (-1, 0) for (-1, -1)) gets the config it asked with, not the first asker's."""
        return self if self.config is cfg or self.config == cfg else replace(self, config=cfg)

    def to_dict(self) -> dict:
        return {
            "backend": self.backend.value,
            "candidate": self.candidate.value,
            "no_data": self.no_data,
            "message": self.message,
            "reasons": list(self.reasons),
            "verdicts": [v.to_dict() for v in self.verdicts],
            "from_cache": self.from_cache,
            "probe_ms": round(self.probe_ms, 4),
            "cache_key": self.cache_key,
            "engine": self.engine,
            "notice": self.notice,
            "plan_form": self.plan_form,
            "alternatives": [a.to_dict() for a in self.alternatives],
            "alternative_probes": self.alternative_probes,
            "config": self.config.to_dict() if self.config is not None else None,
        }
