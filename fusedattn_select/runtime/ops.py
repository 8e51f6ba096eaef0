"""torch.compile support: attention() as the custom ops `fusedattn_select::attention_fwd` and
`attention_bwd`, with fake implementations and registered autograd (docs/dispatch.md, 'torch.compile').
Their schemas take tensors and scalars only: the tensor names below, then the fields of CallOptions
(options.schema_arguments); `_split` rebuilds the CallOptions inside."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Optional, Sequence

import torch

from fusedattn_select import dtypes
from fusedattn_select.errors import ConfigError
from fusedattn_select.runtime import entries, options, tiers
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime import fp8 as fp8q
from fusedattn_select.runtime.args import Arguments, call_options, check_args
from fusedattn_select.runtime.fallback import fallback_backward, fallback_forward
from fusedattn_select.runtime.fp8 import FP8History, FP8Scales
from fusedattn_select.runtime.fused import Saved, fused_backward, fused_forward
from fusedattn_select.runtime.heads import as_heads, back
from fusedattn_select.runtime.tensor_layouts import bhsd, empty_bhsd, from_bhsd, physical_format
from fusedattn_select.runtime.options import CallOptions, OptionalInputs
from fusedattn_select.runtime.streams import on_device

_DESCALES = ("descale_q", "descale_k", "descale_v")
# dropout_rng: a call's dropout [seed, offset], drawn in the traced code (compiled_attention), so that a
# recomputation of the op (activation checkpointing in a compiled region) gets the forward's mask.
FORWARD_TENSORS = ("q", "k", "v") + OptionalInputs._fields + _DESCALES + ("dropout_rng",)
BACKWARD_TENSORS = ("grad_out", "q", "k", "v", "out", "stats") + OptionalInputs._fields + (
    "rng", "q8", "k8", "v8", "fp8_state")
_MAY_BE_NONE = frozenset(OptionalInputs._fields + _DESCALES + ("dropout_rng",))
# Forward: out, stats, rng, q8, k8, v8, fp8 state. Backward: dq, dk, dv, dbias, dsink.
_FORWARD_OUTPUTS, _BACKWARD_OUTPUTS = 7, 5


def _schema(tensors: Sequence[str], outputs: int) -> str:
    arguments = [f"Tensor{'?' if name in _MAY_BE_NONE else ''} {name}" for name in tensors]
    arguments += options.schema_arguments()
    return "(" + ", ".join(arguments) + ") -> (" + ", ".join(["Tensor"] * outputs) + ")"


def _split(args: Sequence[Any], names: Sequence[str]) -> tuple[dict[str, Any], CallOptions]:
    """An op's arguments as (tensors by name, the CallOptions)."""
    return dict(zip(names, args)), options.unflatten(args[len(names):])


def _inputs(tensors: dict[str, Any]) -> OptionalInputs:
    return OptionalInputs(*(tensors[name] for name in OptionalInputs._fields))


def _meta(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="meta")


