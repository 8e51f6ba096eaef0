"""The lean hot path: an entry's plans fed the caller's tensors as they are, with no views, copies or
dicts per call (which memory each plan form takes: docs/dispatch.md, 'Hot path').

`mark_lean` gives an entry its Lean where its plans take q, k, v and nothing the caller varies per call
(no bias, ALiBi slopes, sink, lengths, dropout or FP8); other entries run the general path (fused.py).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Callable, Optional, Protocol

import torch

from fusedattn_select.runtime import native, plans
from fusedattn_select.runtime.options import CallOptions, OptionalInputs
from fusedattn_select.runtime.tensor_layouts import FROM_BHSD, in_caller_order

# The order the lean path hands a call's tensors over in (then a bucket plan's offsets and lengths).
LEAN_FORWARD = ("q", "k", "v", "o", "stats")
LEAN_BACKWARD = ("q", "k", "v", "o", "stats", "dO", "dQ", "dK", "dV")

Geometry = tuple[tuple[int, ...], tuple[int, ...]]  # (shape, strides)


@dataclass(frozen=True)
class Lean:
    """How an entry's plans take a call's tensors: outputs allocated in the caller's dim order with
    the memory the plans write, and where each plan finds its tensors."""

    out: Geometry                      # o in the caller's dim order
    out_dtype: torch.dtype
    # Positions in LEAN_FORWARD + the forward's offsets and lengths of the forward plan's tensors, in binding order.
    forward_index: tuple[int, ...]
    stats: Optional[plans.TensorSpec] = None  # the softmax stats the forward plan writes, if any
    # Training: dq, dk, dv in the caller's dim order and the strides dO must have, and the
    # positions in LEAN_BACKWARD + the backward's offsets and lengths; grads None: general path.
    grads: Optional[tuple[Geometry, Geometry, Geometry]] = None
    do_strides: tuple[int, ...] = ()
    backward_index: tuple[int, ...] = ()
    # Whether o (dq, dk, dv) has q's (q's, k's, v's) geometry and dtype: then the cheaper empty_like makes it.
    out_like_q: bool = False
    grads_like_qkv: bool = False
    # Bucket plans: the offset and length tensors of the call's shape, in binding-name order.
    ragged_forward: tuple[torch.Tensor, ...] = ()
    ragged_backward: tuple[torch.Tensor, ...] = ()
    # forward_index and backward_index as functions of the call's tuple (itemgetter: no Python loop;
    # a plan binds at least q, k, v and o, so each returns a tuple).
    pick_forward: Callable[[tuple], tuple] = field(init=False, repr=False, compare=False)
    pick_backward: Optional[Callable[[tuple], tuple]] = field(init=False, repr=False, compare=False)
    # The compiled LeanPlan that runs these calls instead (runtime/native), or None: the Python path;
    # and native.generation() when it was looked for (a module built since is looked for again).
    native: Any = field(default=None, repr=False, compare=False)
    native_generation: int = field(default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pick_forward", itemgetter(*self.forward_index))
        object.__setattr__(self, "pick_backward", itemgetter(*self.backward_index) if self.backward_index else None)


class Entry(Protocol):
    """What the lean path reads of a decided call (a runtime.entries.Entry)."""

    opts: CallOptions
    forward: Optional[plans.Plan]
    backward: Optional[plans.Plan]
    rng: Optional[torch.Tensor]
    ragged_forward: Optional[dict[str, torch.Tensor]]
    ragged_backward: Optional[dict[str, torch.Tensor]]
    kv_steps: tuple[int, int]
    lean: Optional[Lean]

    @property
    def bucketed(self) -> bool: ...


def caller_geometry(spec: plans.TensorSpec, layout: str) -> Geometry:
    """(shape, strides) in the caller's dim order of a graph tensor declared in logical BHSD."""
    return in_caller_order(spec.dims, spec.strides, layout)


def _bshd_strides(dims: tuple[int, ...], step: int = 0) -> tuple[int, ...]:
    """Strides of logical (B, H, S, D) `dims` held in BSHD memory: contiguous, or sequences `step`
    elements apart (rows of a longer buffer)."""
    _, h, s, d = dims
    return (step or s * h * d, d, h * d, 1)


def bshd_geometry(dims: tuple[int, ...], layout: str) -> Geometry:
    """(shape, strides) in the caller's dim order of logical (B, H, S, D) `dims` held in contiguous
    BSHD memory: how bucket plans read and write the caller's tensors."""
    return in_caller_order(dims, _bshd_strides(dims), layout)


def same_memory(dims: tuple[int, ...], want: tuple[int, ...], got: tuple[int, ...]) -> bool:
    """Strides that address the same elements (those of size-1 dims never do)."""
    return all(n == 1 or a == b for n, a, b in zip(dims, want, got))


def _takes_qkv(plan: plans.Plan, inputs: tuple[str, ...], outputs: tuple[tuple[str, ...], ...],
               ragged: tuple[str, ...]) -> bool:
    return (plan.binds_by_declaration and sorted(n for n in plan.inputs if n not in ragged) == sorted(inputs)
            and tuple(sorted(plan.outputs)) in outputs)


