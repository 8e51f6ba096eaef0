"""FP8 for dispatch: per-tensor current scaling and the scale tensors cuDNN's sdpa_fp8 graphs take.

Current scaling: each of q, k, v (and dO in the backward pass) is quantized with its own scale,
computed on the device from the tensor's amax in the same call (no host sync, no history). Scales
are powers of two, so scaling is exact in fp16/bf16 and `descale = 1 / scale` is exact too; a
power of two loses at most one bit of range and none of precision.

The internal tensors cuDNN quantizes (the softmax probabilities S = P and the score gradient dP)
have no amax before the kernel runs, so their scales are fixed or bounded instead:

* P lies in [0, 1]; `S_SCALE` = 64 is the value cudnn-frontend's own FP8 SDPA tests use for an amax
  of 1 (half of the e4m3 power-of-two range, leaving headroom for kernels that defer the running
  max rescale).
* |dP_ij| = |P_ij (dO_i . V_j - D_i)| <= 2 * head_dim_v * amax(dO) * amax(V), so the dP scale comes
  from that bound (computed on the device), with the same e4m3 range of 128 as above.

Outputs are in the input precision (fp16/bf16): that is what the "current" scaling mode resolves
to in AttnConfig (o_dtype, dqkv_dtype), so O, dQ, dK and dV need no scale (scale 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# Largest power of two used for internal tensors (cudnn-frontend's test convention for e4m3).
INTERNAL_RANGE = 128.0
S_SCALE = 64.0
# The largest power-of-two scale a compute dtype can hold (fp16 overflows above 2**15).
_MAX_SCALE = {torch.float16: 2.0 ** 15, torch.bfloat16: 2.0 ** 100, torch.float32: 2.0 ** 100}
_TINY = 2.0 ** -100

TORCH_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FP8_NAMES = {dtype: name for name, dtype in TORCH_FP8.items()}


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


def pow2_scale(amax: torch.Tensor, fp8_dtype: torch.dtype, *, limit: float = 0.0,
               compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Largest power of two s with amax * s <= limit (default: the dtype's max), as float32."""
    top = limit or FP8_MAX[fp8_dtype]
    amax = amax.float().clamp(min=_TINY)
    scale = torch.exp2(torch.floor(torch.log2(top / amax)))
    return scale.clamp(max=_MAX_SCALE.get(compute_dtype, 2.0 ** 100))


def quantize(x: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in fp8, descale) with a power-of-two current scale; descale is float32 with shape (1,)."""
    x = x.detach()
    scale = pow2_scale(x.abs().amax(), fp8_dtype, compute_dtype=x.dtype).reshape(1)
    return (x * scale.to(x.dtype)).to(fp8_dtype), scale.reciprocal()


def quantize_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fp8_dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q8, k8, v8, state): state is float32 [descale_q, descale_k, descale_v, amax_v] (saved for
    the backward pass, which needs amax_v for the dP bound)."""
    q, k, v = q.detach(), k.detach(), v.detach()
    amax = torch.stack([q.abs().amax(), k.abs().amax(), v.abs().amax()]).float()
    scale = pow2_scale(amax, fp8_dtype, compute_dtype=q.dtype)
    low = scale.to(q.dtype)
    q8 = (q * low[0]).to(fp8_dtype)
    k8 = (k * low[1]).to(fp8_dtype)
    v8 = (v * low[2]).to(fp8_dtype)
    return q8, k8, v8, torch.cat([scale.reciprocal(), amax[2:3]])


def explicit_state(scales: FP8Scales) -> torch.Tensor:
    """The saved-state layout of quantize_qkv for caller-quantized inputs (amax_v unknown: nan)."""
    parts = [scales.descale_q, scales.descale_k, scales.descale_v]
    flat = [p.detach().reshape(1).float() for p in parts]
    return torch.cat(flat + [torch.full_like(flat[0], float("nan"))])


def dp_scale(amax_do: torch.Tensor, amax_v: torch.Tensor, head_dim_v: int) -> torch.Tensor:
    """Power-of-two scale for dP from the bound 2 * head_dim_v * amax(dO) * amax(V)."""
    bound = 2.0 * head_dim_v * amax_do.float() * amax_v.float()
    return pow2_scale(bound, torch.float8_e4m3fn, limit=INTERNAL_RANGE).reshape(1)


def forward_feeds(plan, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, state: torch.Tensor
                  ) -> dict[str, torch.Tensor]:
    """Inputs of an sdpa_fp8 forward graph, except masks/sink/seqlens (added by the caller)."""
    feeds = {
        "q": plan.conform("q", q8), "k": plan.conform("k", k8), "v": plan.conform("v", v8),
        "descale_q": plan.conform("descale_q", state[0:1]),
        "descale_k": plan.conform("descale_k", state[1:2]),
        "descale_v": plan.conform("descale_v", state[2:3]),
    }
    if plan.has("scale_s"):
        feeds["scale_s"] = plan.constant("scale_s", S_SCALE)
    if plan.has("descale_s"):
        feeds["descale_s"] = plan.constant("descale_s", 1.0 / S_SCALE)
    if plan.has("scale_o"):
        # O in fp16/bf16 ("current" scaling) takes no scale; an FP8 O would need amax(O) first.
        feeds["scale_o"] = plan.constant("scale_o", 1.0)
    return feeds


def backward_feeds(plan, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, state: torch.Tensor,
                   out: torch.Tensor, grad_out: torch.Tensor, stats: torch.Tensor, head_dim_v: int
                   ) -> dict[str, torch.Tensor]:
    """Inputs of an sdpa_fp8_backward graph, except masks/sink/seqlens (added by the caller)."""
    feeds = {
        "q": plan.conform("q", q8), "k": plan.conform("k", k8), "v": plan.conform("v", v8),
        "stats": plan.conform("stats", stats),
        "descale_q": plan.conform("descale_q", state[0:1]),
        "descale_k": plan.conform("descale_k", state[1:2]),
        "descale_v": plan.conform("descale_v", state[2:3]),
    }
    for name, value in (("o", out), ("dO", grad_out)):
        declared = plan.specs[name].dtype
        descale_name = "descale_" + name
        if is_fp8_dtype(declared):
            quantized, descale = quantize(value, declared)
            feeds[name] = plan.conform(name, quantized)
            if plan.has(descale_name):
                feeds[descale_name] = plan.conform(descale_name, descale)
            if name == "dO":
                amax_do = descale * FP8_MAX[declared]  # an upper bound of amax(dO), exact to 2x
        else:
            feeds[name] = plan.conform(name, value)
            if plan.has(descale_name):
                feeds[descale_name] = plan.constant(descale_name, 1.0)
            if name == "dO":
                amax_do = value.detach().abs().amax().reshape(1)
    if plan.has("scale_dP"):
        scale = dp_scale(amax_do, state[3:4], head_dim_v)
        feeds["scale_dP"] = plan.conform("scale_dP", scale)
        if plan.has("descale_dP"):
            feeds["descale_dP"] = plan.conform("descale_dP", scale.reciprocal())
    if plan.has("scale_s"):
        feeds["scale_s"] = plan.constant("scale_s", S_SCALE)
    if plan.has("descale_s"):
        feeds["descale_s"] = plan.constant("descale_s", 1.0 / S_SCALE)
    for name in ("scale_dQ", "scale_dK", "scale_dV"):
        if plan.has(name):
            feeds[name] = plan.constant(name, 1.0)
    return feeds