def _matching(t: Optional[torch.Tensor], spec: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` with exactly the shape, strides and dtype of `spec` (what the fake implementation promised
    the compiler): `t` itself when it already has them, else a copy; an empty tensor when t is None."""
    if t is None:  # a placeholder (e.g. stats of a fallback): zeros, so outputs are deterministic
        return torch.empty_strided(tuple(spec.shape), spec.stride(), dtype=spec.dtype, device=device).zero_()
    if t.stride() == spec.stride() and t.dtype == spec.dtype and tuple(t.shape) == tuple(spec.shape):
        return t
    out = torch.empty_strided(tuple(spec.shape), spec.stride(), dtype=spec.dtype, device=device)
    return out.copy_(t)


def _dropout_seed(opts: CallOptions, drawn: Optional[torch.Tensor], device: torch.device) -> Optional[torch.Tensor]:
    """A fallback training call's dropout seed, `drawn` by the traced code: the backward op recomputes the
    fallback's forward, and must draw the forward's mask."""
    if not (opts.training and opts.dropout > 0) or drawn is None:
        return None
    if device.type == "cuda" and entries.is_capturing():
        # The seed goes to the device and comes back for the backward's recomputation: no graph holds that.
        raise ConfigError("dropout", opts.dropout, "a compiled training call with dropout whose problem falls back "
                          "(cuDNN does not run it) cannot be captured in a CUDA graph (torch.compile's "
                          "mode='reduce-overhead', torch.cuda.graph): use dropout=0.0 there, or capture without "
                          "compiling (eager calls run torch's own dropout)")
    return drawn


@contextlib.contextmanager
def _seeded(rng: Optional[torch.Tensor], device: torch.device) -> Iterator[None]:
    """The generator of `device` seeded from `rng` (a `_dropout_seed`) inside, restored after; nothing
    when rng is None or empty."""
    if rng is None or not rng.numel():
        yield
        return
    seed = int(rng[0])  # (a CUDA fallback reads it back: such a call is already off the fused hot path)
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else [], device_type=device.type):
        generator = torch.cuda.default_generators[device.index or 0] if cuda else torch.default_generator
        generator.manual_seed(seed)
        yield


# ----- the forward op ----------------------------------------------------------------------------
@torch.library.custom_op("fusedattn_select::attention_fwd", mutates_args=(),
                         schema=_schema(FORWARD_TENSORS, _FORWARD_OUTPUTS))
def _attention_fwd_op(*args: Any) -> tuple[torch.Tensor, ...]:
    tensors, opts = _split(args, FORWARD_TENSORS)
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    inputs = _inputs(tensors)
    scales = None
    if tensors["descale_q"] is not None:
        scales = FP8Scales(*(tensors[name] for name in _DESCALES), dtypes.torch_dtype(opts.o_dtype, torch))
    signature = entries.key(q, k, v, opts, inputs)
    found = tiers.cudnn_entry(entries.entry(signature, q, k, v, inputs, scales), signature, q, k, v, inputs, scales)
    specs = _attention_fwd_fake(*(_meta(t) for t in args))
    heads = found.heads
    if heads is not None:  # a decode step run with its heads as batch (runtime/heads.py): never promoted,
        found, (q, k, v) = heads.entry, as_heads(heads, q, k, v)  # as in eager mode
    elif found.fused and found.bucketed:
        found = entries.count_call(found, q, k, v)
    saved: tuple = (None,) * 4
    dispatcher.counters["calls"] += 1
    dispatcher.counters["fused_calls" if found.fused else "fallback_calls"] += 1
    if found.fused:
        with on_device(q):
            out, stats, rng, fp8_saved = fused_forward(found, q, k, v, inputs, scales, tensors["dropout_rng"])
        if heads is not None:
            out = back(heads, out)
        qb = bhsd(q, found.opts.layout)
        stats = found.lse(stats, qb.shape[0], qb.shape[2])
        if fp8_saved is not None and specs[3].numel():
            # float8 travels as its bytes: opcheck and AOT autograd treat op outputs as numbers
            # (multiplying, promoting) and float8 supports few such ops.
            saved = tuple(t.view(torch.uint8) for t in fp8_saved[:3]) + (fp8_saved[3],)
    else:
        entries.log_fallback(found)
        rng = _dropout_seed(opts, tensors["dropout_rng"], q.device)  # its backward recomputes this forward
        with torch.no_grad(), _seeded(rng, q.device):
            out, stats = fallback_forward(found.fallback, opts, q, k, v, inputs, scales)
    if stats is None or not specs[1].numel():
        stats = None
    if rng is None or not specs[2].numel():
        rng = None
    elif rng is tensors["dropout_rng"]:
        rng = rng.clone()  # (an op's output may not be one of its inputs)
    values = (out, stats, rng) + tuple(saved)
    return tuple(_matching(t, spec, q.device) for t, spec in zip(values, specs))


@_attention_fwd_op.register_fake
def _attention_fwd_fake(*args: Any) -> tuple[torch.Tensor, ...]:
    tensors, opts = _split(args, FORWARD_TENSORS)
    q, v, layout = tensors["q"], tensors["v"], opts.layout
    qb, vb = bhsd(q, layout), bhsd(v, layout)
    b, h, s, _ = qb.shape
    dims = (b, h, s, vb.shape[3])
    out_dtype = dtypes.torch_dtype(opts.o_dtype, torch) if opts.o_dtype else q.dtype
    out = from_bhsd(empty_bhsd(dims, physical_format(qb, layout) or layout, out_dtype, q.device), layout)
    stats_shape = (b, h, s, 1) if opts.training or opts.return_lse else (0,)
    # (float64 inputs run the float64 reference, whose lse is float64)
    stats_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    stats = torch.empty(stats_shape, dtype=stats_dtype, device=q.device)
    rng = torch.empty(2 if opts.training and opts.dropout > 0 else 0, dtype=torch.int64, device=q.device)
    if opts.fp8 and opts.training and tensors["descale_q"] is None:
        saved = tuple(torch.empty_like(bhsd(tensors[n], layout), dtype=torch.uint8) for n in ("q", "k", "v"))
        state = torch.empty(len(fp8q.STATE), dtype=torch.float32, device=q.device)
    else:
        saved = tuple(torch.empty(0, dtype=torch.uint8, device=q.device) for _ in range(3))
        state = torch.empty(0, dtype=torch.float32, device=q.device)
    return (out, stats, rng) + saved + (state,)


# ----- the backward op ---------------------------------------------------------------------------
@torch.library.custom_op("fusedattn_select::attention_bwd", mutates_args=(),
                         schema=_schema(BACKWARD_TENSORS, _BACKWARD_OUTPUTS))
def _attention_bwd_op(*args: Any) -> tuple[torch.Tensor, ...]:
    tensors, opts = _split(args, BACKWARD_TENSORS)
    q, k, v, grad_out = tensors["q"], tensors["k"], tensors["v"], tensors["grad_out"]
    inputs = _inputs(tensors)
    signature = entries.key(q, k, v, opts, inputs)
    found = tiers.cudnn_entry(entries.entry(signature, q, k, v, inputs, None), signature, q, k, v, inputs, None)
    specs = _attention_bwd_fake(*(_meta(t) for t in args))
    if found.fused:
        fp8_saved = None
        if opts.fp8 and tensors["fp8_state"].numel():
            fp8_dtype = found.backward.specs["q"].dtype
            fp8_saved = tuple(tensors[n].view(fp8_dtype) for n in ("q8", "k8", "v8")) + (tensors["fp8_state"],)
        rng = tensors["rng"]
        saved = Saved(tensors["out"], tensors["stats"], rng if rng.numel() else None, fp8_saved)
        with on_device(q):
            grads = fused_backward(found, grad_out, q, k, v, inputs, saved)
    else:
        with _seeded(tensors["rng"], q.device):  # the forward's dropout mask
            grads = fallback_backward(found.fallback, found.opts, grad_out, q, k, v, inputs)
    return tuple(_matching(g, spec, q.device) for g, spec in zip(grads, specs))


@_attention_bwd_op.register_fake
def _attention_bwd_fake(*args: Any) -> tuple[torch.Tensor, ...]:
    tensors, opts = _split(args, BACKWARD_TENSORS)
    q, bias, sink = tensors["q"], tensors["bias"], tensors["sink"]
    dbias = torch.empty_like(bias) if bias is not None and opts.bias_grad else torch.empty(0, dtype=q.dtype, device=q.device)
    dsink = torch.empty_like(sink) if sink is not None and opts.sink_grad else torch.empty(0, dtype=q.dtype, device=q.device)
    return torch.empty_like(q), torch.empty_like(tensors["k"]), torch.empty_like(tensors["v"]), dbias, dsink


# ----- autograd of the forward op ----------------------------------------------------------------
def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    tensors, opts = _split(inputs, FORWARD_TENSORS)
    named = dict(zip(("out", "stats", "rng", "q8", "k8", "v8", "fp8_state"), output))
    ctx.save_for_backward(*(named[n] if n in named else tensors[n] for n in BACKWARD_TENSORS[1:]))
    # Only `out` is differentiable: the lse (return_lse) takes no gradient, as in eager mode.
    ctx.mark_non_differentiable(*output[1:])
    # The backward op runs the training graphs of the problem.
    ctx.options = dataclasses.replace(opts, training=True)


def _backward(ctx: Any, grad_out: torch.Tensor, *_unused_grads: Any) -> tuple:
    opts: CallOptions = ctx.options
    dq, dk, dv, dbias, dsink = torch.ops.fusedattn_select.attention_bwd(
        grad_out.contiguous() if grad_out.stride()[-1] != 1 else grad_out, *ctx.saved_tensors,
        *options.flatten(opts),
    )
    # Gradients for q, k, v, bias, alibi_slopes (none: trainable slopes are refused by check_args),
    # sink; none for the other tensors and the options.
    rest = len(FORWARD_TENSORS) - 6 + len(options.FIELD_NAMES)
    return (dq, dk, dv, dbias if opts.bias_grad else None, None, dsink if opts.sink_grad else None) + (None,) * rest


torch.library.register_autograd("fusedattn_select::attention_fwd", _backward, setup_context=_setup_context)


def _plain(value: Any) -> Any:
    """A number as a plain Python number: one dynamo traces as a symbol (a float or int argument of a function
    compiled with dynamic shapes, which dynamo shows as a float or an int) becomes the number it holds,
    guarded on, since the checks take plain numbers and another scale, dropout or window is another kernel
    configuration, compiled anew. A bool or anything else as given (the checks refuse what they refuse)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (float, torch.SymFloat)):
        return value.__float__()  # (float() keeps a symbol symbolic)
    if isinstance(value, (int, torch.SymInt)):
        return value.__int__()
    return value


def compiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
                       arguments: Arguments) -> Any:
    """attention() while torch.compile traces: checks, then the forward op."""
    window = arguments.window_size
    if isinstance(window, (tuple, list)):
        plain = tuple(_plain(w) for w in window)
        window = list(plain) if isinstance(window, list) else plain
    # Arguments(...), not _replace: torch 2.5's dynamo does not trace namedtuple._make.
    arguments = Arguments(arguments.layout, arguments.mask, window, _plain(arguments.attn_scale),
                          _plain(arguments.dropout), *arguments[5:])
    check_args(q, k, v, inputs, arguments)
    if isinstance(arguments.fp8, FP8History):
        raise ConfigError("fp8", arguments.fp8, "delayed scaling (FP8History) runs eagerly only; under "
                                                "torch.compile use fp8=True (current scaling)")
    if isinstance(arguments.fp8, FP8Scales) and fp8q.is_fp8_dtype(arguments.fp8.o_dtype):
        raise ConfigError("fp8.o_dtype", arguments.fp8.o_dtype, "FP8 output (an FP8Tensor) runs eagerly only; "
                                                                "under torch.compile use torch.float16 or torch.bfloat16")
    scales = arguments.fp8 if isinstance(arguments.fp8, FP8Scales) else None
    opts = call_options(q, k, v, inputs, arguments)
    descales = (None, None, None) if scales is None else (scales.descale_q, scales.descale_k, scales.descale_v)
    # Drawn here, in the traced code: a compiled region's checkpointing saves it (random ops are not recomputed).
    dropout_rng = (torch.randint(0, 2 ** 62, (2,), dtype=torch.int64, device=q.device) if opts.dropout > 0
                   else None)
    outputs = torch.ops.fusedattn_select.attention_fwd(q, k, v, *inputs, *descales, dropout_rng,
                                                       *options.flatten(opts))
    return (outputs[0], outputs[1]) if arguments.return_lse else outputs[0]
