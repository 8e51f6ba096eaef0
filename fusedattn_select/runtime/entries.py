"""Deciding a call signature: its config, selection, plans (or why it falls back) and its runner,
made once and filed in the Dispatcher's tables, where later calls find it by one dict lookup; and
the promotion of a steady bucketed shape to its own plans."""

from __future__ import annotations

import copy
import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Optional

import torch

from fusedattn_select.buckets import heads_as_batch
from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.planning.forms import PlanKind
from fusedattn_select.planning.planner import with_fp8_outputs
from fusedattn_select.result import Selection
from fusedattn_select.types import Backend
from fusedattn_select.runtime import dense_builds, fallback_log, plans, ragged
from fusedattn_select.runtime.dispatcher import Job, dispatcher
from fusedattn_select.runtime.fallback import FALLBACK_REFERENCE, FALLBACK_TORCH, torch_sdpa_blocker
from fusedattn_select.runtime import fp8_training
from fusedattn_select.runtime.fp8 import FP8Scales
from fusedattn_select.runtime.heads import HeadsAsBatch, caller_out, views
from fusedattn_select.runtime.tensor_layouts import bhsd, formats, from_bhsd, tensor_subclass
from fusedattn_select.runtime.lean import Lean, functorch_active, mark_lean, relean
from fusedattn_select.runtime.options import NO_INPUTS, CallOptions, OptionalInputs
from fusedattn_select.runtime.plans import is_capturing
from fusedattn_select.runtime.problem import config, standard_alibi
from fusedattn_select.runtime.ragged import Shape
from fusedattn_select.runtime.run_settings import run_settings
from fusedattn_select.selection.rules import apply_rules
from fusedattn_select.selection.selector import Selector, default_selector

log = logging.getLogger("fusedattn_select")


# The runners of a decided signature, given by `settle` (docs/dispatch.md, 'One owner, one runner per signature').
RUN_TORCH, RUN_HEADS, RUN_FALLBACK, RUN_CUDNN = RUNNERS = ("torch", "heads", "fallback", "cudnn")
# The runner of each backend's "yes" (backends.py): a backend selected without a runner here is
# answered by select() and `why`, and attention() falls back for it.
BACKEND_RUNNERS = {Backend.F16: RUN_CUDNN, Backend.FP8: RUN_CUDNN}


@dataclass(eq=False)
class Entry:
    """Everything one call signature needs, decided once: the config, the selection, the plans."""

    opts: CallOptions
    reason: str = ""                     # "" = fused; else why this signature falls back
    fallback: str = FALLBACK_TORCH
    cfg: Optional[AttnConfig] = None
    selection: Optional[Selection] = None
    forward: Optional[plans.Plan] = None
    backward: Optional[plans.Plan] = None
    dropout_device: Optional[torch.device] = None  # fused with dropout: where each call draws its [seed, offset]
    logged: bool = False
    # Bucket plans only: the call's config, and the offsets and lengths of its shape per plan.
    call_cfg: Optional[AttnConfig] = None
    ragged_forward: Optional[dict[str, torch.Tensor]] = None
    ragged_backward: Optional[dict[str, torch.Tensor]] = None
    kv_steps: tuple[int, int] = (0, 0)   # K and V read as rows of longer buffers (ragged.kv_steps)
    backward_cfg: Optional[AttnConfig] = None  # FP8 training with an fp16/bf16 backward: its config (fp8_training)
    calls: int = 0                       # bucket plans only: calls so far (see count_call)
    shape_class: str = ""                # bucket plans only: the call's problem class
    class_calls_before: int = 0          # bucket plans only: its class's calls before this entry's first
    promotion: str = ""                  # "" = not tried; "pending" (a worker builds); "dense"; else why not
    pending: Optional[Future] = None     # bucket plans only: the worker's job building the dense plans
    replaced: Optional[Entry] = None     # a promoted entry's bucket entry: CUDA graphs captured with it read its memory
    lean: Optional[Lean] = None          # how the lean hot path binds a call's tensors (None: the general path)
    heads: Optional[HeadsAsBatch] = None  # a decode step run with its KV heads as batch: its entry and views (heads.py)
    # Run by torch SDPA, and why: its cuDNN runner is not ready (`waiting` prepares it) or measured slower (tiers.py).
    torch_because: str = ""
    waiting: Optional[Job] = None
    torch_call: Any = None               # (q, k, v) -> out on torch SDPA, made once (fallback.torch_call)
    cudnn: Optional[Entry] = None        # a torch-run signature's cuDNN entry, for paths that never switch
    runner: str = ""                     # what runs its calls (RUNNERS), chosen by `settle` once decided

    @property
    def fused(self) -> bool:
        return not self.reason

    @property
    def f16_backward(self) -> bool:
        return self.backward_cfg is not None

    @property
    def bucketed(self) -> bool:
        return self.ragged_forward is not None

    def lse(self, stats: Optional[torch.Tensor], batch: int, seqlen_q: int) -> Optional[torch.Tensor]:
        """The call's (b, H, s_q, 1) log-sum-exp: a bucket plan's stats hold the whole bucket."""
        if stats is None or not self.bucketed:
            return stats
        return stats[:batch, :, :seqlen_q]


