"""select(): rules, then the decision cache, then the platform's probing engine."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from fusedattn_select import backends, offpath
from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.probing import choose_engine
from fusedattn_select.probing.choice import SNAPSHOTS_ALLOWED, TARGETS, snapshot_files, target_name
from fusedattn_select.planning.bucket_index import BucketIndex
from fusedattn_select.planning.planner import Planner
from fusedattn_select.probing.engine_protocol import ProbeEngine
from fusedattn_select.result import Selection
from fusedattn_select.selection.rules import apply_rules, asked_problem_rules, no_platform_verdict, refuses_as_asked
from fusedattn_select.single_flight import MakingLock, read_or_make
from fusedattn_select.store import open_default_store, protocol
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, ProbeDepth, Provenance, Verdict, rejection_line

log = logging.getLogger("fusedattn_select")

NO_PLATFORM = Fingerprint(platform="none")

# cache_info()'s counters, each reported (0 until counted).
_COUNTERS = ("hits", "misses", "probes", "probe_failures", "rule_rejections", "persistent_hits")


@dataclass(frozen=True)
class _Entry:
    """Cached verdicts of one problem on one fingerprint, probed to `depth`, and the Selection a
    cache hit returns (built once: a hit allocates nothing). `exact_depth`: the entry answers only
    questions at its own depth (an engine's "no data" at full may be a "yes" at fast)."""

    verdicts: tuple[Verdict, ...]
    depth: ProbeDepth
    hit: Selection | None = None
    exact_depth: bool = False


def _satisfies(entry: _Entry, depth: ProbeDepth) -> bool:
    """A deeper probe answers a shallower question; a shallower 'yes' never answers a deeper one."""
    if entry.exact_depth:
        return entry.depth is depth
    return entry.depth.answers(depth) or any(not v.supported for v in entry.verdicts)


def _message(verdicts: tuple[Verdict, ...]) -> str:
    """The rejections in one line; phases rejected for the same reason are named together."""
    groups: dict[tuple, list[Phase]] = {}
    for v in verdicts:
        if not v.supported:
            groups.setdefault((v.backend, v.outcome, v.stage, v.message), []).append(v.phase)
    return "; ".join(rejection_line(b, phases, o, stage, message) for (b, o, stage, message), phases in groups.items())


def _selection(cfg: AttnConfig, verdicts: tuple[Verdict, ...], *, from_cache: bool,
               probe_ms: float, key: str, engine: str, notice: str) -> Selection:
    reasons = tuple(v.reason() for v in verdicts if not v.supported)
    backend = cfg.candidate if not reasons else Backend.NONE
    return Selection(
        backend=backend,
        message=_message(verdicts),
        reasons=reasons,
        verdicts=verdicts,
        candidate=cfg.candidate,
        from_cache=from_cache,
        probe_ms=probe_ms,
        config=cfg,
        cache_key=key,
        engine=engine,
        notice=notice,
    )


def _depth(probe_depth: str | ProbeDepth) -> ProbeDepth:
    return probe_depth if probe_depth.__class__ is ProbeDepth else ProbeDepth.parse(probe_depth)


class _ExactAnswers:
    """The selector as its planner asks it (planning.planner.Answers)."""

    def __init__(self, selector: Selector) -> None:
        self.exact = selector._select_exact
        self.cached = selector._cached
        self.count_hit = selector._count_hit


class Selector:
    """Answers select() for one engine, with a thread-safe, single-flight decision cache.

    `store` is an optional store consulted after memory and written after each cacheable probe;
    its `key_lock` makes one process probe each key. `notice` is carried in every Selection (why
    this engine answers, when it is not the one the caller named). `bucket_forms` False answers
    every problem by its own graphs (what a snapshot records), never by its shape bucket's.
    """

    def __init__(self, engine: ProbeEngine | None = None, *, unavailable_reason: str = "",
                 store: protocol.Store | None = None, notice: str = "", bucket_forms: bool = True) -> None:
        self.engine = engine
        self.unavailable_reason = unavailable_reason or "no probing engine"
        self.store = store
        self.notice = notice
        self._fingerprint = engine.fingerprint() if engine is not None else NO_PLATFORM
        self._fingerprint_key = self._fingerprint.key()
        self._renew_locks()
        renew_locks_after_fork(self)
        self._memory: dict[str, _Entry] = {}
        live = bucket_forms and engine is not None and engine.provenance is Provenance.LIVE_PROBE
        asked_rules = asked_problem_rules(self._fingerprint)
        # Which graphs answer a problem (its bucket's, its heads as batch, its own) is the planner's
        # choice; whether they are supported is this selector's. A snapshot recorded over bucket
        # ladders answers a shape it did not record by its bucket's row.
        self.planner = Planner(
            _ExactAnswers(self), buckets=BucketIndex(store, self._fingerprint) if live else None,
            recorded_buckets=(bucket_forms and not live and getattr(engine, "bucket_for", None)) or None,
            refuses_as_asked=lambda cfg: refuses_as_asked(asked_rules, cfg, self._fingerprint))
        self._stats: Counter[str] = Counter()
        self._thread = threading.local()  # engine calls per thread: what one search spent (probes_by_this_thread)

    def _renew_locks(self) -> None:
        # Fresh in a forked child too: a probe another thread of the parent was running at fork()
        # never answers there, so the child's first asker of that problem probes it itself.
        self._lock = threading.Lock()
        self._in_flight: dict[str, Future] = {}

    # ----- public ----------------------------------------------------------------------------
    @property
    def fingerprint(self) -> Fingerprint:
        return self._fingerprint

    @property
    def engine_name(self) -> str:
        return self.engine.name if self.engine is not None else "none"

    def warm_up(self) -> None:
        """Have the engine pay its one-time cost now where it has one (the live engine's warm-up
        graph, CudnnEngine.warm_up; once per engine), not in the timing of a probe."""
        warm_up = getattr(self.engine, "warm_up", None)
        if warm_up is not None:
            warm_up()

    def select(self, cfg: AttnConfig, probe_depth: str | ProbeDepth = ProbeDepth.FAST) -> Selection:
        """The answer for `cfg`. With a live engine, a problem that has a shape-bucket form is answered
        by the bucket's graphs, the ones attention() runs (so a new batch size or length inside a
        known bucket costs no probe); where cuDNN rejects that form, by the problem's exact graphs;
        a decode step by its heads as batch where that runs bucket plans (Planner.select)."""
        if not isinstance(cfg, AttnConfig):
            raise ConfigError("cfg", type(cfg).__name__, "must be an AttnConfig")
        return self.planner.select(cfg, _depth(probe_depth)).as_asked(cfg)

    def select_own(self, cfg: AttnConfig, probe_depth: str | ProbeDepth = ProbeDepth.FAST) -> Selection:
        """The answer for `cfg` by its own forms (its shape bucket where cuDNN runs it, else its dense
        graphs), never by its heads-as-batch problem: what attention() runs a decode step with when
        its tensors cannot be viewed that way or it asks for the log-sum-exp."""
        return self.planner.select_own(cfg, _depth(probe_depth)).as_asked(cfg)

    def select_dense(self, cfg: AttnConfig, probe_depth: str | ProbeDepth = ProbeDepth.FAST) -> Selection:
        """The answer of `cfg`'s own (dense) graphs, whether or not a shape bucket answers `cfg`: what
        attention() asks before it runs a shape it keeps seeing with that shape's own plans."""
        if not isinstance(cfg, AttnConfig):
            raise ConfigError("cfg", type(cfg).__name__, "must be an AttnConfig")
        return self.planner.select_dense(cfg, _depth(probe_depth)).as_asked(cfg)

    def bucket_for(self, cfg: AttnConfig) -> AttnConfig | None:
        """The bucket form whose graphs answer (and run) `cfg` (Planner.bucket_for)."""
        return self.planner.bucket_for(cfg)

    def learn_bucket(self, form: AttnConfig) -> None:
        """Answer the shapes `form` (a bucket form another process selected) holds by it."""
        self.planner.learn_bucket(form)

    def probes_by_this_thread(self) -> int:
        """Engine calls (graph probes, or recorded rows read) the calling thread made through this selector."""
        return getattr(self._thread, "probes", 0)

    def _select_exact(self, cfg: AttnConfig, key: str, depth: ProbeDepth) -> Selection:
        """The answer for exactly `cfg`'s graphs: rules, memory, store, then the engine."""
        # Hot path: entries are immutable and replaced whole, so one dict read needs no lock.
        entry = self._memory.get(key)
        if entry is not None and _satisfies(entry, depth):
            with self._lock:
                self._stats["hits"] += 1
            return entry.hit

        ruled = self._rule_verdicts(cfg)
        if ruled is not None:
            # Rules depend only on the problem and this selector's fingerprint: remember the answer.
            selection = self._answer(cfg, ruled, from_cache=False, probe_ms=0.0, key=key)
            with self._lock:
                self._stats["rule_rejections"] += 1
                self._memory[key] = _Entry(ruled, ProbeDepth.FULL, dataclasses.replace(selection, from_cache=True))
            return selection

        offpath.require(f"the selection of {key}", offpath.STORED)
        while True:
            with self._lock:
                entry = self._memory.get(key)
                if entry is not None and _satisfies(entry, depth):
                    self._stats["hits"] += 1
                    return entry.hit
                flight_key = f"{key}:{depth.value}"
                future = self._in_flight.get(flight_key)
                leader = future is None
                if leader:
                    future = Future()
                    self._in_flight[flight_key] = future
                    self._stats["misses"] += 1
            if not leader:
                # Another thread is probing this problem: wait for its answer, then read the cache.
                try:
                    result = future.result()
                except offpath.NotReady:  # the leader was limited (offpath): its limit is not ours
                    continue
                if result is not None:
                    return result
                continue
            try:
                selection = self._resolve(cfg, key, depth)
            except BaseException as err:
                with self._lock:
                    del self._in_flight[flight_key]
                future.set_exception(err)
                raise
            with self._lock:
                del self._in_flight[flight_key]
            future.set_result(selection)
            return selection

    def record_build_failure(self, cfg: AttnConfig, failed: Verdict) -> None:
        """A graph that passed a fast probe failed to build: flip the cached answer to NONE (also when
        memory no longer holds it: a clear_cache() while the graph built)."""
        key = cfg.cache_key()
        self.planner.clear_answers()  # answers given through this graph (its bucket, its heads as batch)
        stored = self.store.get(self._fingerprint, key) if self.store is not None and key not in self._memory else None
        with self._lock:
            entry = self._memory.get(key)
            known = entry.verdicts if entry is not None else stored[0] if stored is not None else ()
            verdicts = tuple(failed if (v.backend, v.phase) == (failed.backend, failed.phase) else v for v in known)
            if failed not in verdicts:  # no answer of that graph held: the failure is its answer
                verdicts += (failed,)
            self._memory[key] = self._entry(cfg, key, verdicts, ProbeDepth.FULL)
        self.planner.forget_bucket(cfg)
        # A rejection is stored for every process (it replaces a "yes" of any depth); an incident
        # (out of memory, a CUDA error) says nothing about support, so only this process stops asking.
        saved = True
        if self.store is not None and failed.outcome is Outcome.UNSUPPORTED:
            saved = self.store.put(self._fingerprint, key, verdicts, ProbeDepth.FULL)
        log.warning("fusedattn_select: %s; cached answer flipped to NONE%s", failed.reason(),
                    "" if saved else " in this process only: the decision cache did not save it")

    def pin(self, cfg: AttnConfig, verdicts: tuple[Verdict, ...], depth: ProbeDepth = ProbeDepth.FULL) -> Selection:
        """Answer `cfg` with `verdicts` from now on, at every depth, from memory only (never stored):
        how the ranks of a job hold the answer they agreed on. Returns that answer."""
        key = cfg.cache_key()
        entry = self._entry(cfg, key, tuple(verdicts), depth)
        with self._lock:
            self._memory[key] = entry
        self.planner.pin(key, entry.hit)
        return entry.hit

    def cache_info(self) -> dict[str, object]:
        with self._lock:
            info = {**{name: self._stats[name] for name in _COUNTERS}, "entries": len(self._memory),
                    "engine": self.engine_name, "fingerprint": self._fingerprint.key()}
        if self.store is not None:
            info["store"] = self.store.info()
        return info

    def clear(self, persistent: bool = False) -> None:
        """Forget every answer in memory; `persistent`: the store too (CacheError when it cannot)."""
        _check_persistent(persistent)
        with self._lock:
            self._memory.clear()
            self._stats.clear()
        self.planner.clear()
        if persistent and self.store is not None:
            self.store.clear()

    # ----- internals -------------------------------------------------------------------------
    def _cached(self, key: str, depth: ProbeDepth) -> Selection | None:
        entry = self._memory.get(key)
        return entry.hit if entry is not None and _satisfies(entry, depth) else None

    def _count_hit(self) -> None:
        with self._lock:
            self._stats["hits"] += 1

    def _entry(self, cfg: AttnConfig, key: str, verdicts: tuple[Verdict, ...], depth: ProbeDepth) -> _Entry:
        hit = tuple(v.with_provenance(Provenance.MEMORY_CACHE) for v in verdicts)
        return _Entry(verdicts, depth, self._answer(cfg, hit, from_cache=True, probe_ms=0.0, key=key))

    def _answer(self, cfg: AttnConfig, verdicts: tuple[Verdict, ...], *, from_cache: bool, probe_ms: float,
                key: str) -> Selection:
        return _selection(cfg, verdicts, from_cache=from_cache, probe_ms=probe_ms, key=key,
                          engine=self.engine_name, notice=self.notice)

    def _rule_verdicts(self, cfg: AttnConfig) -> tuple[Verdict, ...] | None:
        phases = cfg.phases
        if self.engine is None:
            # No engine at all: nothing here can say yes or no, so the platform rule's answer is "no data".
            return tuple(no_platform_verdict(cfg, p, self.unavailable_reason) for p in phases)
        verdicts = tuple(v for v in (apply_rules(cfg, self._fingerprint, p) for p in phases) if v is not None)
        # Rules are cheap and final: a problem a rule rejects is answered without any probe.
        return verdicts or None

    def _stored(self, cfg: AttnConfig, key: str, depth: ProbeDepth) -> Selection | None:
        """The persistent store's answer when it covers `depth`, promoted into memory."""
        stored = self.store.get(self._fingerprint, key) if self.store is not None else None
        if stored is None:
            return None
        entry = self._entry(cfg, key, tuple(stored[0]), stored[1])
        if not _satisfies(entry, depth):
            return None
        with self._lock:
            self._memory[key] = entry
            self._stats["persistent_hits"] += 1
        log.debug("fusedattn_select: persistent cache hit %s (depth %s)", key, entry.depth.value)
        verdicts = tuple(v.with_provenance(Provenance.PERSISTENT_CACHE) for v in entry.verdicts)
        return self._answer(cfg, verdicts, from_cache=True, probe_ms=0.0, key=key)

    def _resolve(self, cfg: AttnConfig, key: str, depth: ProbeDepth) -> Selection:
        # One prober per key across processes (8 ranks warming one store).
        lock = self.store.key_lock(self._fingerprint, key) if self.store is not None else None
        selection, _ = read_or_make(lambda: self._stored(cfg, key, depth), lambda: self._probe(cfg, key, depth), lock)
        return selection

    def _probe(self, cfg: AttnConfig, key: str, depth: ProbeDepth) -> Selection:
        offpath.require(f"a probe of {key}", None)
        self.warm_up()  # an engine made without it: its one-time cost is not this probe's
        started = time.perf_counter()
        verdicts = tuple(self._probe_one(cfg, phase, depth) for phase in cfg.phases)
        probe_ms = (time.perf_counter() - started) * 1e3
        failed = [v for v in verdicts if v.outcome is Outcome.FAILED]
        for v in failed:  # a snapshot's: the recording's probe failed, nothing ran here
            where = "as recorded in the snapshot" if v.provenance is Provenance.SNAPSHOT else "not cached"
            log.warning("fusedattn_select: %s (%s)", v.reason(), where)
        if any(v.provenance is not Provenance.SNAPSHOT for v in failed):
            pass  # a probe that failed here is asked again next time
        elif failed or any(v.outcome is Outcome.NO_DATA for v in verdicts):
            # The engine's own lack of data, or a recorded failure (the same at every replay): kept for this
            # depth in memory, never in the store.
            with self._lock:
                self._memory[key] = dataclasses.replace(self._entry(cfg, key, verdicts, depth), exact_depth=True)
        else:
            with self._lock:
                self._memory[key] = self._entry(cfg, key, verdicts, depth)
            if self.store is not None:
                self.store.put(self._fingerprint, key, verdicts, depth)
        selection = self._answer(cfg, verdicts, from_cache=False, probe_ms=probe_ms, key=key)
        verb, source = self._verb()
        answered = selection.selected or not failed or any(v.outcome is Outcome.UNSUPPORTED for v in verdicts)
        answer = "no data" if selection.no_data else selection.backend.value if answered else "no answer (probe failed)"
        log.info("fusedattn_select: %s %s%s in %.3f ms -> %s%s", verb, key, source, probe_ms, answer,  # as `why` says
                 f" ({selection.message})" if selection.message else "")
        return selection

    def _verb(self) -> tuple[str, str]:
        """What answering a new problem is for this engine (probing a device, replaying a recording), and from where."""
        provenance = self.engine.provenance if self.engine is not None else None
        return {Provenance.SNAPSHOT: ("replayed", f" from {self.engine_name}"),
                Provenance.DECLARED: ("looked up", " in declared tables")}.get(provenance, ("probed", ""))

    def _probe_one(self, cfg: AttnConfig, phase: Phase, depth: ProbeDepth) -> Verdict:
        assert self.engine is not None
        entry = backends.candidate(cfg.qkv_dtype, cfg.phases)
        if entry is not None and entry.probe is not None:  # a registered backend that answers by its own probe
            verdict = entry.probe(self.engine, cfg, entry.backend, phase, depth)
        else:
            verdict = self.engine.probe(cfg, cfg.candidate, phase, depth)
        self._thread.probes = getattr(self._thread, "probes", 0) + 1
        with self._lock:
            self._stats["probes"] += 1
            if verdict.outcome is Outcome.FAILED:
                self._stats["probe_failures"] += 1
        return verdict


# ----- the process-wide selector ---------------------------------------------------------------
_default: Selector | None = None
_making = MakingLock()  # held while it is made


def selector_for(snapshots: str | Path | Iterable[str | Path] | None = None, target: str | None = None) -> Selector:
    """A selector answering with the engine `choose_engine(snapshots, target)` picks (the library and
    every command choose through it), with the default store when that engine probes live."""
    choice = choose_engine(snapshots, target)
    engine = choice.engine
    # Snapshot answers are already stored (in the snapshot): only live probes are worth keeping.
    store = open_default_store() if engine is not None and engine.provenance is Provenance.LIVE_PROBE else None
    return Selector(engine, unavailable_reason=choice.unavailable_reason, store=store, notice=choice.notice)


def made_default_selector() -> Selector | None:
    """The process-wide selector if it was made already, else None (making it imports the engine)."""
    return _default


def default_selector() -> Selector:
    """The process-wide selector, created on first use: live cuDNN, or on a machine without it the
    bundled snapshots of the default target (its Selections carry a notice saying so)."""
    global _default
    selector = _default
    if selector is not None:  # every call after the first: no lock
        return selector
    with _making.lock:
        if _default is None:
            _default = selector_for()
        return _default


_TARGET_CHOICE = "target=" + " or ".join(repr(name) for name in TARGETS)
USE_SNAPSHOTS_ALLOWED = f"must be a snapshot file's path (str or Path) or a list of them; or None with {_TARGET_CHOICE}"


def use_snapshots(snapshots: str | Path | Iterable[str | Path] | None = None, *,
                  target: str | None = None) -> Selector:
    """Answer select()/get_backend() in this process from snapshot files (one path or several,
    recorded on one device) or from the snapshots bundled for `target` ("h100", "h200").

    `snapshots` None (or no files) means none: `target` is then required, and with files it must be None.
    Returns the new process-wide selector. Decisions attention() already made are kept.
    """
    try:
        paths = snapshot_files(snapshots)
    except ConfigError as err:  # choose_engine takes None alone (the default engine); here None needs a target
        raise ConfigError(err.field, err.value, err.allowed.replace(SNAPSHOTS_ALLOWED, USE_SNAPSHOTS_ALLOWED)) from None
    if target is not None:
        target_name(target)  # an empty target names no snapshots: refused, not read as "no target"
    elif not paths:
        raise ConfigError("snapshots", snapshots, f"give snapshot files, or {_TARGET_CHOICE}")
    selector = selector_for(paths, target)
    set_default_selector(selector)
    return selector


def set_default_selector(selector: Selector | None) -> Selector | None:
    """Replace the process-wide selector (None: rediscover on next use); returns the old one."""
    global _default
    with _making.lock:
        old, _default = _default, selector
    return old


def select(cfg: AttnConfig, probe_depth: str = "fast", *, alternatives: bool = False) -> Selection:
    """Which fused backend runs `cfg` here, and if none, every reason why (cached; without a GPU the bundled
    snapshots answer, `Selection.no_data` where they hold nothing). `alternatives=True`: a refused NONE also
    lists supported problems nearby (`Selection.alternatives`); on a GPU each such NONE costs extra graph
    probes, up to the cap (alternatives.DEFAULT_MAX_PROBES). A cached answer is returned as it was made:
    its `config` is the problem as first asked, in that asker's spelling of it (mask="causal" with
    bottom_right_diagonal=True, or mask="causal_bottom_right": one problem, one `cache_key`)."""
    if not isinstance(alternatives, bool):  # a truthy "no" would cost the probes of alternatives
        raise ConfigError("alternatives", alternatives, "must be True (list supported problems nearby) or False")
    selector = default_selector()
    if not alternatives:
        return selector.select(cfg, probe_depth)
    from fusedattn_select.selection.alternatives import with_alternatives  # it imports this module
    return with_alternatives(selector, selector.select(cfg, probe_depth), probe_depth=probe_depth)


def get_backend(cfg: AttnConfig) -> tuple[Backend, str]:
    """(backend, message): Backend.F16, Backend.FP8 or Backend.NONE, and "" when one is selected."""
    selection = select(cfg)
    return selection.backend, selection.message


def cache_info() -> dict[str, object]:
    """Counters of the process-wide decision cache: hits, misses, probes, probe_failures, entries."""
    return default_selector().cache_info()


def clear_cache(persistent: bool = False) -> None:
    """Empty the decision cache in memory, and with persistent=True the default store too, whichever engine
    answers (CacheError when it cannot: a cache directory that cannot be used). Chooses no engine to do so."""
    _check_persistent(persistent)
    selector = _default
    if selector is not None:
        selector.clear()
    if not persistent:
        return
    store = selector.store if selector is not None and selector.store is not None else open_default_store()
    degraded = getattr(store, "degraded", "")
    if degraded:  # memory stands in for the store: clearing it would leave the store's files as they are
        raise protocol.CacheError(f"the persistent store cannot be cleared: {degraded}")
    store.clear()


def _check_persistent(persistent: object) -> None:
    # Bools only: a truthy string such as "no" or "false" would wipe the persistent store.
    if not isinstance(persistent, bool):
        raise ConfigError("persistent", persistent, "must be True (the persistent store too) or False")
