"""The policies that choose which graphs answer (and run) a problem: its shape bucket's graphs, a
decode step's heads as batch, its own dense graphs where cuDNN rejects the bucket, and FP8 output
precisions tried in turn. Whether a graph is supported is the selector's question (`Answers`)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Protocol

from fusedattn_select.buckets import heads_as_batch
from fusedattn_select.config import AttnConfig
from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.plan_store.calls import dispatch_config, not_dispatched_reason
from fusedattn_select.planning.bucket_index import BucketIndex
from fusedattn_select.planning.forms import DENSE, PlanForm, PlanKind
from fusedattn_select.result import Selection
from fusedattn_select.types import Outcome, ProbeDepth


class Answers(Protocol):
    """The selector's side: the answer for exactly one problem's graphs."""

    def exact(self, cfg: AttnConfig, key: str, depth: ProbeDepth) -> Selection:
        """The answer for exactly `cfg`'s graphs (rules, decision cache, then the engine)."""

    def cached(self, key: str, depth: ProbeDepth) -> Selection | None:
        """The decision cache's answer for `key` at `depth`, without a probe; None when it has none."""

    def count_hit(self) -> None:
        """Count an answer given from memory."""


class BucketForms(Protocol):
    """The selector's side of `plan_forms`."""

    def bucket_for(self, cfg: AttnConfig) -> AttnConfig | None:
        """The bucket form whose graphs run `cfg`."""


class Planner:
    """Chooses the graphs that answer a problem and remembers answers given through other graphs
    (a bucket form's, a heads-as-batch problem's). `buckets` answers shapes by the buckets learned
    live; `recorded_buckets` (a snapshot's) by its recorded rows; with neither, every problem is
    answered as asked. `refuses_as_asked` names problems a rule decides on their own graphs."""

    def __init__(self, answers: Answers, *, buckets: BucketIndex | None,
                 recorded_buckets: Callable[[AttnConfig], AttnConfig | None] | None,
                 refuses_as_asked: Callable[[AttnConfig], bool]) -> None:
        self._answers = answers
        self._buckets = buckets
        self._recorded_buckets = recorded_buckets
        self._refuses_as_asked = refuses_as_asked
        self._renew_locks()
        renew_locks_after_fork(self)
        # Final answers of problems answered through their bucket form, by (problem key, depth), and
        # through a decode step's heads as batch, by (problem key, depth, PlanKind.HEADS_AS_BATCH).
        self._by_problem: dict[tuple, Selection] = {}
        # Bumped whenever _by_problem is cleared: an answer computed before a clear is not filed after it.
        self._generation = 0

    def _renew_locks(self) -> None:
        self._lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there

    def select(self, cfg: AttnConfig, depth: ProbeDepth) -> Selection:
        """A decode step by its heads-as-batch problem where that problem runs bucket plans; any other
        problem by its own forms (select_own)."""
        key = cfg.cache_key()
        decode = heads_as_batch(cfg) if self._buckets is not None else None
        if decode is not None and not self._refuses_as_asked(cfg):
            answered = self._by_problem.get((key, depth, PlanKind.HEADS_AS_BATCH))
            if answered is not None:
                self._answers.count_hit()
                return answered
            generation = self._generation
            answer = self.select(decode, depth)
            # Only on bucket plans (one per bucket, no build per step); else the step's own forms answer
            # it, as attention() then runs them.
            if answer.selected and answer.plan.kind is PlanKind.BUCKET:
                answer = dataclasses.replace(answer, config=cfg, cache_key=key,
                                             plan=answer.plan.with_heads_as_batch(decode))
                self._file((key, depth, PlanKind.HEADS_AS_BATCH), dataclasses.replace(answer, from_cache=True),
                           generation)
                return answer
        return self.select_own(cfg, depth)

    def select_own(self, cfg: AttnConfig, depth: ProbeDepth) -> Selection:
        """`cfg` by its shape bucket's graphs where they are supported, else by its own dense graphs;
        an incident (or no data) of the bucket's graphs is reported as it is, never probed again."""
        key = cfg.cache_key()
        answered = self._by_problem.get((key, depth))
        if answered is not None:
            self._answers.count_hit()
            return answered
        generation = self._generation
        # A rule about the problem asked (a decode step's s_q == 1) is decided on its own graphs.
        form = None if self._refuses_as_asked(cfg) else self.bucket_for(cfg)
        if form is None:
            return self._answers.exact(cfg, key, depth)
        form_key = form.cache_key()
        bucketed = self._answers.exact(form, form_key, depth)
        if bucketed.selected:
            self.learn_bucket(form)
        if not bucketed.selected and any(v.outcome is not Outcome.UNSUPPORTED for v in bucketed.verdicts
                                         if not v.supported):
            return dataclasses.replace(bucketed, config=cfg, cache_key=key)
        if bucketed.selected:
            answer_key, changes = form_key, {"config": cfg, "cache_key": key, "plan": PlanForm.of_bucket(form)}
        else:
            answer_key, changes = key, {"plan": DENSE}
            bucketed = self._answers.exact(cfg, key, depth)
        cached = self._answers.cached(answer_key, depth)
        if cached is not None:
            # Later calls get the cached answer, as a hit of the graphs' own key would.
            self._file((key, depth), dataclasses.replace(cached, **changes), generation)
        return dataclasses.replace(bucketed, **changes)

    def select_dense(self, cfg: AttnConfig, depth: ProbeDepth) -> Selection:
        """`cfg` by its own dense graphs, whether or not a shape bucket answers it."""
        return dataclasses.replace(self._answers.exact(cfg, cfg.cache_key(), depth), plan=DENSE)

    def bucket_for(self, cfg: AttnConfig) -> AttnConfig | None:
        """The bucket form whose graphs answer (and run) `cfg`: the smallest bucket of its class already
        answered "yes" that holds its shape, else its own bucket; None when it has no bucket form or
        problems are answered as asked. From a snapshot: its recorded row of the bucket a GPU runs
        `cfg` in, when `cfg` was not recorded itself (SnapshotEngine.bucket_for)."""
        if self._recorded_buckets:
            return self._recorded_buckets(cfg)
        return self._buckets.find(cfg) if self._buckets is not None else None

    def learn_bucket(self, form: AttnConfig) -> None:
        """Answer the shapes `form` (a bucket form answered "yes") holds by it."""
        if self._buckets is not None:
            self._buckets.remember(form)

    def forget_bucket(self, form: AttnConfig) -> None:
        """`form`'s graphs no longer answer "yes" (its plans failed to build)."""
        if self._buckets is not None:
            self._buckets.forget(form)

    def pin(self, key: str, hit: Selection) -> None:
        """Answer the problem of `key` with `hit` at every depth, over its bucket form and its heads
        as batch too; an answer being computed now does not overwrite it."""
        with self._lock:
            self._generation += 1
            for asked in ProbeDepth:
                self._by_problem[(key, asked)] = self._by_problem[(key, asked, PlanKind.HEADS_AS_BATCH)] = hit

    def clear_answers(self) -> None:
        """Forget every answer given through other graphs (one of those graphs changed its answer)."""
        with self._lock:
            self._by_problem.clear()
            self._generation += 1

    def clear(self) -> None:
        self.clear_answers()
        if self._buckets is not None:
            self._buckets.clear()

    def _file(self, key: tuple, answer: Selection, generation: int) -> None:
        """Remember an answer given through another problem's graphs, unless a clear came meanwhile."""
        with self._lock:
            if self._generation == generation:
                self._by_problem[key] = answer


