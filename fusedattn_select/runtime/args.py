"""attention()'s arguments: their checks (each names the argument, its value and what is allowed)
and the CallOptions they make."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from fusedattn_select import dtypes
from fusedattn_select.config import MASKS, SOFTMAXES, WINDOW_RULE, bad_window
from fusedattn_select.errors import ConfigError
from fusedattn_select.runtime import fp8 as fp8q
from fusedattn_select.runtime.fp8 import FP8History, FP8Scales
from fusedattn_select.runtime.options import DEFAULT_LAYOUT, NO_INPUTS, CallOptions, OptionalInputs
from fusedattn_select.runtime.tensor_layouts import LAYOUTS, TO_BHSD

# Precisions fp8=True quantizes from, and the output precisions float8 inputs may ask for
# (FP8Scales.o_dtype: fp16/bf16, or FP8 e4m3 returned as an FP8Tensor).
F16_NAMES = {dtypes.torch_dtype(name, torch): name for name in dtypes.F16_DTYPES}
O_DTYPE_NAMES = {**F16_NAMES, torch.float8_e4m3fn: "fp8_e4m3"}


NO_WINDOW = (-1, -1)  # attention()'s default window_size, told apart by identity on the hot path


class Arguments(NamedTuple):
    """attention()'s non-tensor arguments as the caller gave them (unchecked), with its defaults."""

    layout: Any = None
    mask: Any = "no_mask"
    window_size: Any = NO_WINDOW
    attn_scale: Any = None
    dropout: Any = 0.0
    softmax: Any = "vanilla"
    deterministic: Any = False
    fp8: Any = False
    return_lse: Any = False


# The leading Arguments a call's key holds in the compiled module's table (lean.cpp), with the kind
# of plain value each must be there: the module is told these when it is loaded, so the fields and
# their order are written here only. A call whose arguments are of other kinds runs through Python.
TABLE_ARGUMENTS = {"layout": "str?", "mask": "str", "window_size": "int-tuple", "attn_scale": "number?",
                   "dropout": "number", "softmax": "str", "deterministic": "bool"}
TABLE_ARITY = len(TABLE_ARGUMENTS)
if tuple(TABLE_ARGUMENTS) != Arguments._fields[:TABLE_ARITY]:
    raise AssertionError("TABLE_ARGUMENTS must be the leading fields of Arguments, in order")


class Dims(NamedTuple):
    """Logical dims of a call: (B, Hq, Sq, D) of q, Skv of k."""

    batch: int
    heads_q: int
    seqlen_q: int
    seqlen_kv: int


# Whether any autocast region is open, in one call (the hot path asks at every call): private to torch, so
# its public per-device form where a torch lacks it.
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu"))
_AUTOCAST_CASTS = (torch.float32, torch.float16, torch.bfloat16)


# Whether torch.jit.trace is recording (None: not), asked at every call.
_tracing = torch._C._get_tracing_state


