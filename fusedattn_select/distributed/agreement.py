"""agree(): every rank of a group holds the same Selection for each problem, or is told why not.

Each rank selects every problem locally, then the ranks exchange what they found (their platform
and, per problem, the backend and reasons: a few hundred bytes). Where every rank gave the same
answer, each keeps its own. Where they differ, every rank answers NONE, the answer safe on all of
them, with a message naming each group of ranks, its platform and its answer; that answer is
pinned in the rank's selector, so later select() and attention() calls return it (memory only:
the persistent store keeps each platform's own verdicts).

Ranks on different platforms (fingerprint, a snapshot on one and live cuDNN on another, or two
snapshots whose contents differ) that give the same answers each keep their own answer, probed on
their own platform: nothing is merged, and the platforms are reported and logged. strict=True
answers NONE for every problem instead. Only the lowest rank logs (one line per disagreement, one
for mixed platforms).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from fusedattn_select.config import AttnConfig
from fusedattn_select.distributed.facts import RankFacts, require_same
from fusedattn_select.distributed.group import (
    DEFAULT_TIMEOUT_S,
    Communicator,
    DistributedError,
    ranks_phrase,
    tell_others,
)
from fusedattn_select.distributed.work import Configs, named_problems, problem_difference
from fusedattn_select.result import Selection
from fusedattn_select.selection.local_warmup import check_callers
from fusedattn_select.selection.selector import Selector, default_selector
from fusedattn_select.types import Backend, Fingerprint, Outcome, ProbeDepth, Provenance, Verdict

log = logging.getLogger("fusedattn_select")

STAGE = "agreement"  # the stage of the NONE verdicts an agreement pins
STEP = "agreement"  # agree()'s one exchange


@dataclass(frozen=True)
class Answer:
    """One rank's answer for one problem, as compared across ranks."""

    backend: Backend
    reasons: tuple[str, ...]

    @classmethod
    def of(cls, selection: Selection) -> "Answer":
        return cls(selection.backend, tuple(selection.reasons))

    def describe(self) -> str:
        return self.backend.value if not self.reasons else f"NONE ({'; '.join(self.reasons)})"


@dataclass(frozen=True)
class Statement:
    """What one rank contributes to an agreement: itself, the problems it was asked (cache key ->
    its first name there), its answer to each by cache key (ranks may list them in any order), and
    the arguments every rank must pass alike (depth, strict)."""

    facts: RankFacts
    names: dict[str, str]
    answers: dict[str, Answer]
    depth: ProbeDepth
    strict: bool


@dataclass(frozen=True)
class Disagreement:
    """A problem the ranks answered differently; `message` is what every rank's NONE says."""

    name: str
    cache_key: str
    message: str


@dataclass(frozen=True)
class PlatformGroup:
    """Ranks on one platform (RankFacts.platform), described by its first rank's facts."""

    ranks: tuple[int, ...]
    first: RankFacts

    @property
    def fingerprint(self) -> Fingerprint:
        return Fingerprint.from_dict(self.first.fingerprint)

    @property
    def source(self) -> str:
        return self.first.source

    @property
    def description(self) -> str:
        return self.first.describe()


@dataclass(frozen=True)
class AgreementReport:
    """The selections this rank holds after agreement (by problem name) and what differed."""

    selections: dict[str, Selection]
    disagreements: tuple[Disagreement, ...]
    platforms: tuple[PlatformGroup, ...]
    rank: int
    ranks: tuple[int, ...]
    strict: bool = False

    @property
    def agreed(self) -> bool:
        return not self.disagreements

    def selection(self, name: str, cache_key: str) -> Selection | None:
        """The selection of the problem `name` with `cache_key` (its name here may be qualified)."""
        found = self.selections.get(qualified(name, cache_key))
        return found if found is not None else self.selections.get(name)

    @property
    def mixed_platforms(self) -> bool:
        return len(self.platforms) > 1

    def summary(self) -> str:
        text = (f"{len(self.ranks)} ranks, {len(self.selections)} problems: "
                f"{len(self.selections) - len(self.disagreements)} agreed, {len(self.disagreements)} disagreed")
        if self.mixed_platforms:
            text += f"; ranks on {len(self.platforms)} platforms: " + "; ".join(
                f"{ranks_phrase(p.ranks)} on {p.description}" for p in self.platforms)
        return text

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "ranks": list(self.ranks),
            "strict": self.strict,
            "selections": {name: s.backend.value for name, s in self.selections.items()},
            "disagreements": [{"name": d.name, "cache_key": d.cache_key, "message": d.message}
                              for d in self.disagreements],
            "platforms": [{"ranks": list(p.ranks), "fingerprint": p.fingerprint.key(), "source": p.source,
                           "description": p.description} for p in self.platforms],
        }