def fp8_output_recipes(cfg: AttnConfig, training: bool) -> list[dict]:
    """AttnConfig changes for the FP8 output precisions to try, best first.

    O (and dQ, dK, dV) in the input precision needs no output scales (cuDNN 9.13+ on Blackwell);
    otherwise FP8 outputs: TransformerEngine's HYBRID recipe (e4m3 forward, e5m2 gradients),
    then e4m3 throughout.
    """
    recipes: list[dict] = [{}]
    if training:
        recipes += [
            {"o_dtype": "fp8_e4m3", "do_dtype": "fp8_e5m2", "dqkv_dtype": "fp8_e5m2"},
            {"o_dtype": "fp8_e4m3", "do_dtype": "fp8_e4m3", "dqkv_dtype": "fp8_e4m3"},
        ]
    else:
        recipes += [{"o_dtype": "fp8_e4m3"}]
    return recipes


def with_fp8_outputs(select: Callable[[AttnConfig], Selection], cfg: AttnConfig, first: Selection,
                     training: bool) -> tuple[AttnConfig, Selection, str]:
    """An FP8 problem whose first answer (`first`, its outputs as asked) is NONE, tried with each FP8
    output recipe in turn: (the config selected, its answer, "") or (cfg, the last answer, every
    recipe's reasons)."""
    if not (cfg.is_fp8 and not first.selected):
        return cfg, first, ""
    # FP8 outputs in fp16/bf16 need a newer GPU (cuDNN: Blackwell): FP8 outputs are tried before giving up.
    messages = [f"{_recipe(cfg)}: {first.message}"]
    selection = first
    for changes in fp8_output_recipes(cfg, training)[1:]:
        candidate = cfg.replace(**changes)
        selection = select(candidate)
        if selection.selected:
            return candidate, selection, ""
        messages.append(f"{_recipe(candidate)}: {selection.message}")
    return cfg, selection, "; ".join(messages)


def _recipe(cfg: AttnConfig) -> str:
    """The output precisions of an FP8 config, for reasons ("O bf16" / "O fp8_e4m3, dQKV fp8_e5m2")."""
    text = f"O {cfg.resolved_o_dtype}"
    if cfg.is_training:
        text += f", dO {cfg.resolved_do_dtype}, dQKV {cfg.resolved_dqkv_dtype}"
    return text


def plan_forms(selector: BucketForms, cfg: AttnConfig, selection: Selection) -> tuple[list[AttnConfig], str]:
    """The problems whose plans attention() runs for `cfg`: its bucket's form when it is answered by
    its shape bucket (every smaller shape of its class runs in that bucket too), else its own dense
    problem (a decode step answered with its heads as batch: that problem's); and why there are none."""
    if selection.plan.runs_bucket:
        return [selector.bucket_for(selection.plan.heads or cfg)], ""
    dispatched = dispatch_config(cfg)
    if dispatched is None:
        return [], not_dispatched_reason(cfg)
    return [dispatched], ""