def call_inputs(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    """q, k, v as a call takes them (autocast_inputs); refused under torch.jit.trace, which records torch ops:
    cuDNN's kernels would replay as empty outputs."""
    if _tracing() is not None:
        raise ConfigError("q", "traced by torch.jit.trace", "attention() cannot be traced: its kernels are not "
                          "torch ops; use torch.compile or torch.export")
    return autocast_inputs(q, k, v)


def autocast_inputs(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    """q, k, v as torch's autocast hands them to scaled_dot_product_attention: inside an autocast region of
    their device, float32, fp16 and bf16 inputs in its dtype (mixed-precision training of float32 weights
    gives attention float32 q and k, out of the rotary embedding, and v in the autocast dtype); float8 and
    float64 as they are."""
    if not _any_autocast() or not isinstance(q, torch.Tensor):
        return q, k, v
    try:
        if not torch.is_autocast_enabled(q.device.type):
            return q, k, v
    except RuntimeError:  # a device type autocast has no region for (meta): torch's SDPA casts nothing there
        return q, k, v
    dtype = torch.get_autocast_dtype(q.device.type)
    if dtype not in _AUTOCAST_CASTS:
        return q, k, v
    # (dense tensors only: the checks name a nested, sparse or MKL-DNN one, which .to() may not take)
    cast = tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.layout == torch.strided
                 and t.dtype in _AUTOCAST_CASTS else t for t in (q, k, v))
    return cast[0], cast[1], cast[2]


def split_keywords(keywords: dict[str, Any]) -> tuple[Arguments, OptionalInputs]:
    """attention()'s keyword arguments sorted into (Arguments, OptionalInputs); TypeError for others."""
    unknown = set(keywords) - set(Arguments._fields) - set(OptionalInputs._fields)
    if unknown:
        raise TypeError(f"unexpected keyword argument {sorted(unknown)[0]!r}")
    return (Arguments(**{n: keywords[n] for n in Arguments._fields if n in keywords}),
            OptionalInputs(**{n: keywords[n] for n in OptionalInputs._fields if n in keywords}))


def is_training(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs) -> bool:
    """Grad mode is on and q, k, v, the bias or the sink requires grad."""
    if not torch.is_grad_enabled():
        return False
    bias, sink = inputs.bias, inputs.sink
    return (q.requires_grad or k.requires_grad or v.requires_grad
            or (bias is not None and bias.requires_grad) or (sink is not None and sink.requires_grad))


def call_options(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: OptionalInputs,
                 arguments: Arguments) -> CallOptions:
    """The CallOptions of a call whose arguments check_args accepted, or `keyable` admitted.

    Values are taken as given but for None layout (DEFAULT_LAYOUT), a list window_size (a tuple) and
    dropout (a float): for values of the types check_args takes, neither changes its verdict."""
    training = is_training(q, k, v, inputs)
    fp8 = arguments.fp8
    scales = fp8 if isinstance(fp8, FP8Scales) else None
    o_dtype = fp8.o_dtype if isinstance(fp8, (FP8Scales, FP8History)) else None
    layout = arguments.layout
    return CallOptions(
        DEFAULT_LAYOUT if layout is None else layout, arguments.mask, tuple(arguments.window_size),
        arguments.attn_scale, float(arguments.dropout), arguments.softmax, arguments.deterministic,
        scales is not None or fp8 is True or isinstance(fp8, FP8History),
        "" if o_dtype is None else O_DTYPE_NAMES.get(o_dtype, repr(o_dtype)), training,
        training and inputs.bias is not None and inputs.bias.requires_grad,
        training and inputs.sink is not None and inputs.sink.requires_grad, arguments.return_lse,
    )


# ----- which calls may be looked up before they are checked ----------------------------------------
# attention() checks a call's arguments once per key (docs/dispatch.md, 'Hot path'): a call is found
# by its key before it is checked, so a key must never let a value check_args refuses equal a checked
# one. Python's numbers equal across types (True == 1 == 1.0 == numpy.float32(1)), and call_options
# turns None into a layout and dropout into a float; so only values of the types check_args takes are
# looked up, and what the keys leave out (the devices of the optional tensors and of FP8Scales'
# descales, the dtype of alibi_slopes and whether they require grad) is compared here. Any other call
# is checked first.
_NUMBERS = (int, float)
_WINDOWS = (tuple, list)


def _number(value: Any) -> bool:
    """An int or float as check_args takes one: a bool is not a number there."""
    kind = value.__class__
    return kind is float or kind is int or (kind is not bool and isinstance(value, _NUMBERS))


def plain_numbers(given: tuple) -> bool:
    """Whether window_size, attn_scale and dropout of attention()'s arguments as given (Arguments'
    order) are of the types check_args takes: where they are, equal values get equal verdicts."""
    window, attn_scale, dropout = given[2], given[3], given[4]
    return ((attn_scale is None or _number(attn_scale)) and _number(dropout)
            and (window is NO_WINDOW or (window.__class__ in _WINDOWS and len(window) == 2
                                         and window[0].__class__ is int and window[1].__class__ is int)))


def keyable(q: torch.Tensor, inputs: OptionalInputs, arguments: Arguments) -> bool:
    """Whether check_args' verdict on a call is that of any checked call with the same `entries.key`
    (made from call_options), so that a call found by that key needs no check. False: check first."""
    layout, mask, _, _, _, softmax, deterministic, fp8, return_lse = arguments
    if not ((layout is None or isinstance(layout, str)) and isinstance(mask, str) and isinstance(softmax, str)
            and deterministic.__class__ is bool and return_lse.__class__ is bool and plain_numbers(arguments)):
        return False
    device = q.device
    if fp8.__class__ is not bool:
        # The key holds whether FP8 runs and its output precision, not the kind of `fp8`: FP8Scales is
        # for float8 inputs only and FP8History for fp16/bf16 only, else a call of the other kind finds it.
        if isinstance(fp8, FP8Scales):
            if not (fp8q.is_fp8_dtype(q.dtype) and fp8.descale_q.device == device
                    and fp8.descale_k.device == device and fp8.descale_v.device == device):
                return False
            if torch.is_grad_enabled() and (fp8.descale_q.requires_grad or fp8.descale_k.requires_grad
                                            or fp8.descale_v.requires_grad):
                return False  # refused by _check_fp8 (the key does not hold requires_grad)
        elif not isinstance(fp8, FP8History) or fp8q.is_fp8_dtype(q.dtype):
            return False
    if inputs is NO_INPUTS:
        return True
    bias, alibi, sink = inputs.bias, inputs.alibi_slopes, inputs.sink  # the key holds the lengths' devices
    return ((bias is None or bias.device == device) and (sink is None or sink.device == device)
            and (alibi is None or (alibi.device == device and alibi.is_floating_point()
                                   and not (alibi.requires_grad and torch.is_grad_enabled()))))


# ----- checks, in the order of attention()'s arguments -------------------------------------------
def check_args(q: Any, k: Any, v: Any, inputs: OptionalInputs, arguments: Arguments) -> None:
    """Raise ConfigError naming the first bad argument (its value and what is allowed)."""
    _check_qkv(q, k, v)
    _check_layout(arguments.layout)
    dims = _check_shapes(q, k, v, arguments.layout or DEFAULT_LAYOUT)
    _check_mask_and_window(arguments.mask, arguments.window_size)
    _check_scalars(arguments)
    _check_optional_tensors(inputs, dims, arguments.softmax, q.device)
    _check_seqlens(inputs, arguments.mask, dims)
    for name in ("deterministic", "return_lse"):
        if not isinstance(getattr(arguments, name), bool):
            raise ConfigError(name, getattr(arguments, name), "must be True or False")
    _check_fp8(q, k, v, arguments.fp8, is_training(q, k, v, inputs))


_DENSE_ONLY = ("must be a dense (strided) tensor: pad sequences of different lengths and pass mask='padding' "
               "with seqlens_q and seqlens_kv, or call integrations.sdpa.scaled_dot_product_attention, which "
               "gives nested tensors to torch's SDPA")


def _check_qkv(q: Any, k: Any, v: Any) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ConfigError(name, type(t).__name__, "must be a torch.Tensor")
        # Before anything reads a size: a nested tensor's ragged length is a new symbol every batch (a new
        # call signature each time), and a strided nested tensor has no sizes at all.
        if t.is_nested or t.layout != torch.strided:
            raise ConfigError(name, f"nested tensor ({t.layout})" if t.is_nested else str(t.layout),
                              _DENSE_ONLY if t.is_nested else "must be a dense (strided) tensor")
        if t.dim() != 4:
            raise ConfigError(name, tuple(t.shape), "must be 4-D, in the order named by `layout`")
        if not t.is_floating_point():
            raise ConfigError(name, t.dtype, "must be a floating-point tensor (fp16, bf16, fp32 or float8)")
        if t.dtype.itemsize == 1 and not fp8q.is_fp8_dtype(t.dtype):  # e.g. ROCm's float8_e4m3fnuz
            raise ConfigError(name, t.dtype, "float8 inputs must be float8_e4m3fn or float8_e5m2")
        if t.device != q.device:
            raise ConfigError(name, str(t.device), f"must be on q's device ({q.device})")


def _check_layout(layout: Any) -> None:
    if layout is not None and (not isinstance(layout, str) or layout not in LAYOUTS):
        raise ConfigError("layout", layout, "must be None (= 'bshd') or one of " + ", ".join(map(repr, LAYOUTS)))


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str) -> Dims:
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ConfigError("k", (k.dtype, v.dtype), f"k and v must have q's dtype ({q.dtype})")
    perm = TO_BHSD[layout]
    bq, hq, sq, dq = (q.shape[i] for i in perm)
    bk, hk, sk, dk = (k.shape[i] for i in perm)
    bv, hv, sv, dv = (v.shape[i] for i in perm)
    if bk != bq or bv != bq:
        raise ConfigError("k", tuple(k.shape), f"batch size must match q's ({bq}); v has {bv}")
    if hv != hk:
        raise ConfigError("v", tuple(v.shape), f"must have k's number of heads ({hk})")
    if sv != sk:
        raise ConfigError("v", tuple(v.shape), f"must have k's sequence length ({sk})")
    if dk != dq:
        raise ConfigError("k", tuple(k.shape), f"head dim must match q's ({dq})")
    if hk == 0 or hq % hk:
        raise ConfigError("k", tuple(k.shape), f"number of heads ({hk}) must divide q's ({hq}) for GQA/MQA")
    for name, t, dims in (("q", q, (hq, dq)), ("v", v, (dv,))):
        if min(dims) <= 0:
            raise ConfigError(name, tuple(t.shape), "the heads and head dims of q, k and v must be positive")
    return Dims(bq, hq, sq, sk)


