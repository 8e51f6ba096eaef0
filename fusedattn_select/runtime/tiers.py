"""First contact: outside the waiting cases (`wait_reason`), a new signature whose plans memory lacks runs on torch
while they are prepared off the caller's path, then swaps; each bucket runs on the runner measured faster (on cuDNN,
untimed, where only the torch runner failed when timed). Which calls run on torch, how the swap and the timing work,
and which calls wait: docs/dispatch.md, 'First contact'."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from fusedattn_select import offpath
from fusedattn_select.errors import ConfigError
from fusedattn_select.layouts import dense_strides
from fusedattn_select.runtime import dense_builds, entries
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.entries import Entry
# The autograd-state helpers live in fused.py, which decides with them too (an FP8History under checkpointing).
from fusedattn_select.runtime.fused import (current_graph_task as _current_graph_task, fused_forward,
                                            saved_tensor_hooks as _saved_tensor_hooks, top_hooks as _top_hooks)
from fusedattn_select.runtime.lean import functorch_active, lean_forward
from fusedattn_select.runtime.heads import as_heads, back
from fusedattn_select.runtime.fallback import FALLBACK_TORCH, sdpa_mask_form, torch_call, torch_sdpa_blocker
from fusedattn_select.runtime.tensor_layouts import bhsd, tensor_subclass
from fusedattn_select.runtime.options import NO_INPUTS, CallOptions, OptionalInputs
from fusedattn_select.runtime.run_settings import run_settings
from fusedattn_select.runtime.streams import ignore_other_threads_captures
from fusedattn_select.selection import runners
from fusedattn_select.selection import selector as selection

log = logging.getLogger("fusedattn_select")

ROUNDS = 5                  # timed forward calls per runner when both are ready (measure)
HOLD_CYCLES = 2_000_000     # GPU clock cycles (about 1 ms) the timed calls queue behind (measure)
TORCH, CUDNN = runners.TORCH, runners.CUDNN
RUNNER_NAMES = ("its torch runner", "its cuDNN runner")  # measure's pair, in order: whose call failed
Choice, Kept = runners.Choice, runners.Kept
Run = Callable[..., Any]  # api._run: (entry, q, k, v, inputs, fp8, return_lse) -> out


# ----- deciding a new signature --------------------------------------------------------------------
def entry(signature: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
          scales: Any) -> Entry:
    """The decision for `signature` (an entries.key): made now in a waiting case or from memory (with its
    bucket's runner choice, timed now where this device has none), else a torch runner that waits for it
    (docs/dispatch.md, 'First contact')."""
    def decide() -> Entry:
        why = wait_reason(signature, q, k, v, inputs, scales)
        if why:
            return entries.new_entry(signature, q, k, v, inputs, scales)
        missing = dense_builds.cudnn_missing()
        if missing:  # nothing to prepare: torch runs it for good, from its first call
            return Entry(signature[0], fallback=FALLBACK_TORCH, torch_because=missing,
                         torch_call=torch_call(signature[0], q, k, v))
        try:
            if selection.made_default_selector() is None:  # nothing decided in this process yet
                raise offpath.NotReady("the first signature of this process")
            with offpath.only(offpath.MEMORY):
                found = entries.new_entry(signature, q, k, v, inputs, scales)
        except offpath.NotReady as err:
            log.debug("fusedattn_select: %s runs on torch SDPA until its cuDNN plans are ready (%s)",
                      _describe(signature), err)
            return Entry(signature[0], fallback=FALLBACK_TORCH, torch_because="its cuDNN plans are not ready yet",
                         waiting=dispatcher.preparer.submit(lambda: prepare(signature)),
                         torch_call=torch_call(signature[0], q, k, v))
        if not found.fused:
            return found
        keeper = Entry(signature[0], fallback=FALLBACK_TORCH, torch_call=torch_call(signature[0], q, k, v))
        runs, choice, timed = _runner_for(found, keeper, load_choice, q, k, v)
        if choice is not None and timed and not _warned(choice):
            log.info("fusedattn_select: %s: %s runs its bucket (%s)", entries.problem_key(found, "a call"),
                     "cuDNN" if choice.runner == CUDNN else "torch SDPA", choice.why())
        return runs

    return entries.entry(signature, q, k, v, inputs, scales, lambda: entries.settle(decide()))


def wait_reason(signature: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
                scales: Any) -> str:
    """Why this signature is decided on the caller's path ("" when torch runs it meanwhile)."""
    opts: CallOptions = signature[0]
    if run_settings.get().first_calls == "wait":
        return "FUSEDATTN_SELECT_FIRST_CALLS=wait"
    if signature[-1]:
        return "CUDA-graph capture"
    if opts.deterministic or torch.are_deterministic_algorithms_enabled():
        return "deterministic=True" if opts.deterministic else "torch.use_deterministic_algorithms(True)"
    if opts.training and _saved_tensor_hooks() is not None:
        # Activation checkpointing: the backward recomputes this forward, and must run the kernel it ran.
        return "saved-tensor hooks (activation checkpointing)"
    if opts.dropout:
        # The mask is the kernel's, from torch's generator: a forward and its recomputation (reentrant checkpointing's
        # is an inference call) run one kernel, and no timing draws from the generator checkpointing restores.
        return "dropout (its mask is the kernel's)"
    subclass, transformed = tensor_subclass(q, k, v), functorch_active()  # (the preparer's thread has no transform)
    if subclass or transformed or not (q.numel() and k.numel()):  # decided at once: no cuDNN plan to prepare
        return f"{subclass} inputs" if subclass else "a torch.func transform" if transformed else "an empty problem"
    if not q.is_cuda or offpath.limit() is not None:
        return "not a CUDA call" if not q.is_cuda else "a limited decision"
    if opts.training and _top_hooks is None and not dense_builds.cudnn_missing():
        # No way to tell a checkpointed forward (above) from another, and a swap between one and its
        # recomputation would run two kernels; without cuDNN torch runs it for good, with no swap.
        return "training on a torch without the saved-tensor hook stack (torch < 2.8)"
    if opts.fp8 or scales is not None or any(t is not None for t in inputs):
        return "FP8, or optional tensors"
    qb, kb = bhsd(q, opts.layout), bhsd(k, opts.layout)
    blocker = torch_sdpa_blocker(opts, qb, kb, False)
    if blocker:
        return f"torch SDPA cannot run {blocker}"
    if sdpa_mask_form(opts.mask, qb.shape[2], kb.shape[2]) == "dense":
        return "a bottom-right causal mask over unequal lengths needs a dense mask in torch"
    if q.dtype not in (torch.float16, torch.bfloat16) or not _flash_or_efficient(opts, qb, kb, bhsd(v, opts.layout)):
        return "neither flash nor memory-efficient attention takes it"
    return ""


def _flash_or_efficient(opts: CallOptions, qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor) -> bool:
    """Whether torch's flash or memory-efficient SDPA kernel takes this problem (torch's own checks)."""
    causal = opts.mask != "no_mask" and qb.shape[2] > 1
    try:
        params = torch.backends.cuda.SDPAParams(qb, kb, vb, None, opts.dropout, causal, qb.shape[1] != kb.shape[1])
        return bool(torch.backends.cuda.can_use_flash_attention(params, False)
                    or torch.backends.cuda.can_use_efficient_attention(params, False))
    except (AttributeError, TypeError, RuntimeError):  # an older torch: its own dims rules
        return qb.shape[-1] <= 256 and qb.shape[-1] % 8 == 0 and vb.shape[-1] == qb.shape[-1]


def _describe(signature: tuple) -> str:
    return f"a call of q{list(signature[3])} k{list(signature[7])} ({signature[0].mask})"


# ----- running and swapping -------------------------------------------------------------------------
def run(found: Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, run_decided: Run) -> Any:
    """Run a torch-served signature; swap in its prepared runner first when it is ready."""
    if found.opts.training and (_saved_tensor_hooks() is not None or _current_graph_task() != -1):
        # Checkpointing: a forward the backward recomputes, or the recomputation. Both run the cuDNN
        # entry, so a swap between them cannot make the recomputation run another kernel.
        fixed = cudnn_entry(found, None, q, k, v, NO_INPUTS, None)
        if fixed is not found:
            return run_decided(fixed, q, k, v, NO_INPUTS, False, False)
    job = found.waiting
    if job is not None and job.finished and not (q.is_cuda and entries.is_capturing()):  # never swap inside a graph
        new = swap(found, job, q, k, v, run_decided)
        if new is not found:
            return run_decided(new, q, k, v, NO_INPUTS, False, False)
    found.calls += 1
    counters = dispatcher.counters
    counters["calls"] += 1
    counters["torch_calls"] += 1
    return found.torch_call(q, k, v)


def swap(waiting: Entry, job: Future, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, run_decided: Run) -> Entry:
    """Put the prepared entry (or, where measured faster, torch for good) in place of `waiting`, once."""
    with dispatcher.lock:
        if waiting.waiting is not job:
            return waiting
        waiting.waiting = None
    try:
        prepared: Entry = job.result()
    except Exception as err:  # noqa: BLE001 - the waiting ends; torch keeps the signature
        return _stays_on_torch(waiting, f"its cuDNN plans could not be prepared ({type(err).__name__}: {err})")
    if prepared.fused:
        why: list[str] = []
        prepared = for_callers_geometry(prepared, q, k, v, why)
        if prepared is None:
            return _stays_on_torch(waiting, "its cuDNN runner for the caller's strides could not be decided "
                                            f"from what memory holds ({'; '.join(why) or 'no reason given'})")
    if not prepared.fused:  # no cuDNN runner: the entry falls back as a waiting case would
        entries.replace(waiting, prepared)
        return prepared
    new, choice, timed = _runner_for(prepared, waiting, dispatcher.choices.get, q, k, v)
    if choice is None:
        return waiting
    entries.replace(waiting, new)
    dispatcher.counters["swaps"] += 1
    if not (timed and _warned(choice)):
        log.info("fusedattn_select: %s: %s after %d calls on torch SDPA (%s)", entries.problem_key(prepared, "a call"),
                 "cuDNN runs it now" if new is prepared else "torch SDPA keeps it", waiting.calls, choice.why())
    return new


def cudnn_entry(found: Entry, signature: tuple | None = None, *call: Any) -> Entry:
    """For a path that never switches kernels mid-run (compiled custom ops, activation checkpointing): the
    cuDNN entry of a signature eager calls run on torch, waiting for its preparation, else decided now from
    `signature` and `call` (q, k, v, inputs, scales); else `found` itself (torch runs it)."""
    if not found.torch_because or dispatcher.no_cudnn:  # (no cuDNN frontend: nothing else can run it)
        return found
    if found.cudnn is None:
        job = found.waiting
        prepared = job.result() if job is not None and job.exception() is None else None
        if prepared is not None and prepared.fused and len(call) >= 3:
            prepared = for_callers_geometry(prepared, *call[:3])
        if prepared is None and signature is not None:
            prepared = entries.new_entry(signature, *call)
        found.cudnn = prepared if prepared is not found else None  # (under capture: its eager twin)
    return found.cudnn if found.cudnn is not None else found


def _stays_on_torch(waiting: Entry, because: str) -> Entry:
    """The signature runs on torch for good: why, logged once (one swap per signature), and counted."""
    waiting.torch_because = because
    dispatcher.counters["stays_on_torch"] += 1
    log.warning("fusedattn_select: %s stays on torch SDPA: %s", entries.problem_key(waiting, "a call"), because)
    return waiting


def runner_key(found: Entry) -> str:
    """The key of the runner choice of a decided entry: the graphs it runs (a bucket form: one
    choice per problem class and bucket), and whether it runs a decode step with its heads as batch."""
    inner = found.heads.entry if found.heads is not None else found
    return runners.runner_key(inner.cfg.cache_key() if inner.cfg is not None else "", found.heads is not None)


# ----- measured choices ---------------------------------------------------------------------------------
def cudnn_forward(found: Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A decided cuDNN entry's forward on the caller's tensors, as its calls run it, counting no call."""
    if found.lean is not None:
        return lean_forward(found, q, k, v)[0]
    if found.heads is not None:
        return back(found.heads, cudnn_forward(found.heads.entry, *as_heads(found.heads, q, k, v)))
    return fused_forward(found, q, k, v, NO_INPUTS, None)[0]


def load_choice(key: str) -> runners.Kept | None:
    """The choice of `key`: in memory, else read from the store into memory, else None (off the caller's path)."""
    found = dispatcher.choices.get(key)
    if found is not None:
        return found
    found = runners.stored(selection.default_selector(), key)
    if found is None:
        return None
    return _keep(key, found)


def _keep(key: str, choice: Kept) -> Kept:
    with dispatcher.choices_lock:
        dispatcher.choices[key] = choice
    return choice


def _runner_for(found: Entry, keeper: Entry, lookup: Callable[[str], runners.Kept | None], q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor) -> tuple[Entry, runners.Kept | None, bool]:
    """(`found`, or `keeper` where torch runs the bucket; its choice, `lookup`'s or timed now where this device
    never timed the bucket (None: not timed, `keeper` says why); whether this call timed it)."""
    key = runner_key(found)
    choice, timed = lookup(key), False
    if choice is None:
        choice, timed = measure_once(key, keeper, found, q, k, v)
        if choice is None:
            return keeper, None, timed
    return apply_choice(found, choice, keeper), choice, timed


def apply_choice(found: Entry, choice: runners.Kept | None, keeper: Entry) -> Entry:
    """`found`, or `keeper` (the signature's torch runner) when `choice` is torch."""
    if choice is None or choice.runner == CUDNN:
        return found
    keeper.torch_because = choice.why()
    keeper.selection, keeper.cfg, keeper.cudnn = found.selection, found.cfg, found
    return keeper


def measure_once(key: str, keeper: Entry, prepared: Entry, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> tuple[runners.Kept | None, bool]:
    """(the choice of `key`, whether this call timed it): timed once per key in this process, so every
    signature of a bucket runs on one runner (one decided meanwhile waits for that timing's result)."""
    timed = []

    def timing() -> runners.Kept | None:
        known = dispatcher.choices.get(key)
        if known is not None:
            return known
        failed = dispatcher.failed_choices.get(key)
        if failed is not None:
            keeper.torch_because = failed
            return None
        timed.append(key)
        return measure(key, keeper, prepared, q, k, v)

    choice, _ = dispatcher.timings.get_or_build(key, timing)
    return choice, bool(timed)


def measure(key: str, keeper: Entry, prepared: Entry, q: torch.Tensor, k: torch.Tensor,
            v: torch.Tensor) -> runners.Kept | None:
    """Time both runners' forward on the caller's tensors, in turns, and keep the cheaper (cuDNN on a tie
    within 2%): a runner's cost per call is the larger of this thread's CPU time and its device time (CUDA
    events), each the least of ROUNDS calls. Where only the torch runner fails, cuDNN untimed (`_cudnn_untimed`);
    where the cuDNN runner or the timing fails, None, with `keeper` saying which: torch keeps the signature."""
    pair = (lambda: keeper.torch_call(q, k, v), lambda: cudnn_forward(prepared, q, k, v))
    host: tuple[list, list] = ([], [])
    timed: tuple[list, list] = ([], [])
    failing = ""  # the runner whose call is under way: an exception outside one is the timing's own
    torch_failed = ""
    try:
        with torch.no_grad(), torch.cuda.device(q.device):
            for which, runner in enumerate(pair):
                failing = RUNNER_NAMES[which]
                _synced(runner)  # a device fault of its kernels surfaces here, blamed on it
            failing = ""
            # Not wall time, which at first contact timed the work beside the caller (docs/performance.md,
            # 'Runner choices timed at first contact'): CPU time leaves out GIL waits and other processes;
            # calls queued while the device-side wait lasts run back to back, so their events time the device's
            # work alone (those queued after it ends are timed with their host gaps: the least takes the first).
            torch.cuda._sleep(HOLD_CYCLES)
            for round_ in range(ROUNDS):
                for which in ((0, 1) if round_ % 2 == 0 else (1, 0)):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    failing = RUNNER_NAMES[which]
                    began = time.thread_time_ns()
                    pair[which]()
                    host[which].append((time.thread_time_ns() - began) / 1e3)
                    failing = ""
                    end.record()
                    timed[which].append((start, end))
            end.synchronize()
    except Exception as err:  # noqa: BLE001 - the call goes on, on torch
        because = (f"{failing} failed when timed" if failing else "its runners could not be timed") + \
            f" ({type(err).__name__}: {err})"
        if failing != RUNNER_NAMES[0]:
            return _failed(key, keeper, prepared, because)
        torch_failed = because
    if torch_failed:  # cuDNN tried outside the handler: the torch error's frames (an OOM's tensors) are let go first
        return _cudnn_untimed(key, keeper, prepared, torch_failed, pair[1], q.device)
    torch_us, cudnn_us = (max(min(cpu), min(s.elapsed_time(e) * 1e3 for s, e in events))
                          for cpu, events in zip(host, timed))
    choice = Choice(TORCH if torch_us < 0.98 * cudnn_us else CUDNN, round(torch_us, 2), round(cudnn_us, 2))
    _keep(key, choice)
    dispatcher.counters["measured"] += 1
    runners.store(selection.default_selector(), key, choice)
    return choice


def _synced(call: Callable[[], Any]) -> None:
    """Run `call` and wait for the device to finish its kernels."""
    call()
    done = torch.cuda.Event()
    done.record()
    done.synchronize()


def _warned(choice: runners.Kept) -> bool:
    """Whether timing `choice` already said it (an untimed choice's one warning): no INFO line repeats it."""
    return isinstance(choice, runners.Untimed)


def _cudnn_untimed(key: str, keeper: Entry, prepared: Entry, because: str, cudnn_call: Callable[[], Any],
                   device: torch.device) -> runners.Untimed | None:
    """Where only the torch runner failed when timed (`because`; an out-of-memory error passes), cuDNN runs
    the bucket in this process once a call of it succeeds: a choice not timed, never stored. Else None."""
    try:
        with torch.no_grad(), torch.cuda.device(device):
            _synced(cudnn_call)
    except Exception as err:  # noqa: BLE001 - neither runner ran: torch keeps it, whose calls ran before
        return _failed(key, keeper, prepared, f"{because}; its cuDNN runner failed too ({type(err).__name__}: {err})")
    choice = runners.Untimed(CUDNN, f"{because}; not timed")
    _keep(key, choice)
    log.warning("fusedattn_select: %s: cuDNN runs its bucket in this process (%s)",
                entries.problem_key(prepared, "a call"), choice.because)
    return choice


def _failed(key: str, keeper: Entry, prepared: Entry, because: str) -> None:
    """The timing of `key` failed (`because`): torch keeps the bucket, said once per bucket (its other
    signatures stay on torch without timing again)."""
    keeper.torch_because = because
    with dispatcher.choices_lock:
        first = key not in dispatcher.failed_choices
        dispatcher.failed_choices[key] = because
    if first:
        log.warning("fusedattn_select: %s stays on torch SDPA: %s", entries.problem_key(prepared, "a call"), because)
    return None


def describe_choices() -> dict[str, str]:
    """Each measured, stored or untimed choice of this process: key -> "runner (why)"."""
    return {key: choice.describe() for key, choice in list(dispatcher.choices.items())}


# ----- preparing off the caller's path --------------------------------------------------------------
def dummies(signature: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Compact tensors of `signature`'s devices, dtypes, shapes and dim order (layouts.dense_strides): deciding
    reads no data, so the caller's tensors are not kept alive while it waits (docs/dispatch.md, 'First contact')."""
    return tuple(torch.empty_strided(signature[i + 2], dense_strides(signature[i + 2], signature[i + 3]),
                                     dtype=signature[i + 1], device=signature[i])
                 for i in (1, 5, 9))  # type: ignore[return-value]


def for_callers_geometry(prepared: Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         why: list[str] | None = None) -> Entry | None:
    """`prepared` (decided on the dummies) where the caller's tensors are compact too; else the signature
    decided again, from memory, on the caller's own tensors (None: memory lacks something), so that the runner
    swapped in and timed reads the caller's memory as it is: plans depend on shapes and layout only, their
    binding on strides (K and V as cache rows: ragged.kv_steps; the Lean's geometry; heads-as-batch views)."""
    if all(t.stride() == dense_strides(tuple(t.shape), t.stride()) for t in (q, k, v)):
        return prepared
    try:
        with offpath.only(offpath.MEMORY):
            return entries.new_entry(entries.key(q, k, v, prepared.opts, NO_INPUTS), q, k, v, NO_INPUTS, None)
    except offpath.NotReady as err:
        if why is not None:
            why.append(str(err))
        return None


def start_early() -> Future | None:
    """Start making this process's selector on a thread of its own, or the worker that decides first
    (docs/dispatch.md, 'The selector made ahead'): its Future (the selector, or None), or None where none starts."""
    if selection.made_default_selector() is not None or dense_builds.cudnn_missing():
        return None
    device = _current_device()
    try:
        fresh = dense_builds.fresh_store_target(device) if device is not None else None
    except ConfigError:  # a store setting the first call reports
        return None
    # The worker decides first: its start-up overlaps the model's load. Not where calls decide on the caller's
    # path, nor where several devices are visible (the device the calls go to is a guess there).
    if fresh is not None and run_settings.get().first_calls != "wait" and torch.cuda.device_count() == 1:
        dense_builds.prestart(fresh)
    if device is None or fresh is not None:
        return None
    made: Future = Future()

    def make() -> None:
        # The lock inside default_selector() lets one first call that needs it wait for this one.
        ignore_other_threads_captures()
        try:
            with torch.cuda.device(device):
                selector = selection.default_selector()
                # cuDNN loads its engine libraries here, while the caller loads its model, not at a first call.
                selector.warm_up()
                made.set_result(selector)
        except Exception as err:  # noqa: BLE001 - the first call makes it again and reports why it cannot
            log.debug("fusedattn_select: the selector was not made ahead of the first call (%s: %s)",
                      type(err).__name__, err)
            made.set_result(None)

    threading.Thread(target=make, name="fusedattn-selector", daemon=True).start()
    return made


def _current_device() -> int | None:
    """The CUDA device this thread's calls go to: the current one once CUDA is initialised, device 0
    where it is the only one, else None (not known yet)."""
    if torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0 if torch.cuda.device_count() == 1 else None


def prepare(signature: tuple) -> Entry:
    """The decided entry of `signature`: from the store (and its stored runner choice), else after the
    worker process selected and built everything into it; built here when there is no worker."""
    device = signature[1]
    ignore_other_threads_captures()  # (the preparer's thread: plan loads while the caller captures)
    # A selector made here probes the signature's device (this thread's current one is device 0).
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        return _prepare(signature)


def _prepare(signature: tuple) -> Entry:
    started = time.perf_counter()
    fresh = (dense_builds.fresh_store_target(signature[1].index or 0)
             if selection.made_default_selector() is None else None)
    try:
        if fresh is not None:  # an empty store: the worker decides first (see fresh_store_target)
            raise offpath.NotReady("an empty store")
        with offpath.only(offpath.STORED):
            found = entries.new_entry(signature, *dummies(signature), NO_INPUTS, None)
    except offpath.NotReady:
        job = dense_builds.ask_decide(None, signature, fresh) if fresh is not None else None
        if job is not None:
            job.exception()  # wait for it here, before this process makes its selector
        selector = selection.default_selector()
        if job is None:
            job = dense_builds.ask_decide(selector, signature)
        if job is not None:
            for form in dense_builds.learned_forms(job, _describe(signature)):
                selector.learn_bucket(form)
            try:
                with offpath.only(offpath.STORED):
                    found = entries.new_entry(signature, *dummies(signature), NO_INPUTS, None)
            except offpath.NotReady as err:
                log.info("fusedattn_select: the worker left %s unprepared (%s); building it here",
                         _describe(signature), err)
                found = entries.new_entry(signature, *dummies(signature), NO_INPUTS, None)
        else:
            found = entries.new_entry(signature, *dummies(signature), NO_INPUTS, None)
    if found.fused:
        load_choice(runner_key(found))
    log.debug("fusedattn_select: %s prepared in %.0f ms", _describe(signature), (time.perf_counter() - started) * 1e3)
    return found