def _signature(t: Optional[torch.Tensor]) -> Any:
    if t is None:
        return None
    return (tuple(t.shape), t.stride(), t.dtype)


def key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: CallOptions, inputs: OptionalInputs) -> tuple:
    """The hot-path key: the options and every tensor property a decision depends on; the last
    item says whether the call is under CUDA-graph capture."""
    capturing = q.is_cuda and is_capturing()
    bias, alibi, sink, seqlens_q, seqlens_kv = inputs
    return (
        options, q.device, q.dtype, tuple(q.shape), q.stride(), k.device, k.dtype, tuple(k.shape), k.stride(),
        v.device, v.dtype, tuple(v.shape), v.stride(), _signature(bias),
        None if alibi is None else tuple(alibi.shape), _signature(sink),
        _lengths_signature(seqlens_q), _lengths_signature(seqlens_kv), tensor_subclass(q, k, v), functorch_active(),
        capturing,
    )


def entry(signature: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
          scales: Optional[FP8Scales], decide: Optional[Callable[[], Entry]] = None) -> Entry:
    """The decision for `signature` (a `key`), made now if it is new, once per key (concurrent first calls
    wait for one build; other signatures build meanwhile): by `decide` (a settled entry), else `new_entry`."""
    found, built = dispatcher.entries.get_or_build(
        signature, decide or (lambda: new_entry(signature, q, k, v, inputs, scales)))
    if built:
        dispatcher.counters["entries_built"] += 1
    return found


def settle(found: Entry) -> Entry:
    """Give a decided entry its runner (RUNNERS): every decision ends here."""
    if found.torch_because:
        found.runner = RUN_TORCH
    elif found.heads is not None and found.lean is None:
        found.runner = RUN_HEADS
    else:
        found.runner = BACKEND_RUNNERS[found.selection.backend] if found.fused else RUN_FALLBACK
    return found


def new_entry(signature: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
              scales: Optional[FP8Scales]) -> Entry:
    """Decide a new call signature: derive the config, select, build the plans (slow, once)."""
    return settle(_decided(signature, q, k, v, inputs, scales))