def _check_mask_and_window(mask: Any, window_size: Any) -> None:
    if not isinstance(mask, str) or mask not in MASKS:
        raise ConfigError("mask", mask, "must be one of " + ", ".join(map(repr, MASKS)))
    if bad_window(window_size):
        raise ConfigError("window_size", window_size, WINDOW_RULE)
    if "causal" in mask and window_size[1] not in (-1, 0):
        raise ConfigError("window_size", tuple(window_size),
                          f"mask={mask!r} is causal: the right bound must be 0 or -1")


def _check_scalars(arguments: Arguments) -> None:
    attn_scale, dropout = arguments.attn_scale, arguments.dropout
    if attn_scale is not None and (isinstance(attn_scale, bool) or not isinstance(attn_scale, (int, float))
                                   or not math.isfinite(attn_scale) or attn_scale <= 0):
        raise ConfigError("attn_scale", attn_scale, "must be None (1/sqrt(head_dim)) or a positive finite number")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ConfigError("dropout", dropout, "must be a number in [0, 1)")
    if not isinstance(arguments.softmax, str) or arguments.softmax not in SOFTMAXES:
        raise ConfigError("softmax", arguments.softmax, "must be one of " + ", ".join(map(repr, SOFTMAXES)))


def _check_optional_tensors(inputs: OptionalInputs, dims: Dims, softmax: str, device: torch.device) -> None:
    for name, value in zip(OptionalInputs._fields, inputs):
        if value is not None and not isinstance(value, torch.Tensor):
            raise ConfigError(name, type(value).__name__, "must be a torch.Tensor or None")
        if value is not None and value.device != device:
            raise ConfigError(name, str(value.device), f"must be on q's device ({device})")
    bias, alibi_slopes, sink = inputs.bias, inputs.alibi_slopes, inputs.sink
    bq, hq = dims.batch, dims.heads_q
    if bias is not None:
        target = (bq, hq, dims.seqlen_q, dims.seqlen_kv)
        if bias.dim() != 4 or any(n not in (1, t) for n, t in zip(bias.shape, target)):
            raise ConfigError("bias", tuple(bias.shape), f"must be 4-D and broadcastable to (B, Hq, Sq, Skv)={target}")
        if not bias.is_floating_point():
            raise ConfigError("bias", bias.dtype, "must be a floating-point tensor")
    if alibi_slopes is not None and tuple(alibi_slopes.shape) not in ((hq,), (bq, hq)):
        raise ConfigError("alibi_slopes", tuple(alibi_slopes.shape), f"must have shape ({hq},) or ({bq}, {hq})")
    if alibi_slopes is not None and not alibi_slopes.is_floating_point():
        raise ConfigError("alibi_slopes", alibi_slopes.dtype, "must be a floating-point tensor")
    if alibi_slopes is not None and alibi_slopes.requires_grad and torch.is_grad_enabled():
        # The fused kernels and torch.compile's op give slopes no gradient: refused on every device and
        # path alike, rather than trained by the CPU fallback only.
        raise ConfigError("alibi_slopes", "requires_grad=True", "ALiBi slopes take no gradient: detach them "
                          "(alibi_slopes.detach()), or pass slopes that must learn as a `bias`")
    if softmax == "learnable":
        if sink is None or tuple(sink.shape) != (hq,) or not sink.is_floating_point():
            raise ConfigError("sink", None if sink is None else tuple(sink.shape),
                              f"softmax='learnable' needs a floating-point sink of shape ({hq},)")
    elif sink is not None:
        raise ConfigError("sink", tuple(sink.shape), f"only allowed with softmax='learnable' (softmax={softmax!r})")


