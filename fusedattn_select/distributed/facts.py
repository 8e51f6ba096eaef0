"""What each rank says about itself before any work is shared: where it runs and what answers it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Hashable, Sequence

from fusedattn_select.distributed.group import DistributedError, ranks_phrase

from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Fingerprint


@dataclass(frozen=True)
class RankFacts:
    """One rank's platform, engine and store, as the other ranks see it.

    `source` is the engine's provenance (live_probe, snapshot, declared) or "none". `answers` says
    which answers the engine gives beyond its fingerprint: for a snapshot engine the sha256 of its
    files' contents (a copy with one verdict edited is another platform, whatever its file name),
    else the engine's name. `store` names the store so that ranks can tell when they share one:
    (host, database path) for a persistent store, which every process of that host opening that
    file shares; (host, process id) for a store private to the process; () for none.
    """

    rank: int
    host: str
    fingerprint: dict
    fingerprint_key: str
    source: str
    engine: str
    answers: str
    store: tuple[str, ...]

    @classmethod
    def of(cls, rank: int, host: str, selector: Selector) -> "RankFacts":
        fingerprint = selector.fingerprint
        engine = selector.engine
        store = selector.store
        if store is None:
            where: tuple[str, ...] = ()
        elif store.persistent and store.path is not None:
            where = (host, str(os.path.realpath(store.path)))
        else:
            where = (host, f"pid {os.getpid()}")
        return cls(rank, host, fingerprint.to_dict(), fingerprint.key(),
                   engine.provenance.value if engine is not None else "none", selector.engine_name,
                   _answers_identity(selector), where)

    @property
    def platform(self) -> tuple[str, str, str]:
        """What makes two ranks' answers interchangeable: the fingerprint, the kind of engine and
        (for recorded answers) which recording. A shared warmup shares decisions only within a
        platform, so what a rank stores from another is what its own engine answers."""
        return (self.fingerprint_key, self.source, self.answers)

    def fingerprint_checks_out(self) -> bool:
        """Whether the fingerprint description hashes to the key this rank claims (as `cache import` checks)."""
        try:
            return Fingerprint.from_dict(self.fingerprint).key() == self.fingerprint_key
        except (KeyError, TypeError, ValueError):
            return False

    def describe(self) -> str:
        """The platform in words: device, versions, and the engine that answers."""
        try:
            device = Fingerprint.from_dict(self.fingerprint).describe()
        except (KeyError, TypeError, ValueError):
            device = f"fingerprint {self.fingerprint_key[:12]}"
        return f"{device} [{self.engine}]"

    def shares_store_with(self, other: "RankFacts") -> bool:
        return bool(self.store) and self.store == other.store


def _answers_identity(selector: Selector) -> str:
    """The sha256 of a snapshot engine's files in load order (their answers), else the engine's name."""
    engine = selector.engine
    if not isinstance(engine, SnapshotEngine):
        return selector.engine_name
    return "sha256:" + engine.content_sha256()[:16]


def require_same(step: str, argument: str, values: Sequence[tuple[int, Hashable]]) -> None:
    """Raise DistributedError naming each value and its ranks when (rank, value) pairs differ.

    For the call's arguments that every rank must pass alike; every rank decides from the same
    exchanged values, so every rank raises the same error.
    """
    by_value: dict[Hashable, list[int]] = {}
    for rank, value in values:
        by_value.setdefault(value, []).append(rank)
    if len(by_value) > 1:
        raise DistributedError(step, f"ranks passed different {argument}: " + "; ".join(
            f"{ranks_phrase(ranks)} {argument}={value}" for value, ranks in by_value.items())
            + f"; every rank must pass the same {argument}")