def agree(configs: Configs, group: object = None, *, selector: Selector | None = None,
          depth: str | ProbeDepth = "fast", strict: bool = False,
          timeout: float = DEFAULT_TIMEOUT_S) -> AgreementReport:
    """Make every rank of `group` (default: the whole job) hold the same Selection for each problem.

    `configs` and `selector` are what selection.local_warmup.warmup takes (a ConfigFile, its
    entries, AttnConfigs, (name, AttnConfig) pairs) and are checked as it checks them, before any
    selection: the ConfigError is this rank's, told first to the other ranks at the exchange (each
    raises DistributedError naming it). Every rank must call it with the same problems, `depth` and `strict` (else
    every rank raises DistributedError naming them, and nothing is pinned). Selects each problem with
    `selector` (default: the process's) at `depth`, exchanges the answers, and where ranks differ
    pins NONE naming the ranks, their platforms and their answers. Raises DistributedError on every
    rank when one rank raised or `timeout` seconds passed without a rank arriving. Without a process
    group, or with a group of one rank, it selects locally and communicates nothing.
    """
    try:
        probe_depth = ProbeDepth.parse(depth, "depth")
        problems = distinct_names(named_problems(configs))
        check_callers(selector, None)  # as warmup() checks it: before this rank's part of the exchange
        selector = selector if selector is not None else default_selector()
    except Exception as err:  # noqa: BLE001 - told to every rank, then raised: not only this library's errors
        tell_others(STEP, err, group, timeout)  # else the other ranks would only see this rank go missing
        raise
    comm = Communicator(group, timeout)
    local: list[Selection] = []

    def state() -> Statement:
        statement, selections = local_statement(comm, selector, problems, probe_depth, strict)
        local.extend(selections)
        return statement

    return conclude(comm, comm.exchange(STEP, state), problems, local, selector, strict)


def distinct_names(problems: Sequence[tuple[str, AttnConfig]]) -> list[tuple[str, AttnConfig]]:
    """Problems by name, once each (a name repeated for the same problem counts once). A name given to
    different problems (unnamed configs that `describe` alike, one name in two config files) is
    qualified by each one's cache key, whatever their order, so every problem keeps its answer."""
    keys: dict[str, set[str]] = {}
    for name, cfg in problems:
        keys.setdefault(name, set()).add(cfg.cache_key())
    named: dict[str, AttnConfig] = {}
    for name, cfg in problems:
        named.setdefault(name if len(keys[name]) == 1 else qualified(name, cfg.cache_key()), cfg)
    return list(named.items())


def qualified(name: str, cache_key: str) -> str:
    """The name of a problem whose name also names another problem."""
    return f"{name} [{cache_key}]"


def local_statement(comm: Communicator, selector: Selector, problems: Sequence[tuple[str, AttnConfig]],
                    depth: ProbeDepth, strict: bool) -> tuple[Statement, list[Selection]]:
    """This rank's statement and its own selections (which stay on the rank)."""
    selections = [selector.select(cfg, depth) for _, cfg in problems]
    facts = RankFacts.of(comm.rank, comm.host, selector)
    names: dict[str, str] = {}
    answers: dict[str, Answer] = {}
    for (name, cfg), selection in zip(problems, selections):
        names.setdefault(cfg.cache_key(), name)
        answers.setdefault(cfg.cache_key(), Answer.of(selection))
    statement = Statement(facts, names, answers, depth, strict)
    return statement, selections