def _check_seqlens(inputs: OptionalInputs, mask: str, dims: Dims) -> None:
    padded = mask.startswith("padding")
    for name, lens in (("seqlens_q", inputs.seqlens_q), ("seqlens_kv", inputs.seqlens_kv)):
        if padded and lens is None:
            raise ConfigError(name, None, f"required with mask={mask!r}")
        if not padded and lens is not None:
            raise ConfigError(name, "tensor", f"only allowed with a padding mask (mask={mask!r})")
        # Their values are checked by each call that reads them on the CPU (fallback.fallback_forward).
        if lens is not None and (tuple(lens.shape) != (dims.batch,) or lens.is_floating_point()
                                 or lens.dtype == torch.bool):
            raise ConfigError(name, (tuple(lens.shape), lens.dtype), f"must be an integer tensor of shape ({dims.batch},)")


def _check_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fp8: Any, training: bool) -> None:
    float8_inputs = fp8q.is_fp8_dtype(q.dtype)
    if float8_inputs:
        if not isinstance(fp8, FP8Scales):
            raise ConfigError("fp8", fp8, "float8 q/k/v need fp8=FP8Scales(descale_q, descale_k, descale_v)")
        if not isinstance(fp8.o_dtype, torch.dtype) or fp8.o_dtype not in O_DTYPE_NAMES:
            raise ConfigError("fp8.o_dtype", fp8.o_dtype, "must be torch.float16, torch.bfloat16 or "
                                                          "torch.float8_e4m3fn (an FP8Tensor is returned)")
        for name in fp8q.DESCALES:  # their type and size: FP8Scales checks them when it is made
            if getattr(fp8, name).device != q.device:
                raise ConfigError("fp8." + name, str(getattr(fp8, name).device), f"must be on q's device ({q.device})")
            if getattr(fp8, name).requires_grad and torch.is_grad_enabled():
                # No path differentiates them: the fused kernels and torch.compile's op would drop the gradient.
                raise ConfigError("fp8." + name, "requires_grad=True", "float8 inputs are for inference: descales "
                                  "must not require grad (detach them, or call under torch.no_grad())")
    elif isinstance(fp8, FP8Scales):
        raise ConfigError("fp8", "FP8Scales", f"descale factors are for float8 inputs; q is {q.dtype} (use fp8=True)")
    elif not isinstance(fp8, (bool, FP8History)):
        raise ConfigError("fp8", fp8, "must be True, False, an FP8History (delayed scaling), or FP8Scales for "
                                      "float8 inputs")
    elif fp8 is not False and q.dtype not in F16_NAMES:
        raise ConfigError("fp8", fp8, f"quantizes fp16/bf16 inputs; q is {q.dtype}")
    elif isinstance(fp8, FP8History) and fp8.o_dtype is not None and training:
        raise ConfigError("fp8.o_dtype", fp8.o_dtype, "FP8 output (an FP8Tensor) is for inference; "
                                                      "training returns the input precision (o_dtype=None)")
    if float8_inputs and any(t.requires_grad for t in (q, k, v)) and torch.is_grad_enabled():
        raise ConfigError("q", q.dtype, "float8 inputs are for inference; they cannot require grad")
