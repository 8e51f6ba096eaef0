"""FP8 for dispatch: per-tensor current scaling and the scale tensors cuDNN's sdpa_fp8 graphs take.

Current scaling: q, k, v (and dO in the backward pass) are quantized with their own scales,
computed on the device from each tensor's amax in the same call (no host sync, no history). Scales
are powers of two, so scaling is exact in fp16/bf16, `descale = 1 / scale` is exact, and a value
quantized, dequantized and quantized again with the same scale comes back bit for bit.

Tensors cuDNN produces have no amax before the kernel runs, so their scales come from bounds that
hold for every input (computed on the device from amaxes and row norms of the inputs):

    P (softmax, "S")   in [0, 1]: S_SCALE = 64, the scale cudnn-frontend's own FP8 SDPA tests use
                       for an amax of 1 (headroom for kernels that defer the running-max rescale)
    O = P V            |O| <= amax(V): each row of O is a convex combination of rows of V
    dP (dS)            |dS_ij| <= P_ij (|dO_i . V_j| + |dO_i . O_i|) <= 2 |dO|max |V|max (L2 row norms)
    dQ = s dS K        |dQ| <= s amax(K) * 2 |dO|max |V|max            (rows of P sum to 1)
    dK = s dS^T Q      |dK| <= s amax(Q) * 2 |dO|max |V|max * Sq * g   (g = q heads per kv head)
    dV = P^T dO        |dV| <= amax(dO) * Sq * g
    (all divided by 1 - dropout, which rescales P)

Where the platform lets O and dQ/dK/dV be written in fp16/bf16 (cuDNN on Blackwell), they are,
with unit scales; elsewhere (Hopper) they are FP8 with the bound scales above and are dequantized
to the input precision before they are returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# Largest power of two used for tensors quantized inside the kernel (P, dP): cudnn-frontend's test
# convention for e4m3 (its largest power of two of a 240-max e4m3 variant), leaving headroom.
INTERNAL_RANGE = 128.0
S_SCALE = 64.0
# The largest power-of-two scale a compute dtype can hold (fp16 overflows above 2**15).
_MAX_SCALE = {torch.float16: 2.0 ** 15, torch.bfloat16: 2.0 ** 100, torch.float32: 2.0 ** 100}
_TINY = 2.0 ** -100

# The saved FP8 state of one call: a float32 vector with these entries.
STATE = ("descale_q", "descale_k", "descale_v", "amax_q", "amax_k", "amax_v", "vnorm", "descale_o")
_AT = {name: i for i, name in enumerate(STATE)}


def at(state: torch.Tensor, name: str) -> torch.Tensor:
    """One entry of a saved state as a (1,) view."""
    i = _AT[name]
    return state[i:i + 1]


@dataclass(frozen=True)
class FP8Scales:
    """Descale factors for float8 q, k, v passed to attention(..., fp8=FP8Scales(...)).

    The real value of an element is `stored * descale`. Each descale is a float32 tensor with one
    element on the inputs' device. `o_dtype` is the precision of the returned output.
    """

    descale_q: torch.Tensor
    descale_k: torch.Tensor
    descale_v: torch.Tensor
    o_dtype: torch.dtype = torch.bfloat16


def is_fp8_dtype(dtype: torch.dtype) -> bool:
    return dtype in FP8_MAX


def output_recipes(cfg, training: bool) -> list[dict]:
    """AttnConfig changes for the FP8 output precisions to try, best first.

    O (and dQ, dK, dV) in the input precision needs no output scales (cuDNN 9.13+ on Blackwell);
    otherwise FP8 outputs: TransformerEngine's HYBRID recipe (e4m3 forward, e5m2 gradients),
    then e4m3 throughout.
    """
    recipes: list[dict] = [{}]
    if training:
        recipes += [
            dict(o_dtype="fp8_e4m3", do_dtype="fp8_e5m2", dqkv_dtype="fp8_e5m2"),
            dict(o_dtype="fp8_e4m3", do_dtype="fp8_e4m3", dqkv_dtype="fp8_e4m3"),
        ]
    else:
        recipes += [dict(o_dtype="fp8_e4m3")]
    return recipes


def pow2_scale(amax: torch.Tensor, fp8_dtype: torch.dtype, *, limit: float = 0.0,
               compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Largest power of two s with amax * s <= limit (default: the dtype's max), as float32."""
    top = limit or FP8_MAX[fp8_dtype]
    amax = amax.float().clamp(min=_TINY)
    scale = torch.exp2(torch.floor(torch.log2(top / amax)))
    return scale.clamp(max=_MAX_SCALE.get(compute_dtype, 2.0 ** 100))


def dequantize(x8: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (x8.float() * descale).to(dtype)


def _row_norm_max(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x.detach().float(), dim=-1).amax()


def quantize_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fp8_dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q8, k8, v8, state): state holds STATE (descale_o filled in by forward_feeds)."""
    q, k, v = q.detach(), k.detach(), v.detach()
    amax = torch.stack([q.abs().amax(), k.abs().amax(), v.abs().amax()]).float()
    scale = pow2_scale(amax, fp8_dtype, compute_dtype=q.dtype)
    low = scale.to(q.dtype)
    q8 = (q * low[0]).to(fp8_dtype)
    k8 = (k * low[1]).to(fp8_dtype)
    v8 = (v * low[2]).to(fp8_dtype)
    state = torch.cat([scale.reciprocal(), amax, _row_norm_max(v).reshape(1), torch.ones(1, device=q.device)])
    return q8, k8, v8, state


def explicit_state(scales: FP8Scales, v8: torch.Tensor) -> torch.Tensor:
    """The state of caller-quantized inputs (inference): their descales, and amax(V) for O's scale."""
    descales = [p.detach().reshape(1).float() for p in (scales.descale_q, scales.descale_k, scales.descale_v)]
    amax_v = (v8.float().abs().amax() * descales[2]).reshape(1)
    unknown = torch.full_like(descales[0], float("nan"))
    return torch.cat(descales + [unknown, unknown, amax_v, unknown, torch.ones_like(unknown)])


