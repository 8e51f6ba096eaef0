"""What each rank says about itself before any work is shared: where it runs and what answers it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Fingerprint


@dataclass(frozen=True)
class RankFacts:
    """One rank's platform, engine and store, as the other ranks see it.

    `source` is the engine's provenance (live_probe, snapshot, declared) or "none". `store` names
    the store so that ranks can tell when they share one: (host, database path) for a persistent
    store, which every process of that host opening that file shares; (host, process id) for a
    store private to the process; () for none.
    """

    rank: int
    host: str
    fingerprint: dict
    fingerprint_key: str
    source: str
    engine: str
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
                   engine.provenance.value if engine is not None else "none", selector.engine_name, where)

    @property
    def platform(self) -> tuple[str, str]:
        """What makes two ranks' answers interchangeable: the fingerprint and the kind of engine."""
        return (self.fingerprint_key, self.source)

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
