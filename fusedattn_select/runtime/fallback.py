"""The fallback when no fused kernel runs a call: torch's own SDPA where it expresses the problem exactly,
else the float32 reference (reference/autograd_reference.py); both are differentiable with plain autograd.
Also the torch runner of first contact (`torch_call`: torch's flash or memory-efficient kernel, called directly)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch

from fusedattn_select.buckets import Bucket
from fusedattn_select.config import CAUSAL_MASKS, resolved_window
from fusedattn_select.errors import ConfigError
from fusedattn_select.reference import autograd_reference
from fusedattn_select.runtime.fp8 import FP8Scales
from fusedattn_select.runtime.options import CallOptions, OptionalInputs
from fusedattn_select.runtime.tensor_layouts import bhsd, from_bhsd

FALLBACK_TORCH = "torch_sdpa"
FALLBACK_REFERENCE = "reference"

# torch's SDPA, never a patched torch.nn.functional attribute (integrations.sdpa.install() routes
# that attribute to attention(), and the fallback must not route back).
torch_sdpa = torch._C._nn.scaled_dot_product_attention


def torch_sdpa_blocker(options: CallOptions, qb: torch.Tensor, kb: torch.Tensor, has_alibi: bool) -> str:
    """Why torch's SDPA cannot compute this problem exactly ("" when it can)."""
    if not (qb.numel() and kb.numel()):
        return "an empty problem (torch 2.11's SDPA returns None for batch 0 on a GPU)"
    if options.softmax != "vanilla":
        return f"softmax={options.softmax!r}"
    if resolved_window(options.window_size, options.mask in CAUSAL_MASKS) != (-1, -1):
        return f"window_size={options.window_size}"
    if has_alibi:
        return "alibi_slopes"
    if options.mask.startswith("padding"):
        return f"mask={options.mask!r}"
    if options.return_lse:
        return "return_lse=True"
    if options.mask == "causal_bottom_right" and qb.shape[2] > kb.shape[2]:
        return "bottom-right causal mask with seqlen_q > seqlen_kv (fully masked rows)"
    return ""


def sdpa_mask_form(mask: str, seqlen_q: int, seqlen_kv: int) -> str:
    """How torch's SDPA runs a mask torch_sdpa_blocker lets through: "causal" (is_causal, top-left),
    "none", or "dense" (a boolean mask). A bottom-right causal mask is top-left when the lengths are
    equal, and no mask for one query row (the last row sees every key)."""
    if mask == "causal_bottom_right":
        return "none" if seqlen_q == 1 else "causal" if seqlen_q == seqlen_kv else "dense"
    return "causal" if mask == "causal" else "none"


def _dequantized(t: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (t.float() * descale.float().reshape(1)).to(dtype)


def _torch_sdpa(options: CallOptions, qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor,
                bias: Optional[torch.Tensor]) -> torch.Tensor:
    attn_mask = bias
    is_causal = False
    sq, skv = qb.shape[2], kb.shape[2]
    form = sdpa_mask_form(options.mask, sq, skv)
    if form == "causal" and bias is None:
        is_causal = True
    elif form != "none":  # a causal mask with a bias, or bottom-right over unequal lengths
        offset = skv - sq if options.mask == "causal_bottom_right" else 0
        rows = torch.arange(sq, device=qb.device).view(sq, 1)
        cols = torch.arange(skv, device=qb.device).view(1, skv)
        allowed = cols <= rows + offset
        attn_mask = allowed if bias is None else bias.masked_fill(~allowed, float("-inf"))
    return torch_sdpa(qb, kb, vb, attn_mask=attn_mask, dropout_p=options.dropout, is_causal=is_causal,
                      scale=options.attn_scale, enable_gqa=qb.shape[1] != kb.shape[1])


def fallback_forward(kind: str, options: CallOptions, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     inputs: OptionalInputs, scales: Optional[FP8Scales]
                     ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(out in the caller's layout, lse or None), differentiable with plain autograd."""
    qb, kb, vb = bhsd(q, options.layout), bhsd(k, options.layout), bhsd(v, options.layout)
    if scales is not None:  # float8 inputs: compute in the requested output precision (bf16 for FP8)
        dtype = torch.bfloat16 if scales.o_dtype.itemsize == 1 else scales.o_dtype
        qb = _dequantized(qb, scales.descale_q, dtype)
        kb = _dequantized(kb, scales.descale_k, dtype)
        vb = _dequantized(vb, scales.descale_v, dtype)
    lse = None
    for name, lens, longest in (("seqlens_q", inputs.seqlens_q, qb.shape[2]),
                                ("seqlens_kv", inputs.seqlens_kv, kb.shape[2])):
        # Every call's values (they change from call to call), where reading them waits for no device.
        if (lens is not None and lens.device.type == "cpu" and lens.numel()
                and not 0 <= int(lens.min()) <= int(lens.max()) <= longest):
            raise ConfigError(name, lens.tolist(), f"each length must be from 0 to the sequence length ({longest})")
    if inputs.bias is not None and inputs.bias.dtype != qb.dtype:  # in q's precision, as SDPA and cuDNN take it
        inputs = inputs._replace(bias=inputs.bias.to(qb.dtype))
    if kind == FALLBACK_TORCH:
        out = _torch_sdpa(options, qb, kb, vb, inputs.bias)
    else:
        reference_options = autograd_reference.ReferenceOptions(
            mask=options.mask, window_size=options.window_size, attn_scale=options.attn_scale,
            dropout=options.dropout, softmax=options.softmax, return_lse=options.return_lse)
        tensors = autograd_reference.ReferenceTensors(*inputs)
        result = autograd_reference.attend(qb, kb, vb, reference_options, tensors)
        out, lse = result if options.return_lse else (result, None)
        # Not differentiable, as the fused runners return it: a loss using it trains alike everywhere.
        lse = lse.detach() if lse is not None else None
    return from_bhsd(out, options.layout), lse


@contextlib.contextmanager
def _autograd_inside_op() -> Iterator[None]:
    """Re-enable autograd inside a custom op's implementation, where torch excludes the autograd dispatch
    keys (thread-local, torch._C._AutoDispatchBelowAutograd) so a recomputation records no graph: the
    fallback's backward differentiates its recomputed forward."""
    keys = (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.ADInplaceOrView)
    previous = [torch._C._dispatch_tls_is_dispatch_key_excluded(key) for key in keys]
    for key in keys:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    try:
        with torch.enable_grad():
            yield
    finally:
        for key, excluded in zip(keys, previous):
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, excluded)


def fallback_backward(kind: str, options: CallOptions, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor, inputs: OptionalInputs) -> tuple:
    """(dq, dk, dv, dbias or None, dsink or None) by recomputing the fallback's forward under autograd
    (compiled path only; eager fallbacks differentiate the forward they ran). With dropout > 0 the
    caller seeds the recomputation as its forward was (ops.py `_seeded`), so it draws the same mask."""
    leaves = [t.detach().requires_grad_(needs) if t is not None else None for t, needs in (
        (q, True), (k, True), (v, True), (inputs.bias, options.bias_grad), (inputs.sink, options.sink_grad))]
    recomputed = inputs._replace(bias=leaves[3], sink=leaves[4])
    with _autograd_inside_op():
        out, _ = fallback_forward(kind, options, leaves[0], leaves[1], leaves[2], recomputed, None)
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True))
    return tuple(next(grads) if t is not None and t.requires_grad else None for t in leaves)


