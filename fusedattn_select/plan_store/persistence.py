"""Plans in the persistent store: load a stored plan or build and store it, once per key across processes.

A plan that attention() runs is a graph built to ProbeDepth.FULL (kernels are compiled). A built
graph serializes into a blob (blob.py) that another process loads an order of magnitude faster
than it builds, so the persistent store keeps one blob per plan key (keys.py), filed under the
Fingerprint, and a later process loads instead of building. A blob that does not load is dropped
with a warning and rebuilt (the rebuilt blob replaces it).

`obtain` is the one load-or-build path: dispatch passes its own build and load (runtime/plans.py),
warmup an engine's (selection/plan_warmup.py). Torch-free.
"""

from __future__ import annotations

import logging
from typing import Callable, TypeVar

from fusedattn_select.single_flight import read_or_make
from fusedattn_select.store.protocol import Store
from fusedattn_select.types import Fingerprint

log = logging.getLogger("fusedattn_select")

LOCK_PREFIX = "plan-"

# Origins reported by obtain().
LOADED, BUILT, REBUILT = "loaded", "built", "rebuilt"

T = TypeVar("T")


# ----- load or build -----------------------------------------------------------------------------
def persists_plans(store: Store | None) -> bool:
    """Whether `store` keeps plans for other processes (a memory store does not: nothing to gain)."""
    return store is not None and store.persistent and store.plans_enabled


def _get(store: Store, fingerprint: Fingerprint, key: str) -> bytes | None:
    try:
        return store.get_plan(fingerprint, key)
    except Exception as err:  # noqa: BLE001 - a store never breaks dispatch
        log.warning("fusedattn_select: reading plan %s from the store raised %s: %s; treated as a miss",
                    key[:16], type(err).__name__, err)
        return None


def _try_load(load: Callable[[bytes], T], blob: bytes, key: str, store: Store) -> T | None:
    """The loaded object, or None (with a warning) when the blob does not load."""
    try:
        return load(blob)
    except Exception as err:  # noqa: BLE001 - any failure to load means: rebuild
        where = store.path or type(store).__name__
        log.warning("fusedattn_select: dropped the stored plan %s from %s: it does not load (%s: %s); "
                    "building it again", key[:16], where, type(err).__name__, " ".join(str(err).split())[:300])
        return None


def obtain(key: str, *, store: Store | None, fingerprint: Fingerprint, build: Callable[[], T],
           serialize: Callable[[T], bytes], load: Callable[[bytes], T]) -> tuple[T, str]:
    """The object for plan `key`: loaded from `store`, else built and persisted. Returns (object, origin).

    origin is LOADED, BUILT, or REBUILT (a stored blob did not load, was dropped and rebuilt; the
    new blob replaces it). `build` errors propagate (nothing is stored); a `serialize` error or a
    refused write leaves the built object usable, unpersisted. Builds of one key are serialised
    across threads and processes by the store's key lock, so concurrent callers build once and
    the others load the result.
    """
    if store is None or not persists_plans(store):
        return build(), BUILT
    unusable: list[bytes] = []

    def read() -> T | None:
        blob = _get(store, fingerprint, key)
        if blob is None or blob in unusable:  # the same bad blob is not tried twice
            return None
        loaded = _try_load(load, blob, key, store)
        if loaded is None:
            unusable.append(blob)
        return loaded

    def make() -> T:
        built = build()
        try:
            data = serialize(built)
        except Exception as err:  # noqa: BLE001 - the plan runs; it just is not persisted
            log.warning("fusedattn_select: plan %s was built but cannot be serialized (%s: %s); not persisted",
                        key[:16], type(err).__name__, err)
        else:
            store.put_plan(fingerprint, key, data)
        return built

    value, made = read_or_make(read, make, store.key_lock(fingerprint, LOCK_PREFIX + key))
    if not made:
        return value, LOADED
    return value, (REBUILT if unusable else BUILT)