def conclude(comm: Communicator, statements: list[Statement], problems: Sequence[tuple[str, AttnConfig]],
             local: list[Selection], selector: Selector, strict: bool) -> AgreementReport:
    """Decide from every rank's statement (the same on every rank), pin NONE where they differ.

    Ranks called with different depth, strict or problems raise DistributedError before any pin.
    """
    require_same("agreement", "depth", [(s.facts.rank, s.depth.value) for s in statements])
    require_same("agreement", "strict", [(s.facts.rank, s.strict) for s in statements])
    _check_same_problems(statements)
    platforms = platform_groups([s.facts for s in statements])
    selections: dict[str, Selection] = {}
    disagreements: list[Disagreement] = []
    for index, (name, cfg) in enumerate(problems):
        message = _difference(statements, cfg.cache_key(), strict and len(platforms) > 1)
        if not message:
            selections[name] = local[index]
            continue
        disagreements.append(Disagreement(name, cfg.cache_key(), message))
        selections[name] = pin(selector, cfg, none_verdicts(cfg, message))
        (log.warning if comm.lowest else log.debug)(
            "fusedattn_select: %s (%s): %s; every rank answers NONE", name, cfg.cache_key(), message)
    if len(platforms) > 1 and comm.lowest:
        log.warning("fusedattn_select: ranks run on %d platforms (%s); %s", len(platforms),
                    "; ".join(f"{ranks_phrase(p.ranks)} on {p.description}" for p in platforms),
                    "strict: every problem is NONE on every rank" if strict else
                    "where their answers agree each rank keeps its own (never another platform's)")
    return AgreementReport(selections, tuple(disagreements), platforms, comm.rank, comm.ranks, strict)


def _check_same_problems(statements: list[Statement]) -> None:
    difference = problem_difference([(s.facts.rank, s.names) for s in statements])
    if difference:
        raise DistributedError("agreement", f"ranks were asked about different problems: {difference}")


def _difference(statements: list[Statement], key: str, platforms_differ: bool) -> str:
    """"" when the ranks agree on the problem with cache key `key`, else the message every rank's NONE carries."""
    answers = {s.answers[key] for s in statements}
    if len(answers) == 1 and not platforms_differ:
        return ""
    groups: dict[tuple[str, str], list[int]] = {}
    for s in statements:
        groups.setdefault((s.facts.describe(), s.answers[key].describe()), []).append(s.facts.rank)
    what = "ranks disagree" if len(answers) > 1 else "ranks run on different platforms (strict)"
    return what + ": " + " | ".join(f"{ranks_phrase(ranks)} on {platform}: {answer}"
                                    for (platform, answer), ranks in groups.items())


def platform_groups(facts: Sequence[RankFacts]) -> tuple[PlatformGroup, ...]:
    """Ranks grouped by platform, in rank order of each group's first rank."""
    groups: dict[tuple[str, str], list[RankFacts]] = {}
    for f in facts:
        groups.setdefault(f.platform, []).append(f)
    return tuple(
        PlatformGroup(tuple(f.rank for f in members), members[0])
        for members in groups.values()
    )


def none_verdicts(cfg: AttnConfig, message: str) -> tuple[Verdict, ...]:
    """NONE for every pass of `cfg`, decided by agreement (a decision, not a probe)."""
    return tuple(Verdict(cfg.candidate, phase, Outcome.UNSUPPORTED, STAGE, message,
                         provenance=Provenance.RULE, depth=ProbeDepth.FULL) for phase in cfg.phases)


def pin(selector: Selector, cfg: AttnConfig, verdicts: tuple[Verdict, ...],
        depth: ProbeDepth = ProbeDepth.FULL) -> Selection:
    """Make `selector` answer `cfg` with `verdicts` from memory from now on (never stored)."""
    return selector.pin(cfg, verdicts, depth)