# ----- the torch runner of first contact (runtime/tiers.py) -----------------------------------------
# torch's flash and memory-efficient kernels, called directly (None on a torch without them).
_flash = getattr(torch, "_scaled_dot_product_flash_attention", None)
_efficient = getattr(torch, "_scaled_dot_product_efficient_attention", None)


# Inference calls at most this small run on the memory-efficient kernel even where flash takes them;
# why, and why the bounds are the bucket's: see docs/dispatch.md, 'The torch runner's kernel'.
SMALL_KEYS = 512
SMALL_SCORES = 1 << 22  # batch * query heads * query rows * keys


def torch_call(opts: CallOptions, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[..., torch.Tensor]:
    """f(q, k, v) -> out on torch for a signature tiers.wait_reason lets run there, with everything but the
    tensors fixed once: torch's flash or memory-efficient kernel (`torch_kernel`), called directly, not through
    SDPA (docs/dispatch.md, 'First contact'); SDPA itself where neither is (CPU tensors, a head dim SDPA pads,
    torch's own switches turning them off)."""
    qb, kb, vb = bhsd(q, opts.layout), bhsd(k, opts.layout), bhsd(v, opts.layout)
    causal = sdpa_mask_form(opts.mask, qb.shape[2], kb.shape[2]) == "causal"
    gqa = qb.shape[1] != kb.shape[1]
    dropout, scale, lse = opts.dropout, opts.attn_scale, opts.training
    kernel = torch_kernel(qb, kb, vb, dropout, causal, lse)
    layout = opts.layout
    views = layout != "bhsd"  # a bhsd caller's tensors are what the kernels take

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if views:
            q, k, v = bhsd(q, layout), bhsd(k, layout), bhsd(v, layout)
        if kernel == "flash":
            out = _flash(q, k, v, dropout, causal, False, scale=scale)[0]
        elif kernel == "efficient":  # its log-sum-exp only where a backward needs it
            out = _efficient(q, k, v, None, lse, dropout, causal, scale=scale)[0]
        else:
            out = torch_sdpa(q, k, v, dropout_p=dropout, is_causal=causal, scale=scale, enable_gqa=gqa)
        return from_bhsd(out, layout) if views else out

    return call


def small(qb: torch.Tensor, kb: torch.Tensor) -> bool:
    """Whether a logical-BHSD problem's shape bucket is within SMALL_KEYS and SMALL_SCORES."""
    bucket = Bucket.of(qb.shape[0], qb.shape[2], kb.shape[2])
    return (bucket.seqlen_kv <= SMALL_KEYS
            and bucket.batch * qb.shape[1] * bucket.seqlen_q * bucket.seqlen_kv <= SMALL_SCORES)


def torch_kernel(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, dropout: float, causal: bool,
                 lse: bool) -> str:
    """The kernel the torch runner calls: "efficient" for a `small` inference call (no log-sum-exp wanted)
    without grouped KV heads that kernel takes; else "flash" or "efficient" where torch's own checks let that
    kernel take the problem as given (SDPA pads a head dim that is not a multiple of 8 and makes the last dim
    contiguous first; the memory-efficient kernel takes no GQA); else "sdpa"."""
    if not qb.is_cuda or _flash is None or _efficient is None:
        return "sdpa"
    if qb.shape[-1] % 8 or vb.shape[-1] % 8 or any(t.stride(-1) != 1 for t in (qb, kb, vb)):
        return "sdpa"
    gqa = qb.shape[1] != kb.shape[1]
    try:
        params = torch.backends.cuda.SDPAParams(qb, kb, vb, None, dropout, causal, gqa)
        efficient = not gqa and torch.backends.cuda.can_use_efficient_attention(params, False)
        if efficient and not lse and small(qb, kb):
            return "efficient"
        if torch.backends.cuda.can_use_flash_attention(params, False):
            return "flash"
        if efficient:
            return "efficient"
    except (AttributeError, TypeError, RuntimeError):  # an older torch: SDPA chooses
        pass
    return "sdpa"