def _decided(signature: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
             scales: Optional[FP8Scales]) -> Entry:
    opts: CallOptions = signature[0]
    qb, kb, vb = bhsd(q, opts.layout), bhsd(k, opts.layout), bhsd(v, opts.layout)
    blocked = torch_sdpa_blocker(opts, qb, kb, inputs.alibi_slopes is not None)
    new = Entry(opts, fallback=FALLBACK_REFERENCE if blocked else FALLBACK_TORCH)
    subclass = tensor_subclass(q, k, v)
    dtensor = _dtensor_argument(q, k, v) if subclass and blocked else ""
    if dtensor:  # the reference builds plain masks, which a DTensor's ops refuse to mix with it
        raise ConfigError(dtensor, "DTensor", f"a DTensor runs on torch SDPA only, which cannot run {blocked}")
    if subclass:
        new.reason = f"{subclass} inputs: torch runs a tensor subclass by its own dispatch; cuDNN takes plain tensors"
        return new
    if functorch_active():  # vmap's and grad's wrappers have no memory of their own, and the Functions no rules
        new.reason = ("under a torch.func transform (vmap, grad, ...): torch runs it; cuDNN's kernels have no "
                      "functorch rules")
        return new
    try:
        new.cfg = config(qb, kb, vb, formats(qb, kb, vb, opts.layout), opts, inputs, scales)
    except ConfigError as err:
        new.reason = f"no fused config: {err}"
        return new
    if signature[-1]:  # capturing
        return _captured_entry(signature, new)
    selector = default_selector()
    if q.is_cuda and inputs.alibi_slopes is not None and not standard_alibi(inputs.alibi_slopes, new.cfg.num_heads_q):
        new.reason = "alibi_slopes differ from the fixed ALiBi slopes cuDNN computes (2^(-8i/H))"
        return new
    if q.is_cuda and _heads_as_batch(new, selector, qb, kb, vb):
        return new
    # A call too large for int32 ragged offsets runs, and is answered by, its own (dense) graphs.
    steps = (0, 0) if opts.training else ragged.kv_steps(kb, vb)
    fits = ragged.offsets_fit(qb, kb, vb, *steps)
    if not (q.is_cuda and fits and _bucketed(new, selector, Shape(qb.shape[0], qb.shape[2], kb.shape[2], *steps),
                                            q.device)):
        refused = ""  # the FP8 training refusal forward_only replaced with the FP8 forward and a bf16 backward
        if not _select(new, selector, dense=not fits):
            refused = fp8_training.forward_only(new, selector, q.dtype, not fits, BACKEND_RUNNERS)
            if not refused:
                return _off_gpu(new, q.device)
        new.reason = fp8_training.route_backward(new, selector, q.dtype)
        if new.reason or not q.is_cuda:
            return _off_gpu(new, q.device)
        _build_plans(new, selector, q.device)
        if refused and new.fused:
            fp8_training.tell_forward_only(new, refused)
    if new.fused and opts.bias_grad and not new.backward.has("dBias"):
        new.reason = f"cuDNN's backward graph for bias_shape={new.cfg.bias_shape!r} has no dBias output"
    if new.fused and opts.dropout > 0:
        new.dropout_device = q.device
    if new.fused:
        mark_lean(new, qb, kb, vb, inputs)
    return new


