"""The attention function registered with transformers' `AttentionInterface` as "fusedattn".

For a `CudnnMask` it runs `fusedattn_select.runtime.api.attention` (the fused backend `select()`
picks, or dispatch's own fallback), and so for a dense mask that the "fusedattn" mask function made
and tagged with its description (`masks.tag`: transformers asked for a tensor), unchanged since, and
for a decode step's dense mask, whose one row runs as an additive bias (`masks.one_row_bias`: no
read back); for any other dense mask it does what attn_implementation="sdpa" does.
Attention sinks (gpt-oss `s_aux`) run as softmax="learnable" and a relative position bias (T5's
`position_bias`) as the additive bias; logit soft-capping (Gemma 2), which cuDNN does not have, runs on
the float32 reference with the same mask, logged once.
transformers passes module, query, key, value and attention_mask by position, the rest by keyword.
torch is imported inside the functions: the package imports without torch (for `report()`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from fusedattn_select.integrations.transformers.dependencies import loaded
from fusedattn_select.integrations.transformers.masks import CudnnMask, one_row_bias, tagged
from fusedattn_select.integrations.transformers.tracing import is_tracing, log_once

if TYPE_CHECKING:
    from torch import Tensor


class _LayerOptions(NamedTuple):
    """The keyword arguments of one attention call that this integration reads."""

    dropout: float
    scaling: float | None
    softcap: float | None
    sinks: "Tensor | None"
    is_causal: bool | None


def _roll_rows(x: "Tensor", start: "Tensor") -> "Tensor":
    """Row i of sequence b becomes row (i + start[b]) mod S of (B, H, S, D) `x`: a per-sequence roll."""
    import torch

    length = x.shape[2]
    rows = (torch.arange(length, device=x.device)[None, :] + start.to(x.device)[:, None]) % length
    return torch.gather(x, 2, rows[:, None, :, None].expand(x.shape[0], x.shape[1], length, x.shape[3]))


def _mask_without_tensor(query: "Tensor", key: "Tensor", is_causal: bool | None, module: Any) -> CudnnMask:
    # No mask from the model: what attn_implementation="sdpa" does with attention_mask=None, i.e.
    # causal (top-left) unless there is a single query row or the module is not causal.
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q_length, kv_length = query.shape[2], key.shape[2]
    kind = "causal" if causal and q_length > 1 else "no_mask"
    return CudnnMask(kind, (-1, -1), q_length, kv_length)


def _dense_attention(module: Any, query: "Tensor", key: "Tensor", value: "Tensor", mask: "Tensor",
                     options: _LayerOptions, position_bias: "Tensor | None", **kwargs: Any) -> tuple["Tensor", None]:
    import torch

    if not options.softcap and options.sinks is None:
        if position_bias is not None:  # (transformers' "sdpa" folds it into the mask)
            kwargs["position_bias"] = position_bias
        return loaded().sdpa_attention_forward(
            module, query, key, value, mask, dropout=options.dropout, scaling=options.scaling,
            is_causal=options.is_causal, **kwargs
        )
    bias = mask
    if mask.dtype == torch.bool:
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(~mask, float("-inf"))
    if position_bias is not None:
        bias = bias + position_bias
    out = loaded().reference_attention(
        query, key, value, bias=bias, attn_scale=options.scaling, dropout=options.dropout,
        softcap=options.softcap or None, softmax=_softmax(options.sinks),
        sink=options.sinks,
    )
    return out.transpose(1, 2).contiguous(), None


def _softmax(sinks: "Tensor | None") -> str:
    """attention()'s softmax for a layer with (gpt-oss) attention sinks, or without."""
    return "vanilla" if sinks is None else "learnable"


def _dispatch(query: "Tensor", key: "Tensor", value: "Tensor", plan: CudnnMask, dropout: float,
              scaling: float | None, sinks: "Tensor | None" = None, bias: "Tensor | None" = None) -> "Tensor":
    """(B, H, Sq, Dv) attention() of (B, H, S, D) tensors under a cuDNN mask description whose valid
    rows start at row 0."""
    dependencies = loaded()
    return dependencies.dispatch_attention(
        query, key, value, layout="bhsd", mask=plan.mask, window_size=plan.window_size, attn_scale=scaling,
        dropout=dropout, softmax=_softmax(sinks), sink=sinks,
        seqlens_q=plan.seqlens_q, seqlens_kv=plan.seqlens_kv, bias=bias, deterministic=dependencies.deterministic(),
    )


