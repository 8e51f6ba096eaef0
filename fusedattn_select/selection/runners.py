"""Measured runner choices: whether torch SDPA or cuDNN runs a bucket faster on a device.

attention() times both runners once both exist (runtime/tiers.py) and keeps the faster for the
graphs' key (a bucket form: one choice per problem class and bucket); the choice is a runner choice
row of the store (store.put_runner_choice: JSON timings, kept even where serialized plans are
refused) under the selector's fingerprint, so the next process, `why` and the transformers report
read it (an `Untimed` choice, made where the torch runner failed when timed, stays in its process).
The verdict (F16/FP8/NONE) stays what cuDNN supports; this is which of two exact runners is faster
here. Torch-free.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fusedattn_select.planning.forms import PlanKind

if TYPE_CHECKING:
    from fusedattn_select.result import Selection
    from fusedattn_select.selection.selector import Selector

TORCH, CUDNN = "torch", "cudnn"


@dataclasses.dataclass(frozen=True)
class Choice:
    """The runner kept, and the cost per forward call of each (microseconds, tiers.measure). Its fields are the
    store's runner choice fields (store.entry_rows.RUNNER_CHOICE_FIELDS)."""

    runner: str
    torch_us: float
    cudnn_us: float

    def why(self) -> str:
        return f"measured torch {self.torch_us:.1f} us vs cuDNN {self.cudnn_us:.1f} us per forward call"

    def describe(self) -> str:
        return describe(self.runner, self.why())


@dataclasses.dataclass(frozen=True)
class Untimed:
    """A runner kept for one process without a timing, never stored: the other runner failed when timed."""

    runner: str
    because: str

    def why(self) -> str:
        return self.because

    def describe(self) -> str:
        return describe(self.runner, self.because)


Kept = Choice | Untimed  # what a process runs a bucket on


def describe(runner: str, why: str) -> str:
    """"torch SDPA (why)" or "cuDNN (why)"."""
    return f"{'torch SDPA' if runner == TORCH else 'cuDNN'} ({why})"


def stored(selector: Selector, key: str) -> Choice | None:
    """The choice stored for `key` under the selector's fingerprint, or None."""
    store = selector.store
    fields = store.get_runner_choice(selector.fingerprint, key) if store is not None else None
    if fields is None:
        return None
    found = Choice(**fields)  # the store hands back exactly Choice's fields, checked
    return found if found.runner in (TORCH, CUDNN) else None  # a runner this version does not know: measured again


def store(selector: Selector, key: str, choice: Choice) -> bool:
    """Store `choice` for `key`; whether it was persisted."""
    target = selector.store
    if target is None:
        return False
    return bool(target.put_runner_choice(selector.fingerprint, key, dataclasses.asdict(choice)))


# How choices are timed (runtime/tiers.measure), part of their keys: a choice timed another way
# (before "cost": wall-clock events, noisy at first contact) is timed again.
METHOD = "cost"


def runner_key(graphs_key: str, heads_as_batch: bool = False) -> str:
    """The key of a choice: how it is timed, and the key of the graphs that run (and whether a
    decode step runs them with its heads as batch)."""
    return f"{METHOD} " + ("heads " if heads_as_batch else "") + graphs_key


def for_selection(selector: "Selector", selection: "Selection") -> Choice | None:
    """The stored choice for the graphs attention() runs a selected problem with (its bucket form,
    a decode step's heads-as-batch bucket, or its own dense graphs), or None (not measured yet)."""
    from fusedattn_select.planning.planner import plan_forms

    if not selection.selected or selection.config is None or selector.store is None:
        return None
    forms, _ = plan_forms(selector, selection.config, selection)
    heads = selection.plan.kind is PlanKind.HEADS_AS_BATCH
    for form in forms:
        found = stored(selector, runner_key(form.cache_key(), heads))
        if found is not None:
            return found
    return None
