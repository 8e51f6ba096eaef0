"""Selection: the selector's answer for one problem, as callers receive it."""

from __future__ import annotations

from dataclasses import dataclass, field

from fusedattn_select.config import AttnConfig
from fusedattn_select.types import Backend, Outcome, Provenance, Verdict


@dataclass(frozen=True)
class Selection:
    """The selector's answer for one problem.

    `backend` is the chosen backend (or NONE), `message` is "" when one is selected and otherwise
    the reasons joined by "; ". `reasons` holds one line per rejected graph or rule; `verdicts`
    holds every per-phase answer with its provenance. `notice` says when the engine is not what
    the caller named (no GPU here: answered from a bundled snapshot). `no_data` is True when the
    backend is NONE only because the source holds no answer, not because of a verdict.
    `plan_form` says which graphs the verdicts are about and attention() runs: the problem's shape
    bucket ("bucket B=4 S_q=1024 S_kv=1024: ragged, padding mask") or its exact shape ("dense");
    "" where the engine answers for the problem as recorded.
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
    plan_form: str = ""

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
            "config": self.config.to_dict() if self.config is not None else None,
        }