def _fused_attention(query: "Tensor", key: "Tensor", value: "Tensor", plan: CudnnMask,
                     options: _LayerOptions, bias: "Tensor | None" = None) -> "Tensor":
    """(B, H, Sq, Dv) attention under a cuDNN mask description (and an additive (B or 1, H or 1, Sq, Skv)
    `bias`), left padding rolled in and out."""
    if plan.q_start is not None:
        query = _roll_rows(query, plan.q_start)
    if plan.kv_start is not None:
        key, value = _roll_rows(key, plan.kv_start), _roll_rows(value, plan.kv_start)
    if bias is not None and (plan.q_start is not None or plan.kv_start is not None):
        bias = bias.expand(query.shape[0], -1, -1, -1)  # each sequence's rows and keys roll by its own start
        if plan.q_start is not None:
            bias = _roll_rows(bias, plan.q_start)
        if plan.kv_start is not None:
            bias = _roll_rows(bias.transpose(2, 3), plan.kv_start).transpose(2, 3)
    if options.softcap:
        log_once(
            ("softcap", options.softcap),
            "fusedattn: attention logit soft-capping (softcap=%s) has no cuDNN equivalent; these layers run "
            "on the float32 reference", options.softcap,
        )
        out = loaded().reference_attention(
            query, key, value, mask=plan.mask, window_size=plan.window_size, attn_scale=options.scaling,
            dropout=options.dropout, softmax=_softmax(options.sinks),
            sink=options.sinks, seqlens_q=plan.seqlens_q, seqlens_kv=plan.seqlens_kv, bias=bias,
            softcap=options.softcap,
        )
    else:
        out = _dispatch(query, key, value, plan, options.dropout, options.scaling, options.sinks, bias)
    if plan.q_start is not None:
        out = _roll_rows(out, -plan.q_start)
    return out


def fusedattn_attention(
    module: Any,
    query: "Tensor",
    key: "Tensor",
    value: "Tensor",
    attention_mask: "CudnnMask | Tensor | None",
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple["Tensor", None]:
    """transformers' attention-function protocol: (B, H, S, D) inputs -> ((B, Sq, H, Dv), None).

    Keyword arguments read here: `softcap` (runs the float32 reference: cuDNN has no
    soft-capping), `s_aux` (gpt-oss attention sinks), `position_bias` (T5's relative position bias,
    added to the scores) and `is_causal`; `sliding_window` is dropped,
    since the mask says which keys a query sees (as with "sdpa"). Other keyword arguments go to
    "sdpa" for a dense mask.
    """
    kwargs.pop("sliding_window", None)
    softcap, sinks, is_causal = kwargs.pop("softcap", None), kwargs.pop("s_aux", None), kwargs.pop("is_causal", None)
    position_bias = kwargs.pop("position_bias", None)
    if kwargs.get("output_attentions", False):
        log_once("output_attentions", "fusedattn: output_attentions=True is not supported; attention weights are None")
    if isinstance(attention_mask, CudnnMask):
        plan = attention_mask
        if (query.shape[2], key.shape[2]) != (plan.q_length, plan.kv_length):
            raise ValueError(
                f"fusedattn: the mask was built for Sq={plan.q_length}, Skv={plan.kv_length} but the "
                f"layer has Sq={query.shape[2]}, Skv={key.shape[2]}"
            )
        if not softcap and plan.q_start is None and plan.kv_start is None:
            # The common case (every decode step, and prefill without left padding), in one call: its
            # host time is part of every generated token's.
            out = _dispatch(query, key, value, plan, dropout, scaling, sinks, position_bias)
            return out.transpose(1, 2).contiguous(), None
    options = _LayerOptions(dropout, scaling, softcap, sinks, is_causal)
    if attention_mask is None:
        plan = _mask_without_tensor(query, key, options.is_causal, module)
    elif not isinstance(attention_mask, CudnnMask):
        return _tensor_mask_attention(module, query, key, value, attention_mask, options, position_bias, **kwargs)
    # else: the CudnnMask `plan` above, with left padding to roll or soft-capping
    return _fused_attention(query, key, value, plan, options, position_bias).transpose(1, 2).contiguous(), None


def _tensor_mask_attention(module: Any, query: "Tensor", key: "Tensor", value: "Tensor", attention_mask: "Tensor",
                           options: _LayerOptions, position_bias: "Tensor | None",
                           **kwargs: Any) -> tuple["Tensor", None]:
    """A layer given a dense mask: fused where the fusedattn mask function described it (and nothing
    changed it since) or where it is a decode step's one row (a bias), else what "sdpa" does."""
    ours, plan, bias = True, None, None
    if not is_tracing(attention_mask):
        ours, plan = tagged(attention_mask, query.shape[2], key.shape[2])
        if plan is None and query.shape[2] == 1:  # a decode step: its one row of the mask is a bias
            bias = one_row_bias(attention_mask, query.shape[0], key.shape[2], query.dtype)
            plan = None if bias is None else CudnnMask("no_mask", (-1, -1), 1, key.shape[2])
    if plan is not None and position_bias is not None:
        bias = position_bias if bias is None else bias + position_bias
    if plan is None:
        if not ours:  # a mask the mask function did not make (or made and the model changed): say so once
            log_once("dense mask", "fusedattn: a layer got a dense attention mask that the fusedattn mask "
                     "function did not describe (the model made or changed it); such layers run on torch SDPA")
        return _dense_attention(module, query, key, value, attention_mask, options, position_bias, **kwargs)
    return _fused_attention(query, key, value, plan, options, bias).transpose(1, 2).contiguous(), None