@dataclass(frozen=True)
class _PlanFacts:
    """What the lean path reads of an entry's plans, the same for every call they run: where each
    plan finds its tensors (None: that plan takes more than q, k, v and runs the general path)."""

    forward_index: Optional[tuple[int, ...]]
    stats: Optional[plans.TensorSpec]
    backward_index: Optional[tuple[int, ...]]


def _plan_facts(forward: plans.Plan, backward: Optional[plans.Plan], ragged_fwd: tuple[str, ...],
                ragged_bwd: tuple[str, ...]) -> _PlanFacts:
    """The _PlanFacts of a forward plan (with its backward plan and offset names), made once."""
    key = ("lean", backward, ragged_fwd, ragged_bwd)
    facts = forward.derived.get(key)
    if facts is not None:
        return facts
    forward_index = backward_index = None
    if _takes_qkv(forward, ("k", "q", "v"), (("o",), ("o", "stats")), ragged_fwd):
        names = LEAN_FORWARD + ragged_fwd
        forward_index = tuple(names.index(n) for n in forward.order)
        if backward is not None and _takes_qkv(backward, ("dO", "k", "o", "q", "stats", "v"), (("dK", "dQ", "dV"),),
                                               ragged_bwd) and all(
                backward.specs[n] == forward.specs[n] for n in ("q", "k", "v", "o", "stats")) and all(
                backward.specs["d" + n].dtype == forward.specs[n.lower()].dtype for n in ("Q", "K", "V")):
            names = LEAN_BACKWARD + ragged_bwd
            backward_index = tuple(names.index(n) for n in backward.order)
    stats = forward.specs["stats"] if "stats" in forward.outputs else None
    facts = forward.derived[key] = _PlanFacts(forward_index, stats, backward_index)
    return facts


def mark_lean(new: Entry, qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, inputs: OptionalInputs) -> None:
    """Give a fused entry its Lean where its plans take the call's q, k, v and nothing else."""
    forward, backward, layout = new.forward, new.backward, new.opts.layout
    if new.opts.fp8 or new.dropout_device is not None or any(t is not None for t in inputs):
        return
    bucketed = new.bucketed
    ragged_fwd = tuple(new.ragged_forward) if bucketed else ()
    ragged_bwd = tuple(new.ragged_backward) if bucketed and new.ragged_backward is not None else ()
    facts = _plan_facts(forward, backward, ragged_fwd, ragged_bwd)
    if facts.forward_index is None:
        return
    order = FROM_BHSD[layout]
    given = []  # q, k, v in the caller's dim order (read off the BHSD views: no torch calls)
    for name, t, step in (("q", qb, 0), ("k", kb, new.kv_steps[0]), ("v", vb, new.kv_steps[1])):
        spec = forward.specs[name]
        dims, strides = tuple(t.shape), t.stride()
        want_dims, want_strides = (dims, _bshd_strides(dims, step)) if bucketed else (spec.dims, spec.strides)
        if t.dtype != spec.dtype or dims != want_dims or not same_memory(want_dims, want_strides, strides):
            return
        given.append((tuple(dims[i] for i in order), tuple(strides[i] for i in order)))
    o_spec = forward.specs["o"]
    if bucketed:
        out = bshd_geometry((qb.shape[0], qb.shape[1], qb.shape[2], vb.shape[3]), layout)
    else:
        out = caller_geometry(o_spec, layout)
    fields = dict(
        out=out, out_dtype=o_spec.dtype, forward_index=facts.forward_index, stats=facts.stats,
        out_like_q=out == given[0] and o_spec.dtype == qb.dtype,
        ragged_forward=tuple(new.ragged_forward[n] for n in ragged_fwd))
    if facts.backward_index is not None:
        if bucketed:
            grads = tuple(bshd_geometry(tuple(t.shape), layout) for t in (qb, kb, vb))
            do_strides = out[1]
        else:
            grads = tuple(caller_geometry(backward.specs[g], layout) for g in ("dQ", "dK", "dV"))
            do_strides = caller_geometry(backward.specs["dO"], layout)[1]
        fields.update(grads=grads, do_strides=do_strides, backward_index=facts.backward_index,
                      grads_like_qkv=list(grads) == given,
                      ragged_backward=tuple(new.ragged_backward[n] for n in ragged_bwd))
    new.lean = relean(new, Lean(**fields))


def relean(entry: Entry, lean: Lean, **changes: Any) -> Lean:
    """`lean` with `changes`, and the compiled LeanPlan of the result where one can run it."""
    lean = dataclasses.replace(lean, **changes)
    made_at = native.generation()
    return dataclasses.replace(lean, native=native.lean_plan(entry, lean), native_generation=made_at)


def with_new_module(entry: Any) -> Optional[Lean]:
    """The entry's lean form, taking a compiled module built since it was made (never while a CUDA
    graph is captured: deserializing a graph is not capturable)."""
    lean = entry.lean
    if lean.native is None and lean.native_generation != native.generation() and not torch.cuda.is_current_stream_capturing():
        lean = entry.lean = relean(entry, lean)
    return lean