def _dtensor_argument(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """The name of the first of q, k and v that is a DTensor ("" for none; none exists before its module loads)."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if dtensor is not None and isinstance(t, dtensor):
            return name
    return ""


def fast_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arguments: tuple, training: bool,
             seqlens_q: Optional[torch.Tensor] = None, seqlens_kv: Optional[torch.Tensor] = None) -> tuple:
    """The key of `by_call`: attention()'s non-tensor arguments as given, whether the call trains,
    and the tensor properties `key` holds (for calls whose only optional tensors are the lengths)."""
    lengths = None if seqlens_q is None and seqlens_kv is None else (_lengths_signature(seqlens_q),
                                                                     _lengths_signature(seqlens_kv))
    return (arguments, training, q.device, q.dtype, q.shape, q.stride(), k.device, k.dtype, k.shape, k.stride(),
            v.device, v.dtype, v.shape, v.stride(), lengths, q.is_cuda and is_capturing())


def _lengths_signature(t: Optional[torch.Tensor]) -> Any:
    """`_signature` and the device: the kernels read the lengths where they are."""
    return None if t is None else (_signature(t), t.device)


def remember_call(call_key: tuple, found: Entry) -> None:
    """File a decided entry under its `fast_key` too."""
    with dispatcher.lock:
        dispatcher.by_call[call_key] = found


# ----- from bucket plans to the shape's own plans -------------------------------------------------

# When a call signature run by bucket plans gets its shape's own plans (`dense_after`, STEADY_SHARE,
# MAX_PASS): see docs/shape-buckets.md, 'Repeated shapes get their own plans, without a stall'.
STEADY_SHARE = 0.5
MAX_PASS = 128


def count_call(found: Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Entry:
    """Count a fused call of `found`; the entry to run it with: its dense successor once a bucketed
    signature is steady (see STEADY_SHARE) and its own graphs are selected and built."""
    if not found.bucketed:
        return found
    # Benign races under threads: the counts decide when, and promotion happens once either way.
    shape_class = found.shape_class
    class_calls, class_pass = dispatcher.class_calls, dispatcher.class_pass
    if found.calls == 0:
        previous = dispatcher.newest.get(shape_class)
        if previous is not None:
            class_pass[shape_class] = min(previous.calls, MAX_PASS)
        dispatcher.newest[shape_class] = found
    found.calls += 1
    class_calls[shape_class] += 1
    if found.promotion:  # tried already: swap in the worker's plans once they are ready
        job = found.pending  # read once: the promoting thread clears it
        return promote(found, q, k, v) if job is not None and job.done() else found
    dense_after = run_settings.get().dense_after
    if found.calls < dense_after or dense_after == 0 or found.calls <= 2 * class_pass[shape_class]:
        return found
    if found.calls < STEADY_SHARE * (class_calls[shape_class] - found.class_calls_before):
        return found  # its class keeps changing shape
    return promote(found, q, k, v)


def promote(old: Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Entry:
    """Replace a bucketed entry by one running its shape's own plans, once (the bucket entry stays,
    with the reason in `promotion`, where they are rejected or fail to build); where a worker process
    builds them (dense_builds), this call asks it, and a call after it is done loads them."""
    if q.is_cuda and is_capturing():  # building or loading is unsafe under CUDA-graph capture: later
        return old
    with dispatcher.lock:
        job = old.pending
        if old.promotion not in ("", "pending") or (job is not None and not job.done()):
            return old
        old.promotion = "trying"
    selector = default_selector()
    cfg = old.call_cfg
    if job is None:
        old.pending = dense_builds.ask(selector, cfg, old.opts.return_lse)
        if old.pending is not None:
            old.promotion = "pending"
            return old
    old.pending = None
    stored = job is not None and dense_builds.report(job, cfg.cache_key())
    builds = plans.plan_stats()["builds"]
    started = time.perf_counter()
    selection = selector.select_dense(cfg)
    dense = dataclasses.replace(old, cfg=cfg, selection=selection, call_cfg=None, forward=None, backward=None,
                                ragged_forward=None, ragged_backward=None, kv_steps=(0, 0), calls=0,
                                promotion="dense", logged=False,
                                pending=None, replaced=old, lean=None)
    if selection.selected:
        _build_plans(dense, selector, q.device)
    if not (selection.selected and dense.fused):
        old.promotion = selection.message if not selection.selected else dense.reason
        log.info("fusedattn_select: %s stays on its bucket plans after %d calls: its own graphs %s (%s)",
                 cfg.cache_key(), old.calls, "are not selected" if not selection.selected else "did not build",
                 old.promotion)
        return old
    opts = old.opts
    qb, kb, vb = bhsd(q, opts.layout), bhsd(k, opts.layout), bhsd(v, opts.layout)
    mark_lean(dense, qb, kb, vb, OptionalInputs())
    replace(old, dense)
    old.promotion = "dense"
    dispatcher.counters["promotions"] += 1
    log.info("fusedattn_select: %s ran %d calls on bucket plans; its own plans run it now (%.0f ms to obtain%s)",
             cfg.cache_key(), old.calls, (time.perf_counter() - started) * 1e3,
             ", from the store: the worker process built them" if stored and plans.plan_stats()["builds"] == builds
             else "")
    return dense


def replace(old: Entry, new: Entry) -> None:
    """Put `new` in place of `old` in every table that holds it."""
    settle(new)
    with dispatcher.lock:
        for call_key, value in list(dispatcher.by_call.items()):
            if value is old:
                dispatcher.by_call[call_key] = new
        for signature, value in dispatcher.entries.items():
            if value is old:
                dispatcher.entries.replace(signature, new)
            elif value.heads is not None and value.heads.entry is old:  # decode steps it ran with their heads as batch
                value.heads = dataclasses.replace(value.heads, entry=new)


def _heads_as_batch(new: Entry, selector: Selector, qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor) -> bool:
    """Run a decode step as its heads-as-batch call (buckets.heads_as_batch) where that problem
    answers it; False, with the entry untouched, otherwise."""
    decode = None if new.opts.return_lse else heads_as_batch(new.cfg)
    dims = views(qb, kb, vb) if decode is not None else None
    if dims is None:
        return False
    selection = selector.select(new.cfg)
    if not (selection.selected and selection.plan.kind is PlanKind.HEADS_AS_BATCH
            and selection.backend in BACKEND_RUNNERS):
        return False
    q_dims, k_dims, v_dims, out_dims = dims
    qh, kh, vh = qb.view(q_dims), kb.view(k_dims), vb.view(v_dims)
    opts = dataclasses.replace(new.opts, layout="bshd", mask="no_mask", window_size=(-1, -1))
    inner = entry(key(qh, kh, vh, opts, NO_INPUTS), qh, kh, vh, NO_INPUTS, None)
    ran = inner.call_cfg or inner.cfg
    on_buckets = inner.bucketed or inner.promotion == "dense"  # (or their successor: a length it keeps seeing)
    if not inner.fused or not on_buckets or ran is None or ran.cache_key() != decode.cache_key():
        log.debug("fusedattn_select: %s keeps its heads (%s)", new.cfg.cache_key(), inner.reason or "another problem")
        return False
    new.selection = selection
    new.heads = HeadsAsBatch(inner, q_dims, k_dims, v_dims, out_dims, new.opts.layout)
    if inner.lean is not None:  # the plans bind memory, not views: the caller's tensors as they are
        out, q = caller_out(new.heads), from_bhsd(qb, new.opts.layout)
        new.forward = inner.forward
        new.lean = relean(new, inner.lean, out=out, out_like_q=out == (tuple(q.shape), q.stride()))
    return True


def _bucketed(new: Entry, selector: Selector, shape: Shape, device: torch.device) -> bool:
    """Run the call through its bucket's plans when cuDNN runs the bucket form (selected and built
    once per bucket); False, with the entry untouched, when the call takes a dense plan instead."""
    form = selector.bucket_for(new.cfg)
    if form is None:
        return False
    selection = selector.select_own(new.cfg)  # answered by the bucket form's graphs where cuDNN runs them
    if not (selection.selected and selection.plan.kind is PlanKind.BUCKET and selection.backend in BACKEND_RUNNERS):
        log.debug("fusedattn_select: %s runs dense plans (%s)", new.cfg.cache_key(),
                  selection.message or selection.plan_form)
        return False
    form = selector.bucket_for(new.cfg) or form  # the bucket answered "yes" that holds this shape
    trial = copy.copy(new)
    trial.cfg, trial.selection, trial.call_cfg = form, selection, new.cfg
    _build_plans(trial, selector, device)
    if not trial.fused:
        log.info("fusedattn_select: bucket plans of %s did not build (%s); dense plans for %s",
                 form.cache_key(), trial.reason, new.cfg.cache_key())
        return False
    fed = ragged.bindings([p for p in (trial.forward, trial.backward) if p is not None], shape, device)
    trial.ragged_forward, trial.ragged_backward = fed[0], (fed[1] if len(fed) > 1 else None)
    trial.kv_steps = (shape.k_step, shape.v_step)
    if shape.k_step:  # never promoted: a dense plan declares contiguous K and V, so it would copy them
        trial.promotion = "K and V are read in place as rows of longer buffers (dense plans would copy them)"
    trial.shape_class = new.cfg.shape_class_key()
    trial.class_calls_before = dispatcher.class_calls[trial.shape_class]
    vars(new).update(vars(trial))
    return True


def _off_gpu(new: Entry, device: torch.device) -> Entry:
    """`new`; for tensors not on a GPU, its reason leads with their device (no fused kernel runs them, whatever
    select() answered, and "no data" is not why it falls back), then states select()'s answer."""
    if device.type == "cuda":
        return new
    answer = new.reason or f"{new.selection.backend.value} ({new.selection.engine})"
    new.reason = f"the tensors are on {device}, where no fused kernel runs; select() answers: {answer}"
    return new


