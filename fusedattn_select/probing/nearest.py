"""The recorded problems nearest to one a snapshot holds no answer for: pointers, never answers.

A snapshot answers only the problems it recorded. Where it holds none for the problem asked, the
closest recorded problems show what was recorded nearby: each with the fields in which it differs
from the problem asked and its own recorded verdicts. They are OTHER problems: their verdicts say
nothing certain about the one asked, and nothing here turns them into its answer.

"Closest" is a sort, best first, by:
1. the same candidate backend (qkv_dtype's family: fp16/bf16 ask F16, fp8 asks FP8) before another;
2. the same phases (`is_training`: forward only, or forward and backward) before other phases;
3. fewer differing fields of the problem class (every field but the shape: heads, head dims, mask,
   layout, ...), so the asked class recorded at another shape comes first; a derived field that
   differs with the field it is derived from (head_dim_v with head_dim_qk) counts as one;
4. fewer differing shape fields (batch_size, seqlen_q, seqlen_kv, num_pages);
5. a smaller size distance: over the numeric fields that differ, the sum of |log2(recorded/asked)|,
   so twice and half as large are equally far;
6. the recorded name, then the cache key: ties always break the same way.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, NamedTuple

from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.problem_classes import SHAPE_FIELDS
from fusedattn_select.types import Backend, Outcome, ProbeDepth, Verdict

# The fields whose values are sizes: a difference in them has a distance (how much larger or smaller).
SIZE_FIELDS = frozenset((
    "batch_size", "num_heads_q", "num_heads_kv", "seqlen_q", "seqlen_kv", "head_dim_qk", "head_dim_v",
    "page_size", "num_pages",
))
_SHAPE = frozenset(SHAPE_FIELDS)
NEAREST_LIMIT = 3
FIELDS = tuple(f.name for f in dataclasses.fields(AttnConfig))
_GIVEN = operator.attrgetter(*FIELDS)  # a config's FIELDS values in one call
_CLOSENESS = operator.itemgetter(0)
# Each field's kind, in FIELDS order, for the cheap bound of closeness (see nearest).
_CLASS, _SHAPE_KIND, _DERIVED = "class", "shape", "derived"
# The fields AttnConfig derives when they are left None (its resolved_* values), each with the
# fields it is derived from. A derived field that differs together with one of its sources is one
# difference, not two (head_dim_v 64 where 128 was asked, because head_dim_qk is 64).
DERIVED_FROM = {
    "head_dim_v": ("head_dim_qk",),
    "o_dtype": ("qkv_dtype", "scaling_mode"),
    "do_dtype": ("qkv_dtype",),
    "dqkv_dtype": ("qkv_dtype", "o_dtype", "scaling_mode"),
    "o_format": ("qkv_layout",),
    "do_format": ("qkv_layout", "o_format"),
    "dqkv_layout": ("qkv_layout",),
    "bottom_right_diagonal": ("mask",),
    "attn_scale": ("head_dim_qk",),
    "scaling_mode": ("qkv_dtype",),
}
_KINDS = tuple(_DERIVED if name in DERIVED_FROM else _SHAPE_KIND if name in SHAPE_FIELDS else _CLASS
               for name in FIELDS)


@dataclass(frozen=True)
class RecordedProblem:
    """One problem a snapshot recorded: its entry's name and suite, the file, config and verdicts."""

    name: str
    suite: str
    file_name: str
    config: AttnConfig
    verdicts: tuple[Verdict, ...]

    @property
    def label(self) -> str:
        """"suite/name" as the recording named it (just the name when no suite was recorded)."""
        return f"{self.suite}/{self.name}" if self.suite else self.name

    @property
    def backend(self) -> Backend:
        """What its recorded verdicts select: its candidate when every phase is supported, else NONE."""
        if self.verdicts and all(v.supported for v in self.verdicts):
            return self.config.candidate
        return Backend.NONE

    @property
    def answer(self) -> str:
        """Its recorded answer as `why` names answers: "F16" / "FP8" when every phase is supported,
        "NONE" when one was refused, else "failed" (a probe failed: no answer) or "no data"."""
        outcomes = {v.outcome for v in self.verdicts}
        if Outcome.UNSUPPORTED in outcomes or self.backend is not Backend.NONE:
            return self.backend.value
        return "failed" if Outcome.FAILED in outcomes else "no data"

    @property
    def reasons(self) -> tuple[str, ...]:
        """One line per recorded verdict that is not a "yes" (empty when it is selected)."""
        return tuple(v.reason() for v in self.verdicts if not v.supported)

    @property
    def depths(self) -> tuple[ProbeDepth, ...]:
        """The depths its verdicts were recorded at, each once."""
        return tuple(dict.fromkeys(v.depth for v in self.verdicts))

    @cached_property
    def values(self) -> FieldValues:
        """Its field values, as `differences` compares them."""
        # Made once per recorded problem, on its first comparison, not when a snapshot loads.
        return FieldValues(self.config)


class FieldValues:
    """A config's field values as given, in FIELDS order; derived ones also as resolved."""

    __slots__ = ("config", "given")

    def __init__(self, config: AttnConfig) -> None:
        self.config = config
        self.given = _GIVEN(config)

    def resolved(self, name: str) -> Any:
        """A derived field's value as AttnConfig resolves it (its `resolved_<name>`)."""
        return getattr(self.config, "resolved_" + name)


class Difference(NamedTuple):
    """One field in which a recorded problem differs from the problem asked (derived ones resolved)."""

    # A NamedTuple, not a dataclass: one question makes thousands (a few per recorded problem).
    field: str
    asked: Any
    recorded: Any

    def describe(self) -> str:
        """"seqlen_q=1024 (asked 1000)"."""
        return f"{self.field}={_shown(self.recorded)} (asked {_shown(self.asked)})"


