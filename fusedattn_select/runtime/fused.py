"""The fused path: feed a call's tensors to its cuDNN plans, and the eager autograd Function."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Union

import torch

from fusedattn_select.errors import ConfigError
from fusedattn_select.runtime import fp8 as fp8q
from fusedattn_select.runtime import ragged
from fusedattn_select.runtime.entries import Entry
from fusedattn_select.runtime.fp8 import FP8History, FP8Scales
from fusedattn_select.runtime.lean import differentiable_once
from fusedattn_select.runtime.options import OptionalInputs
from fusedattn_select.runtime.plans import Plan
from fusedattn_select.runtime.tensor_layouts import bhsd, from_bhsd


# ----- where a call runs relative to autograd (tiers.py reads these too) -----------------------------
current_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)  # -1: not inside a backward
top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)  # torch 2.8 and later


def saved_tensor_hooks() -> Any:
    """The innermost saved-tensor hooks of this thread (non-reentrant checkpointing sets them), or None."""
    return top_hooks(False) if top_hooks is not None else None


def refuse_recomputed_history(history: FP8History, training: bool) -> None:
    """ConfigError where a training forward that takes an FP8History will run again (non-reentrant
    activation checkpointing's saved-tensor hooks are set) or is that second run (inside a backward:
    reentrant checkpointing's recomputation): the history would record the step twice and the
    recomputation would quantize with other scales than the forward did. Other saved-tensor hooks
    (save_on_cpu offloading) run the forward once and are let through."""
    if not training:
        return
    hooks = saved_tensor_hooks()
    checkpointed = hooks is not None and getattr(hooks[0], "__module__", "") == "torch.utils.checkpoint"
    if checkpointed or current_graph_task() != -1:
        raise ConfigError("fp8", history, "delayed scaling (FP8History) cannot run under activation "
                                          "checkpointing (its forward runs again in the backward): "
                                          "each step would be recorded twice and recomputed with other scales; "
                                          "use FP8Scales or fp8=True (current scaling) there")


class Saved(NamedTuple):
    """What the backward needs from the forward: output, softmax stats, dropout RNG state, FP8's (q8, k8, v8, state)."""

    out: torch.Tensor
    stats: Optional[torch.Tensor]
    rng: Optional[torch.Tensor]
    fp8: Optional[tuple]


def _common_feeds(plan: Plan, feeds: dict, inputs: OptionalInputs, rng: Optional[torch.Tensor]) -> None:
    bias, alibi, sink, seqlens_q, seqlens_kv = inputs
    if bias is not None:
        feeds["bias"] = plan.conform("bias", bias.detach())
    if alibi is not None and plan.has("alibi_slopes"):
        feeds["alibi_slopes"] = plan.conform("alibi_slopes", alibi.detach().float())
    if plan.has("sink_token"):
        if sink is not None:
            feeds["sink_token"] = plan.conform("sink_token", sink.detach().float())
        else:  # off_by_one: an extra logit of 0 in every row
            feeds["sink_token"] = plan.constant("sink_token", 0.0)
    if seqlens_q is not None:
        feeds["seq_len_q"] = plan.conform("seq_len_q", seqlens_q)
        feeds["seq_len_kv"] = plan.conform("seq_len_kv", seqlens_kv)
    if rng is not None and plan.has("seed"):
        feeds["seed"] = plan.conform("seed", rng[0:1])
        feeds["offset"] = plan.conform("offset", rng[1:2])


def _next_rng(entry: Entry) -> Optional[torch.Tensor]:
    """A call's dropout [seed, offset], drawn from torch's generator of the device, as torch SDPA's dropout
    draws its own: torch.manual_seed repeats the masks, and activation checkpointing, which restores torch's
    generators before it recomputes a forward, recomputes the forward's mask. On the device: under CUDA-graph
    capture each replay draws afresh."""
    if entry.dropout_device is None:
        return None
    return torch.randint(0, 2 ** 62, (2,), dtype=torch.int64, device=entry.dropout_device)


def _lengths(plan: Plan, feeds: dict, inputs: OptionalInputs) -> bool:
    """Feed the caller's padding-mask lengths (unused bucket slots 0); True when there are any."""
    if inputs.seqlens_q is None:
        return False
    feeds["seq_len_q"] = ragged.caller_lengths(plan, inputs.seqlens_q, "seq_len_q")
    feeds["seq_len_kv"] = ragged.caller_lengths(plan, inputs.seqlens_kv, "seq_len_kv")
    return True


def _bucket_forward(entry: Entry, qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor,
                    inputs: OptionalInputs, rng: Optional[torch.Tensor]) -> Saved:
    """The forward of a call run by its bucket plan; stats cover the whole bucket."""
    plan = entry.forward
    k_step, v_step = entry.kv_steps
    q, k, v = ragged.bshd_memory(qb), ragged.bshd_memory(kb, k_step), ragged.bshd_memory(vb, v_step)
    feeds = {"q": q, "k": k, "v": v, **entry.ragged_forward}
    padded = _lengths(plan, feeds, inputs)
    _common_feeds(plan, feeds, inputs._replace(seqlens_q=None, seqlens_kv=None), rng)
    o = ragged.empty_like_bshd(q, vb.shape[3], qb.shape[1], zeroed=padded)
    outs = plan.execute(feeds, {"o": o})
    return Saved(from_bhsd(o.transpose(1, 2), entry.opts.layout), outs.get("stats"), rng, None)


def _bucket_backward(entry: Entry, gb: torch.Tensor, qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor,
                     inputs: OptionalInputs, saved: Saved) -> dict[str, torch.Tensor]:
    """dQ, dK, dV (and dSink_token) of a call run by its bucket plan, in BSHD memory."""
    plan = entry.backward
    q, k, v = ragged.bshd_memory(qb), ragged.bshd_memory(kb), ragged.bshd_memory(vb)
    stats = saved.stats
    if tuple(stats.shape) != plan.specs["stats"].dims:  # the call's lse (compiled path): back into the bucket
        whole = plan.allocate("stats")
        whole[:stats.shape[0], :, :stats.shape[2]] = stats
        stats = whole
    feeds = {"q": q, "k": k, "v": v, "o": ragged.bshd_memory(bhsd(saved.out, entry.opts.layout)),
             "dO": ragged.bshd_memory(gb), "stats": stats, **entry.ragged_backward}
    padded = _lengths(plan, feeds, inputs)
    _common_feeds(plan, feeds, inputs._replace(seqlens_q=None, seqlens_kv=None), saved.rng)
    grads = {name: ragged.empty_like_bshd(t, t.shape[3], t.shape[2], zeroed=padded)
             for name, t in (("dQ", q), ("dK", k), ("dV", v))}
    outs = plan.execute(feeds, grads)
    return {name: (t.transpose(1, 2) if name in grads else t) for name, t in outs.items()}


def fused_forward(entry: Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
                  scales: Union[FP8Scales, FP8History, None], rng: Optional[torch.Tensor] = None) -> Saved:
    """Saved(out in the caller's layout, stats, rng, FP8 (q8, k8, v8, state)), None where absent.
    `scales`: the descales of float8 inputs, or the caller's FP8History (delayed scaling). `rng`: dropout's
    [seed, offset] where the caller drew it (the compiled op), else drawn here (_next_rng)."""
    opts, plan = entry.opts, entry.forward
    if rng is None:
        rng = _next_rng(entry)
    if entry.bucketed:
        return _bucket_forward(entry, bhsd(q, opts.layout), bhsd(k, opts.layout), bhsd(v, opts.layout), inputs, rng)
    # No detach: this runs without grad mode (inference, or inside the autograd Function / op).
    qb, kb, vb = bhsd(q, opts.layout), bhsd(k, opts.layout), bhsd(v, opts.layout)
    saved_fp8 = None
    outputs = None
    if opts.fp8:
        if isinstance(scales, FP8Scales):
            q8, k8, v8, state = qb, kb, vb, fp8q.explicit_state(scales, vb, plan.specs["o"].dtype, opts.dropout)
        else:  # quantized here (e4m3, as O where O is FP8): current scaling, or delayed from an FP8History
            if scales is not None:
                refuse_recomputed_history(scales, opts.training)
            fp8_backward = opts.training and not entry.f16_backward
            q8, k8, v8, state = fp8q.quantize_qkv(qb, kb, vb, plan.specs["q"].dtype, training=fp8_backward,
                                                  history=scales, dropout=opts.dropout)
        feeds, outputs = fp8q.forward_feeds(plan, q8, k8, v8, state)
        saved_fp8 = (q8, k8, v8, state)
    else:
        feeds = {"q": plan.conform("q", qb), "k": plan.conform("k", kb), "v": plan.conform("v", vb)}
    _common_feeds(plan, feeds, inputs, rng)
    outs = plan.execute(feeds, outputs)
    o = outs["o"]
    o_dtype = getattr(scales, "o_dtype", None) or q.dtype  # FP8Scales' or FP8History's wish
    if saved_fp8 is not None and fp8q.is_fp8_dtype(o.dtype) and not fp8q.is_fp8_dtype(o_dtype):
        o = fp8q.dequantize(o, fp8q.at(saved_fp8[3], "descale_o"), o_dtype)
    if entry.f16_backward:
        saved_fp8 = None  # the backward runs in the input precision from q, k, v themselves
    return Saved(from_bhsd(o, opts.layout), outs.get("stats"), rng, saved_fp8)


def fused_backward(entry: Entry, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   inputs: OptionalInputs, saved: Saved) -> tuple:
    """(dq, dk, dv, dbias or None, dsink or None), gradients in the shapes of the inputs."""
    opts, plan = entry.opts, entry.backward
    layout = opts.layout
    gb = bhsd(grad_out, layout)
    ob = bhsd(saved.out, layout)
    descales: dict = {}
    if entry.bucketed:
        outs = _bucket_backward(entry, gb, bhsd(q, layout), bhsd(k, layout), bhsd(v, layout), inputs, saved)
    elif saved.fp8 is not None and not entry.f16_backward:
        feeds, descales = fp8q.backward_feeds(plan, entry.cfg, saved.fp8, ob, gb, saved.stats)
    else:
        feeds = {
            "q": plan.conform("q", bhsd(q, layout).detach()), "k": plan.conform("k", bhsd(k, layout).detach()),
            "v": plan.conform("v", bhsd(v, layout).detach()), "o": plan.conform("o", ob),
            "dO": plan.conform("dO", gb), "stats": plan.conform("stats", saved.stats),
        }
    if not entry.bucketed:
        _common_feeds(plan, feeds, inputs, saved.rng)
        outs = plan.execute(feeds)
    grads = []
    for name, like in (("dQ", q), ("dK", k), ("dV", v)):
        grad = outs[name]
        if name in descales:  # FP8 gradients (Hopper): dequantized to the input precision
            grad = fp8q.dequantize(grad, descales[name], like.dtype)
        elif grad.dtype != like.dtype:
            grad = grad.to(like.dtype)
        grads.append(from_bhsd(grad, layout))
    dq, dk, dv = grads
    dbias = dsink = None
    if opts.bias_grad and "dBias" in outs:
        dbias = outs["dBias"].sum_to_size(inputs.bias.shape).to(inputs.bias.dtype)
    if opts.sink_grad and "dSink_token" in outs:
        dsink = outs["dSink_token"].reshape(inputs.sink.shape).to(inputs.sink.dtype)
    return dq, dk, dv, dbias, dsink


class FusedAttention(torch.autograd.Function):
    """Eager autograd for the fused path: cuDNN forward (saving its softmax stats) and backward. The
    optional tensors come last, in OptionalInputs order, so autograd sees each of them."""

    @staticmethod
    def forward(ctx, entry, scales, q, k, v, *optional):
        inputs = OptionalInputs(*optional)
        saved = fused_forward(entry, q, k, v, inputs, scales)
        ctx.entry = entry
        ctx.saved_fp8 = saved.fp8
        ctx.set_materialize_grads(False)  # lse takes no gradient: no zeros made for it
        ctx.save_for_backward(q, k, v, saved.out, saved.stats, saved.rng, *inputs)
        qb = bhsd(q, entry.opts.layout)
        stats = entry.lse(saved.stats, qb.shape[0], qb.shape[2])
        lse = stats if stats is not None else torch.empty(0, dtype=torch.float32, device=q.device)
        ctx.mark_non_differentiable(lse)
        return saved.out, lse

    @staticmethod
    @differentiable_once
    def backward(ctx, saved, grad_out, _grad_lse):
        q, k, v, out, stats, rng, *optional = saved
        if grad_out is None:  # (no gradient reached the output: grads are not materialized)
            grad_out = torch.zeros_like(out)
        inputs = OptionalInputs(*optional)
        dq, dk, dv, dbias, dsink = fused_backward(ctx.entry, grad_out, q, k, v, inputs,
                                                  Saved(out, stats, rng, ctx.saved_fp8))
        return None, None, dq, dk, dv, dbias, None, dsink, None, None