def _select(new: Entry, selector: Selector, dense: bool = False) -> bool:
    """Select the entry's config (and FP8 output recipes; `dense`: by its own graphs, not a shape
    bucket's); False, with the reason set, when none runs."""
    cfg = new.cfg
    first = selector.select_dense(cfg) if dense else selector.select_own(cfg)
    new.cfg, new.selection, reason = with_fp8_outputs(selector.select, cfg, first, new.opts.training)
    if not new.selection.selected:
        new.reason = reason or new.selection.message
        return False
    if new.selection.backend not in BACKEND_RUNNERS:
        new.reason = (f"{new.selection.backend.value} was selected ({new.selection.engine}) but attention() "
                      "has no runner for it")
        return False
    return True


def _build_plans(new: Entry, selector: Selector, device: torch.device) -> None:
    cfg = new.cfg
    wanted = dense_builds.plan_phases(cfg, new.selection.backend, new.opts.return_lse, new.backward_cfg)
    try:
        built = [plans.obtain_plan(c, b, phase, device, selector=selector) for c, b, phase in wanted]
    except plans.PlanBuildError as err:
        selector.record_build_failure(cfg, err.verdict)
        new.reason = err.verdict.reason()
        return
    except ImportError as err:  # cudnn-frontend missing while a snapshot engine selected a backend
        new.reason = f"{new.selection.backend.value} was selected but cuDNN cannot run here: {err}"
        return
    new.forward = built[0]
    new.backward = built[1] if len(built) > 1 else None