@dataclass(frozen=True)
class NearProblem:
    """A recorded problem near the one asked: the problem and the fields in which it differs."""

    problem: RecordedProblem
    differences: tuple[Difference, ...]

    def describe(self) -> str:
        """One line: its name, where it was recorded and its recorded answer."""
        problem = self.problem
        depth = "/".join(d.value for d in problem.depths) or "-"
        # A probe that failed when it was recorded is no answer, never shown as a refusal (NONE).
        answer = "no answer (its probe failed)" if problem.answer == "failed" else problem.answer
        if problem.reasons:
            answer += ": " + "; ".join(problem.reasons)
        return f"{problem.label} [{problem.file_name}]: recorded {answer} (depth {depth})"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON; the recorded verdicts under `recorded_*` keys, never as an answer."""
        problem = self.problem
        return {
            "name": problem.name,
            "suite": problem.suite,
            "snapshot": problem.file_name,
            "cache_key": problem.config.cache_key(),
            "differs": [{"field": d.field, "asked": d.asked, "recorded": d.recorded} for d in self.differences],
            "recorded_backend": problem.backend.value,
            "recorded_answer": problem.answer,
            "recorded_reasons": list(problem.reasons),
            "recorded_verdicts": [v.to_dict() for v in problem.verdicts],
            "config": problem.config.to_dict(),
        }


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(str(v) for v in value) + ")"
    return str(value)


def differences(asked: AttnConfig | FieldValues, recorded: RecordedProblem) -> tuple[Difference, ...]:
    """The fields in which `recorded` differs from `asked`, in AttnConfig's order.

    A derived field (DERIVED_FROM) is compared as resolved (head_dim_v None is head_dim_qk), but
    one that both leave None is not listed: it follows its source, which is.
    """
    mine = asked if isinstance(asked, FieldValues) else FieldValues(asked)
    theirs = recorded.values
    found = []
    # Equal as given is equal as resolved, and both None is derived alike from the sources: only the
    # fields given differently are looked at (a few of the thirty).
    for name, asked_value, recorded_value in [
        item for item in zip(FIELDS, mine.given, theirs.given) if item[1] != item[2]
    ]:
        if name in DERIVED_FROM:
            asked_value, recorded_value = mine.resolved(name), theirs.resolved(name)
            if asked_value == recorded_value:
                continue
        found.append(Difference(name, asked_value, recorded_value))
    return tuple(found)


def counted(found: tuple[Difference, ...]) -> tuple[Difference, ...]:
    """The differences that count for closeness: a derived field that differs with one of its
    sources is part of that source's difference."""
    names = {d.field for d in found}
    if names.isdisjoint(DERIVED_FROM):
        return found
    return tuple(d for d in found if not names.intersection(DERIVED_FROM.get(d.field, ())))


def size_distance(found: Iterable[Difference]) -> float:
    """Sum of |log2(recorded/asked)| over the size fields among `found` that both give as positive."""
    total = 0.0
    for field, asked, recorded in found:
        if field in SIZE_FIELDS and type(asked) is int and type(recorded) is int and asked > 0 and recorded > 0:
            total += abs(math.log2(recorded / asked))
    return total


def closeness(asked: AttnConfig, problem: RecordedProblem, found: tuple[Difference, ...]) -> tuple:
    """The sort key of `problem` (with `found`, its differences from `asked`): smaller is closer."""
    kept = counted(found)
    shape = 0
    for difference in kept:
        if difference.field in _SHAPE:
            shape += 1
    config = problem.config
    return (
        config.candidate is not asked.candidate, config.is_training != asked.is_training,
        len(kept) - shape, shape, size_distance(kept), problem.label, config.cache_key(),
    )


def nearest(asked: AttnConfig, recorded: Iterable[RecordedProblem],
            limit: int = NEAREST_LIMIT) -> tuple[NearProblem, ...]:
    """The `limit` recorded problems closest to `asked` (see the module's docstring), best first.

    The problem asked itself (same cache key) is left out: it is the question, not a neighbour.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigError("limit", limit, "must be a non-negative integer")
    if limit == 0:
        return ()
    key = asked.cache_key()
    mine = FieldValues(asked)
    # Every problem gets a cheap lower bound of its closeness; only those whose bound can still beat
    # the `limit` closest found so far get the full comparison (a few of a snapshot's hundreds).
    bounds = sorted(
        (_bound(asked, mine, problem), index, problem) for index, problem in enumerate(recorded)
        if problem.config.cache_key() != key
    )
    chosen: list[tuple[tuple, RecordedProblem, tuple[Difference, ...]]] = []
    for bound, _, problem in bounds:
        if len(chosen) >= limit and bound > chosen[-1][0][:len(bound)]:
            break
        found = differences(mine, problem)
        chosen = sorted([*chosen, (closeness(asked, problem, found), problem, found)], key=_CLOSENESS)[:limit]
    return tuple(NearProblem(problem, found) for _, problem, found in chosen)


def _bound(asked: AttnConfig, mine: FieldValues, problem: RecordedProblem) -> tuple[bool, bool, int, int]:
    """closeness's first four terms, or less: derived fields given differently may not differ."""
    kinds = [kind for kind, a, b in zip(_KINDS, mine.given, problem.values.given) if a != b]
    config = problem.config
    return (config.candidate is not asked.candidate, config.is_training != asked.is_training,
            kinds.count(_CLASS), kinds.count(_SHAPE_KIND))
