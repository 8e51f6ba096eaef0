"""attention(): run the fused attention kernels the selector chose for these tensors, or fall back.

What runs a call, how plans are found and when it falls back: docs/dispatch.md. Dim orders and memory
layouts: attention()'s `layout` argument and tensor_layouts.formats. Eager calls run through a
torch.autograd.Function (fused.py); under torch.compile, inside the custom ops of ops.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.runtime import entries, native, ops, plans, tiers
from fusedattn_select.runtime import fp8 as fp8q
from fusedattn_select.runtime.args import (NO_WINDOW, TABLE_ARITY, Arguments, call_inputs, call_options, check_args,
                                           keyable, plain_numbers, split_keywords)
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.fallback import FALLBACK_REFERENCE, FALLBACK_TORCH, fallback_forward
from fusedattn_select.runtime.fp8 import FP8History, FP8Scales, FP8Tensor
from fusedattn_select.runtime.fused import FusedAttention, fused_forward
from fusedattn_select.runtime.heads import as_heads, back
from fusedattn_select.runtime.lean import apply_lean, functorch_active, lean_forward, with_new_module
from fusedattn_select.runtime.options import NO_INPUTS, OptionalInputs
from fusedattn_select.runtime.problem import config
from fusedattn_select.runtime.streams import foreign_device
from fusedattn_select.runtime.tensor_layouts import LAYOUTS, bhsd, formats, tensor_subclass

__all__ = [
    "FALLBACK_REFERENCE",
    "FALLBACK_TORCH",
    "FP8History",
    "FP8Scales",
    "FP8Tensor",
    "LAYOUTS",
    "attention",
    "clear_plans",
    "config_from_tensors",
    "dispatch_info",
]


def config_from_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_training: Optional[bool] = None,
                        **arguments: Any) -> AttnConfig:
    """The AttnConfig attention() selects for these tensors and keyword arguments (those of attention()).

    `is_training` None means detected (grad mode on and an input requires grad), else True or False.
    Raises ConfigError for bad arguments, and for problems AttnConfig cannot describe (float32 inputs,
    bias together with ALiBi slopes); TypeError for a keyword attention() does not take.
    """
    given, inputs = split_keywords(arguments)
    q, k, v = call_inputs(q, k, v)
    if is_training is not None and not isinstance(is_training, bool):
        raise ConfigError("is_training", is_training, "must be None (detected), True or False")
    check_args(q, k, v, inputs, given)
    opts = call_options(q, k, v, inputs, given)
    if is_training is not None:
        opts = dataclasses.replace(opts, training=is_training)
    qb, kb, vb = bhsd(q, opts.layout), bhsd(k, opts.layout), bhsd(v, opts.layout)
    scales = given.fp8 if isinstance(given.fp8, FP8Scales) else None
    return config(qb, kb, vb, formats(qb, kb, vb, opts.layout), opts, inputs, scales)


# Where `fp8` sits among attention()'s arguments: an FP8History is keyed by its output precision.
_FP8_FIELD = Arguments._fields.index("fp8")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout: Optional[str] = None,
              mask: str = "no_mask", window_size: tuple[int, int] = NO_WINDOW, attn_scale: Optional[float] = None,
              dropout: float = 0.0, bias: Optional[torch.Tensor] = None, alibi_slopes: Optional[torch.Tensor] = None,
              softmax: str = "vanilla", sink: Optional[torch.Tensor] = None,
              seqlens_q: Optional[torch.Tensor] = None, seqlens_kv: Optional[torch.Tensor] = None,
              deterministic: bool = False, fp8: Any = False, return_lse: bool = False) -> Any:
    """Scaled-dot-product attention on the fused backend the selector picks, or a logged fallback.

    Args:
        q, k, v: 4-D tensors in the dim order named by `layout` (default "bshd": (B, S, H, D)).
            fp16/bf16 run fused; float32 falls back, except inside torch.autocast, which casts float32,
            fp16 and bf16 inputs to its dtype as it does scaled_dot_product_attention's; float8 needs
            `fp8=FP8Scales(...)`.
            K/V may have fewer heads than Q (GQA/MQA) and another head dim for V.
        layout: "bshd", "sbhd" or "bhsd" (dim order of q, k, v and of the output); None = "bshd".
        mask: "no_mask", "causal", "causal_bottom_right", "padding", "padding_causal",
            "padding_causal_bottom_right" (TransformerEngine names; see reference/semantics.py for meaning).
        window_size: sliding window (left, right), -1 = unbounded.
        attn_scale: score scale; None = 1/sqrt(head_dim).
        dropout: probability of dropping an attention weight (applied whenever > 0).
        bias: additive post-scale bias broadcastable to (B, Hq, Sq, Skv), taken in q's precision; trainable if it
            requires grad.
        alibi_slopes: ALiBi slopes (Hq,) or (B, Hq); fused only with cuDNN's standard slopes. They take no
            gradient: slopes that require grad (with grad mode on) raise ConfigError; detach them.
        softmax: "vanilla", "off_by_one" or "learnable" (with `sink`, one logit per q head).
        seqlens_q, seqlens_kv: actual lengths (B,) for the padding masks, each from 0 to the sequence length
            (checked for CPU tensors; not read back from a GPU).
        deterministic: ask cuDNN for a deterministic backward pass.
        fp8: True quantizes fp16/bf16 inputs per tensor (current scaling) and runs cuDNN's FP8
            kernels, returning the input precision; an `FP8History` (one per call site) scales from
            the amaxes of earlier calls instead (delayed scaling: no amax pass; with
            `o_dtype=torch.float8_e4m3fn`, inference returns an `FP8Tensor`); `FP8Scales(...)`
            for float8 inputs (`o_dtype=torch.float8_e4m3fn` returns the kernel's FP8 output as an
            `FP8Tensor(data, descale)`, skipping the pass that converts it).
        return_lse: also return the softmax log-sum-exp (B, Hq, Sq, 1), float32 (float64 for float64 inputs),
            not differentiable.

    Returns:
        The output in the caller's layout (..., head_dim_v), and the lse if `return_lse`.
    """
    given = (layout, mask, window_size, attn_scale, dropout, softmax, deterministic, fp8, return_lse)
    q, k, v = call_inputs(q, k, v)
    if torch.compiler.is_compiling():
        # Arguments(*given), not _make: torch 2.5's dynamo does not trace namedtuple._make.
        return ops.compiled_attention(q, k, v, OptionalInputs(bias, alibi_slopes, sink, seqlens_q, seqlens_kv),
                                      Arguments(*given))
    # Each condition is read once: this is the host time of every call. torch.func's wrapped tensors and
    # subclasses with a dispatch of their own are decided by the full key (entries._decided).
    no_tensors = bias is None and alibi_slopes is None and sink is None and not functorch_active()
    no_lengths = seqlens_q is None and seqlens_kv is None
    lean_call = no_tensors and no_lengths and fp8 is False and return_lse is False  # what the compiled table runs
    if lean_call:
        table = dispatcher.native_call  # the compiled module's table of lean calls (None: not loaded)
        if table is not None:
            out = table(q, k, v, given[:TABLE_ARITY])
            if out is not None:
                return out
    found = call_key = None
    # The hot path (docs/dispatch.md, 'Hot path'). The key holds every value validation looks at, so
    # validation runs once per call signature; arguments of types the checks refuse never make a key
    # (their values may equal accepted ones: 1.0 == 1 == True; args.plain_numbers).
    # An FP8History is keyed by its output precision: the history itself is per call, not per signature.
    if (no_tensors and (type(fp8) is bool or type(fp8) is FP8History) and type(deterministic) is bool
            and type(return_lse) is bool and plain_numbers(given)
            and (type(q) is type(k) is type(v) is torch.Tensor or not tensor_subclass(q, k, v))):
        arguments = given if type(fp8) is bool else given[:_FP8_FIELD] + ((FP8History, fp8.o_dtype), return_lse)
        try:
            training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
            call_key = entries.fast_key(q, k, v, arguments, training, seqlens_q, seqlens_kv)
            found = dispatcher.by_call.get(call_key)
        except (TypeError, AttributeError, RuntimeError):  # an unhashable argument (a list window_size), not
            call_key = None  # tensors, or tensors without strides (nested): the checks name them
    inputs = NO_INPUTS if no_tensors and no_lengths else OptionalInputs(bias, alibi_slopes, sink, seqlens_q, seqlens_kv)
    if found is None:
        found = _decide(q, k, v, inputs, Arguments._make(given))
        if call_key is not None:
            entries.remember_call(call_key, found)
    if lean_call and found.lean is not None and call_key is not None:
        _table_remember(found, q, k, v, given[:TABLE_ARITY])
    return _run(found, q, k, v, inputs, fp8, return_lse)


def _table_remember(found: entries.Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arguments: tuple) -> None:
    """File a compiled lean entry in the compiled module's table, so that its next call runs without
    Python: not a bucketed one (its calls are counted for its promotion) or one under functorch."""
    lean = found.lean
    if lean is not None and lean.native is None and lean.native_generation != native.generation():
        lean = with_new_module(found)
    if lean is not None and lean.native is not None and found.fused and not found.bucketed and not functorch_active():
        native.remember(q, k, v, arguments, lean.native)


def _run(found: entries.Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
         fp8: Any, return_lse: bool) -> Any:
    """Run a decided call on the runner its entry was given when it was decided (Entry.runner), with q's GPU
    current where it is not (streams.on_device)."""
    device = foreign_device(q)
    if device is None:
        return _RUNNERS[found.runner](found, q, k, v, inputs, fp8, return_lse)
    with torch.cuda.device(device):
        return _RUNNERS[found.runner](found, q, k, v, inputs, fp8, return_lse)


def _run_torch(found: entries.Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
               fp8: Any, return_lse: bool) -> Any:
    """Torch SDPA, while the cuDNN runner is prepared or where it was measured slower (tiers.py)."""
    return tiers.run(found, q, k, v, _run)


def _run_heads(found: entries.Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
               fp8: Any, return_lse: bool) -> Any:
    """A decode step run with its KV heads as batch (runtime/heads.py), by the entry of that call."""
    heads = found.heads
    return back(heads, _run(heads.entry, *as_heads(heads, q, k, v), inputs, fp8, return_lse))


def _run_fallback(found: entries.Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
                  fp8: Any, return_lse: bool) -> Any:
    """Torch SDPA or the float32 reference, for a problem no fused backend runs (logged once per problem)."""
    counters = dispatcher.counters
    counters["calls"] += 1
    counters["fallback_calls"] += 1
    entries.log_fallback(found)
    scales = fp8 if isinstance(fp8, FP8Scales) else None
    out, lse = fallback_forward(found.fallback, found.opts, q, k, v, inputs, scales)
    wanted = getattr(fp8, "o_dtype", None)  # FP8Scales' or FP8History's output precision
    if wanted is not None and fp8q.is_fp8_dtype(wanted):
        out = fp8q.quantize_output(out, wanted)
    return (out, lse) if return_lse else out


def _run_cudnn(found: entries.Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
               fp8: Any, return_lse: bool) -> Any:
    """The cuDNN plans: a bucket's (counted toward the shape's own), the lean path, or the general one."""
    counters = dispatcher.counters
    counters["calls"] += 1
    counters["fused_calls"] += 1
    if found.bucketed:
        found = entries.count_call(found, q, k, v)
    lean = found.lean
    if lean is not None and not return_lse:
        if lean.native is None and lean.native_generation != native.generation():
            lean = with_new_module(found)  # a module built in the background since the entry was made
        if lean.native is not None and not functorch_active():
            return lean.native(q, k, v)
        if not found.opts.training:
            return lean_forward(found, q, k, v)[0]
        if lean.grads is not None:
            return apply_lean(found, q, k, v)
    scales = fp8 if isinstance(fp8, (FP8Scales, FP8History)) else None
    if found.opts.training:
        out, lse = FusedAttention.apply(found, scales, q, k, v, *inputs)
        return (out, lse) if return_lse else out
    out, stats, _, saved_fp8 = fused_forward(found, q, k, v, inputs, scales)
    if saved_fp8 is not None and fp8q.is_fp8_dtype(out.dtype):  # FP8 output asked for
        out = FP8Tensor(out, fp8q.at(saved_fp8[3], "descale_o"))
    if not return_lse:
        return out
    qb = bhsd(q, found.opts.layout)
    return out, found.lse(stats, qb.shape[0], qb.shape[2])


_RUNNERS = {entries.RUN_TORCH: _run_torch, entries.RUN_HEADS: _run_heads, entries.RUN_FALLBACK: _run_fallback,
            entries.RUN_CUDNN: _run_cudnn}


def _decide(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
            arguments: Arguments) -> entries.Entry:
    """The entry of a call: found by its full key, else decided now (after checking the arguments)."""
    scales = arguments.fp8 if isinstance(arguments.fp8, FP8Scales) else None
    signature = found = None
    try:
        if keyable(q, inputs, arguments):  # else a checked call's key could find it (args.keyable)
            signature = entries.key(q, k, v, call_options(q, k, v, inputs, arguments), inputs)
            found = dispatcher.entries.get(signature)
    except (TypeError, AttributeError, ValueError, RuntimeError):  # not tensors, an unhashable value, no strides
        signature = found = None
    if found is not None:
        return found
    check_args(q, k, v, inputs, arguments)  # a new signature: its arguments checked once
    if signature is None:
        signature = entries.key(q, k, v, call_options(q, k, v, inputs, arguments), inputs)
    return tiers.entry(signature, q, k, v, inputs, scales)


# ----- introspection -----------------------------------------------------------------------------
def dispatch_info() -> dict[str, Any]:
    """Counters of the dispatch layer, the signatures decided and the runner choices (docs/dispatch.md, 'Counters')."""
    info: dict[str, Any] = dict(dispatcher.counters)
    table_calls = native.table_calls()  # lean calls the compiled table ran
    info["calls"] += table_calls
    info["fused_calls"] += table_calls
    decided = list(dispatcher.entries.values())
    info["signatures"] = len(decided)
    info["fallback_signatures"] = sum(1 for e in decided if not e.fused)
    info["waiting_signatures"] = sum(1 for e in decided if e.waiting is not None)
    info["runners"] = tiers.describe_choices()
    stats = plans.plan_stats()
    info.update(plan_builds=stats["builds"], plan_build_ms=stats["build_ms"],
                plan_build_failures=stats["build_failures"], plan_loads=stats["loads"],
                plan_load_ms=stats["load_ms"], plan_load_failures=stats["load_failures"],
                executes=stats["executes"] + native.executes(), workspace_bytes=plans.workspace_bytes())
    return info


def clear_plans() -> None:
    """Forget every decided call signature and this process's plans (the next call of each decides
    again, loading its plans from the persistent store where they are stored)."""
    dispatcher.clear()