def _captured_entry(signature: tuple, new: Entry) -> Entry:
    """A call under CUDA-graph capture: reuse the eager twin's plans (building while capturing is
    unsafe), unless a known-bug rule rejects the problem for cuda_graph=True."""
    cfg = new.cfg.replace(cuda_graph=True)
    selector = default_selector()
    for phase in cfg.phases:
        verdict = apply_rules(cfg, selector.fingerprint, phase)
        if verdict is not None:
            new.reason = verdict.reason()
            return new
    twin = dispatcher.entries.get(signature[:-1] + (False,))
    if twin is None:
        new.reason = ("not warmed up: the first call of a problem builds cuDNN graphs, which cannot "
                      "happen during CUDA-graph capture; run it once before capturing")
        return new
    return twin


def problem_key(found: Entry, unknown: str = "unconfigurable problem") -> str:
    """The cache key of the problem an entry runs (its call's, for bucket plans), else `unknown`."""
    cfg = found.call_cfg or found.cfg
    return cfg.cache_key() if cfg is not None else unknown


def log_fallback(found: Entry) -> None:
    """Log that calls of the entry's problem fall back, and why: once per (problem class, reason), named by
    the first shape's cache key (fallback_log). Per class: generate() asks a new key/value length every
    token, and each shape of one cause is not news."""
    if found.logged:
        return
    cfg = found.call_cfg or found.cfg
    once = (cfg.shape_class_key() if cfg is not None else problem_key(found), found.reason)
    with dispatcher.log_lock:
        logged = once in dispatcher.fallbacks_logged
        dispatcher.fallbacks_logged.add(once)
        found.logged = True
    if not logged:
        where = "torch SDPA" if found.fallback == FALLBACK_TORCH else "the float32 reference"
        log.warning("%s", fallback_log.fallback_line(where, problem_key(found), found.reason))