def forward_feeds(plan, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, state: torch.Tensor
                  ) -> dict[str, torch.Tensor]:
    """Inputs of an sdpa_fp8 forward graph, except masks/sink/seqlens (added by the caller).

    Writes descale_o into `state` (1 when O is not FP8)."""
    feeds = {
        "q": plan.conform("q", q8), "k": plan.conform("k", k8), "v": plan.conform("v", v8),
        "descale_q": plan.conform("descale_q", at(state, "descale_q")),
        "descale_k": plan.conform("descale_k", at(state, "descale_k")),
        "descale_v": plan.conform("descale_v", at(state, "descale_v")),
    }
    if plan.has("scale_s"):
        feeds["scale_s"] = plan.constant("scale_s", S_SCALE)
    if plan.has("descale_s"):
        feeds["descale_s"] = plan.constant("descale_s", 1.0 / S_SCALE)
    o_dtype = plan.specs["o"].dtype
    if is_fp8_dtype(o_dtype):
        scale_o = pow2_scale(at(state, "amax_v"), o_dtype)
        at(state, "descale_o").copy_(scale_o.reciprocal())
        feeds["scale_o"] = plan.conform("scale_o", scale_o)
    elif plan.has("scale_o"):
        feeds["scale_o"] = plan.constant("scale_o", 1.0)
    return feeds


def backward_feeds(plan, cfg, saved: tuple, out: torch.Tensor, grad_out: torch.Tensor, stats: torch.Tensor
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(inputs of an sdpa_fp8_backward graph except masks/sink/seqlens, descales of its FP8 outputs).

    `saved` is the forward's (q8, k8, v8, state); `out` is the output returned by the forward pass (dequantized when O was FP8: quantizing it
    again with descale_o restores the forward's O exactly)."""
    q8, k8, v8, state = saved
    feeds = {
        "q": plan.conform("q", q8), "k": plan.conform("k", k8), "v": plan.conform("v", v8),
        "stats": plan.conform("stats", stats),
        "descale_q": plan.conform("descale_q", at(state, "descale_q")),
        "descale_k": plan.conform("descale_k", at(state, "descale_k")),
        "descale_v": plan.conform("descale_v", at(state, "descale_v")),
    }
    o_dtype = plan.specs["o"].dtype
    if is_fp8_dtype(o_dtype):
        descale_o = at(state, "descale_o")
        feeds["o"] = plan.conform("o", (out.detach() * descale_o.reciprocal().to(out.dtype)).to(o_dtype))
        feeds["descale_o"] = plan.conform("descale_o", descale_o)
    else:
        feeds["o"] = plan.conform("o", out.detach())
        if plan.has("descale_o"):
            feeds["descale_o"] = plan.constant("descale_o", 1.0)
    do_dtype = plan.specs["dO"].dtype
    grad_out = grad_out.detach()
    amax_do = grad_out.abs().amax().float().reshape(1)
    if is_fp8_dtype(do_dtype):
        scale = pow2_scale(amax_do, do_dtype, compute_dtype=grad_out.dtype)
        feeds["dO"] = plan.conform("dO", (grad_out * scale.to(grad_out.dtype)).to(do_dtype))
        feeds["descale_dO"] = plan.conform("descale_dO", scale.reciprocal())
    else:
        feeds["dO"] = plan.conform("dO", grad_out)
        if plan.has("descale_dO"):
            feeds["descale_dO"] = plan.constant("descale_dO", 1.0)
    if plan.has("scale_s"):
        feeds["scale_s"] = plan.constant("scale_s", S_SCALE)
    if plan.has("descale_s"):
        feeds["descale_s"] = plan.constant("descale_s", 1.0 / S_SCALE)

    keep = 1.0 / (1.0 - cfg.dropout)
    ds_bound = 2.0 * keep * _row_norm_max(grad_out) * at(state, "vnorm")
    scale_dp = pow2_scale(ds_bound, torch.float8_e4m3fn, limit=INTERNAL_RANGE)
    feeds["scale_dP"] = plan.conform("scale_dP", scale_dp)
    feeds["descale_dP"] = plan.conform("descale_dP", scale_dp.reciprocal())
    rows = cfg.seqlen_q * (cfg.num_heads_q // cfg.num_heads_kv)
    bounds = {
        "dQ": cfg.resolved_attn_scale * at(state, "amax_k") * ds_bound,
        "dK": cfg.resolved_attn_scale * at(state, "amax_q") * ds_bound * rows,
        "dV": keep * amax_do * rows,
    }
    descales: dict[str, torch.Tensor] = {}
    for name, bound in bounds.items():
        dtype = plan.specs[name].dtype
        if is_fp8_dtype(dtype):
            scale = pow2_scale(bound, dtype)
            feeds["scale_" + name] = plan.conform("scale_" + name, scale)
            descales[name] = scale.reciprocal()
        elif plan.has("scale_" + name):
            feeds["scale_" + name] = plan.constant("scale_" + name, 1.0)
    return feeds, descales