def lean_forward(entry: Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                 ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(out in the caller's layout, softmax stats or None) of a lean entry's call."""
    plan, lean = entry.forward, entry.lean
    if lean.out_like_q:
        out = torch.empty_like(q)
    else:
        shape, strides = lean.out
        out = torch.empty_strided(shape, strides, dtype=lean.out_dtype, device=q.device)
    spec = lean.stats
    stats = None if spec is None else torch.empty_strided(spec.dims, spec.strides, dtype=spec.dtype, device=q.device)
    plan.run(lean.pick_forward((q, k, v, out, stats) + lean.ragged_forward))
    return out, stats


def lean_backward(entry: Entry, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, stats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of a lean entry's call (Lean.grads set), in the caller's layout."""
    plan, lean = entry.backward, entry.lean
    device = q.device
    if grad_out.stride() != lean.do_strides:  # e.g. the expanded gradient of a sum: into the declared memory
        grad_out = torch.empty_strided(grad_out.shape, lean.do_strides, dtype=grad_out.dtype,
                                       device=device).copy_(grad_out)
    if lean.grads_like_qkv:
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    else:
        (dq_shape, dq_strides), (dk_shape, dk_strides), (dv_shape, dv_strides) = lean.grads
        dq = torch.empty_strided(dq_shape, dq_strides, dtype=q.dtype, device=device)
        dk = torch.empty_strided(dk_shape, dk_strides, dtype=k.dtype, device=device)
        dv = torch.empty_strided(dv_shape, dv_strides, dtype=v.dtype, device=device)
    plan.run(lean.pick_backward((q, k, v, out, stats, grad_out, dq, dk, dv) + lean.ragged_backward))
    return dq, dk, dv


def differentiable_once(backward: Callable) -> Callable:
    """An autograd Function's `backward` run without a graph: under create_graph=True, gradients of inputs
    that require grad carry a node that raises if differentiated again. cuDNN's backward is no torch op,
    so a second derivative would otherwise lose its terms without an error (torch's
    `once_differentiable` marks them only where the incoming gradient requires grad). `backward` takes
    (ctx, saved tensors, *grads): they are unpacked once, here (non-reentrant checkpointing refuses a second)."""
    @functools.wraps(backward)
    def wrapper(ctx: Any, *grads: Any) -> Any:
        saved = ctx.saved_tensors
        if not torch.is_grad_enabled():  # (autograd runs a backward so, unless create_graph=True)
            return backward(ctx, saved, *grads)
        with torch.no_grad():
            outputs = backward(ctx, saved, *grads)
        if not any(ctx.needs_input_grad):
            return outputs
        # The node's edges lead to what the gradients came from (the incoming gradients, the saved inputs):
        # autograd.grad(..., inputs=...) runs only nodes on a path to its inputs, so it must be on one.
        sources = tuple(t for t in grads + tuple(saved) if isinstance(t, torch.Tensor) and t.requires_grad)
        error = torch._C._functions.DelayedError(b"attention(): a double backward is not supported (cuDNN's "
                                                 b"backward is not differentiable)", len(outputs) + len(sources))

        def marked(t: Any) -> Any:
            return t.detach().requires_grad_() if isinstance(t, torch.Tensor) else t
        return error(*(marked(t) for t in outputs), *sources)[:len(outputs)]
    return wrapper


class LeanAttention(torch.autograd.Function):
    """Eager autograd for lean entries: q, k, v only, no options to carry. Call it by `apply_lean`."""

    @staticmethod
    def forward(ctx, entry, q, k, v):
        out, stats = lean_forward(entry, q, k, v)
        ctx.entry = entry
        ctx.save_for_backward(q, k, v, out, stats)
        return out

    @staticmethod
    @differentiable_once
    def backward(ctx, saved, grad_out):
        q, k, v, out, stats = saved
        return (None,) + lean_backward(ctx.entry, grad_out, q, k, v, out, stats)


# Whether a functorch transform (vmap, grad, ...) wraps this call; where torch cannot say, assume one
# does, so only Function.apply (which handles them) runs it.
functorch_active: Callable[[], bool] = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)
# Function.apply's own work, without its Python wrapper: that wrapper binds default arguments (this
# Function has no setup_context) and unwraps dead functorch wrappers, then makes this same call.
# These are torch internals: where a torch version lacks one, apply_lean is Function.apply.
try:
    _apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, LeanAttention)
    _unwrap_if_dead = torch._C._functorch.unwrap_if_dead
except (AttributeError, KeyError):
    _apply = None


def apply_lean(entry: Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """LeanAttention.apply(entry, q, k, v), a few microseconds sooner outside functorch transforms."""
    if _apply is None or functorch_active():
        return LeanAttention.apply(entry, q, k, v)
    return _apply(entry, _unwrap_if_dead(q), _unwrap_if_dead(k), _unwrap_if_dead(v))
