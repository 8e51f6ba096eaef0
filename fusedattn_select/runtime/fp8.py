"""FP8 for dispatch: per-tensor current scaling and the scale tensors cuDNN's sdpa_fp8 graphs take.

Current scaling quantizes q, k, v (and dO in the backward) with scales from their own amaxes, computed on
the device in the same call (no host sync, no history); delayed scaling is `FP8History`; the casts, amaxes
and dequantization run in fp8_kernels. Scales are powers of two: scaling and `descale = 1 / scale` are
exact in fp16/bf16, and a value quantized, dequantized and quantized again with one scale comes back bit
for bit.

Tensors cuDNN produces have no amax before the kernel runs; their scales come from bounds that hold for
every input (s: attn_scale; |X|max: X's largest L2 row norm; g: q heads per kv head):

    P (softmax, "S")  in [0, 1]: S_SCALE (dtypes.FP8_SOFTMAX_SCALE)
    O = P V           rows of O are convex combinations of rows of V: |O| <= amax(V), O's scale comes from it
                      (with dropout, times 2**floor(log2(1 - dropout)): dropout_headroom)
    dP = s dS         |dS_ij| <= P_ij (|dO_i . V_j| + |dO_i . O_i|) <= 2 |dO|max |V|max
    dQ = dP K         |dQ| <= s amax(K) * 2 |dO|max |V|max            (rows of P sum to 1)
    dK = dP^T Q       |dK| <= s amax(Q) * 2 |dO|max |V|max * Sq * g
    dV = P^T dO       |dV| <= amax(dO) * Sq * g
    (all divided by 1 - dropout, which rescales P; dtypes.fp8_gradient_bounds computes them)

Where cuDNN writes O and dQ/dK/dV in fp16/bf16 (Blackwell) they take unit scales; on Hopper they are FP8
at the scales above, dequantized to the input precision before they are returned.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import torch

from fusedattn_select import dtypes
from fusedattn_select.dtypes import dropout_headroom
from fusedattn_select.errors import ConfigError
from fusedattn_select.runtime import fp8_kernels as fp8k
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.streams import persistent
from fusedattn_select.runtime.fp8_kernels import FP8_MAX, MAX_SCALE, STATE, Delayed, dequantize  # noqa: F401

log = logging.getLogger("fusedattn_select")

S_SCALE = dtypes.FP8_SOFTMAX_SCALE
HISTORY_ALGOS = ("max", "most_recent")
MAX_HISTORY = 1024
MAX_MARGIN = 64

# The saved FP8 state of one call is a float32 vector with the entries STATE names (vnorm: NaN
# unless quantized for training).
_AT = {name: i for i, name in enumerate(STATE)}


def at(state: torch.Tensor, name: str) -> torch.Tensor:
    """One entry of a saved state as a (1,) view."""
    i = _AT[name]
    return state[i:i + 1]


DESCALES = ("descale_q", "descale_k", "descale_v")


@dataclass(frozen=True)
class FP8Scales:
    """Descale factors for float8 q, k, v passed to attention(..., fp8=FP8Scales(...)).

    The real value of an element is `stored * descale`. Each descale is a floating-point tensor
    (float32, as the kernels take it, or another float dtype, converted) with one element, on the
    inputs' device: ConfigError here for another type, dtype or size, and from attention() for
    another device, or where one requires grad with grad mode on (float8 inputs are for inference:
    no path differentiates the descales). `o_dtype` is the precision of the returned output.
    """

    descale_q: torch.Tensor
    descale_k: torch.Tensor
    descale_v: torch.Tensor
    o_dtype: torch.dtype = torch.bfloat16

    def __post_init__(self) -> None:
        # Checked when made, not per signature: the descales are not part of a call's key.
        self._check()

    def __setstate__(self, state: dict) -> None:
        """Restore saved scales (pickle, copy, torch.load), checked as new ones are."""
        fields = set(DESCALES) | {"o_dtype"}
        if not isinstance(state, dict) or set(state) != fields:
            raise ConfigError("FP8Scales", sorted(state) if isinstance(state, dict) else type(state).__name__,
                              "saved scales must hold " + ", ".join(sorted(fields)))
        for name, value in state.items():
            object.__setattr__(self, name, value)  # (frozen)
        self._check()

    def _check(self) -> None:
        for name in DESCALES:
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise ConfigError("FP8Scales." + name, t, "must be a floating-point torch.Tensor with one element")
            if not t.is_floating_point() or t.numel() != 1:
                raise ConfigError("FP8Scales." + name, (tuple(t.shape), t.dtype),
                                  "must be a floating-point torch.Tensor with one element")


class FP8Tensor(NamedTuple):
    """An FP8 result and its descale: the real value of an element is `data * descale`.

    attention() returns one for `o_dtype=torch.float8_e4m3fn` (FP8Scales or FP8History): the kernel's
    FP8 output, without the pass that would turn it into fp16/bf16."""

    data: torch.Tensor
    descale: torch.Tensor  # float32, one element

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return fp8k.dequantize(self.data, self.descale, dtype)


def quantize_output(out: torch.Tensor, fp8_dtype: torch.dtype) -> FP8Tensor:
    """`out` as an FP8Tensor with a power-of-two scale from its amax (current scaling; 1 for an empty `out`)."""
    if not out.numel():
        return FP8Tensor(out.detach().to(fp8_dtype), torch.ones(1, dtype=torch.float32, device=out.device))
    scale = pow2_scale(fp8k.amax([out.detach()]), fp8_dtype)
    return FP8Tensor(fp8k.scaled_cast(out.detach(), scale, fp8_dtype), scale.reciprocal())


def is_fp8_dtype(dtype: torch.dtype) -> bool:
    return dtype in FP8_MAX


class FP8History:
    """Delayed scaling for attention(q, k, v, fp8=FP8History(...)) with fp16/bf16 q, k, v.

    Each call scales q, k and v by powers of two computed from the amaxes that earlier calls
    recorded: the largest amax of the last `length` calls (algo="max") or the latest one
    ("most_recent"), with `margin` powers of two of headroom. Values beyond a delayed scale's
    range saturate. The first call (nothing recorded) uses current scaling. Where the recorded amax is 0
    or not finite (an all-zero tensor, an inf), the previous scale stays, and 1.0 while there is
    none (TransformerEngine's rule). Every call records its amaxes on the device (no host sync;
    capture-safe once the first call has run eagerly).

    One history belongs to one call site (one attention layer): sharing it across layers mixes
    their amaxes. It is not thread-safe: concurrent calls with one history race on its buffer.
    Activation checkpointing would run its forward twice a step (recording twice, recomputing with
    other scales): a fused call under it is refused (ConfigError); use fp8=True there.

    `o_dtype=torch.float8_e4m3fn` (inference only) returns the kernel's FP8 output as an
    `FP8Tensor(data, descale)`, for a caller whose next operation takes FP8 (an FP8 GEMM), without
    the pass that turns it into fp16/bf16; None (the default) returns the input precision.
    """

    def __init__(self, length: int = 16, algo: str = "max", margin: int = 0,
                 o_dtype: torch.dtype | None = None) -> None:
        if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= MAX_HISTORY:
            raise ConfigError("FP8History.length", length, f"must be an int from 1 to {MAX_HISTORY}")
        if algo not in HISTORY_ALGOS:
            raise ConfigError("FP8History.algo", algo, "must be one of " + ", ".join(map(repr, HISTORY_ALGOS)))
        if isinstance(margin, bool) or not isinstance(margin, int) or not 0 <= margin <= MAX_MARGIN:
            raise ConfigError("FP8History.margin", margin, f"must be an int from 0 to {MAX_MARGIN}")
        if o_dtype is not None and o_dtype != torch.float8_e4m3fn:
            raise ConfigError("FP8History.o_dtype", o_dtype, "must be None (the input precision) or "
                                                             "torch.float8_e4m3fn (an FP8Tensor is returned)")
        self.length, self.algo, self.margin, self.o_dtype = length, algo, margin, o_dtype
        self.calls = 0  # calls recorded (host side)
        self._buf: torch.Tensor | None = None

    def __setstate__(self, state: dict) -> None:
        """Restore a saved history (pickle, copy.deepcopy, torch.save and torch.load): its settings checked
        as __init__ checks them, and its amax buffer as take() makes it, so that no kernel reads or writes
        past it."""
        if not isinstance(state, dict):
            raise ConfigError("FP8History", type(state).__name__, "a saved history's state must be a dict")
        self.__init__(state.get("length"), state.get("algo"), state.get("margin"), state.get("o_dtype"))
        calls, buf = state.get("calls"), state.get("_buf")
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0 or (calls and buf is None):
            raise ConfigError("FP8History.calls", calls, "must be an int >= 0, and 0 without an amax buffer")
        size = (self.length + 2) * 3 + 1
        if buf is not None and not (isinstance(buf, torch.Tensor) and buf.dtype == torch.float32
                                    and tuple(buf.shape) == (size,) and buf.is_contiguous()):
            shown = (tuple(buf.shape), buf.dtype) if isinstance(buf, torch.Tensor) else type(buf).__name__
            raise ConfigError("FP8History._buf", shown, f"must be None or a contiguous float32 tensor of shape "
                                                        f"({size},) for length={self.length}")
        self.calls, self._buf = calls, buf

    def __repr__(self) -> str:
        out = "" if self.o_dtype is None else f", o_dtype={self.o_dtype}"
        return f"FP8History(length={self.length}, algo={self.algo!r}, margin={self.margin}{out}, calls={self.calls})"

    @property
    def amax_history(self) -> torch.Tensor | None:
        """(length, 3) float32 amaxes of q, k, v per call, row 0 the latest (zeros where no call
        was recorded); None before the first call."""
        return None if self._buf is None else self._buf[:self.length * 3].view(self.length, 3)

    def reset(self) -> None:
        """Forget the recorded amaxes: the next call uses current scaling again."""
        self.calls = 0
        if self._buf is not None:
            self._buf.zero_()

    def take(self, device: torch.device) -> Delayed:
        """The history for one call on `device` (its buffer is created on the first call)."""
        if self._buf is None:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("FP8History: run one call outside CUDA-graph capture first "
                                   "(its buffer must be created and zeroed eagerly)")
            size = (self.length + 2) * 3 + 1
            self._buf = persistent(lambda: torch.zeros(size, dtype=torch.float32, device=device), device)
        elif self._buf.device != device:
            if self._buf.device.type != "cpu":
                raise ConfigError("fp8", f"an FP8History of {self._buf.device}", f"used with tensors on {device}: "
                                  "use one history per call site")
            # Loaded from a checkpoint with map_location="cpu" (no call runs FP8 on a CPU): moved to its call's
            # device once, as a module's buffers are.
            restored = self._buf
            self._buf = persistent(lambda: restored.to(device), device)
        fresh = self.calls == 0
        self.calls += 1
        return Delayed(self._buf, self.length, self.margin, self.algo == "most_recent", fresh)


# Training checkpoints hold histories (and scales): torch.load's default (weights_only, since torch 2.6) reads
# only allowed classes. Both check what they restore (__setstate__).
torch.serialization.add_safe_globals([FP8History, FP8Scales])


def pow2_scale(amax: torch.Tensor, fp8_dtype: torch.dtype, *, limit: float = 0.0) -> torch.Tensor:
    """Largest power of two s with amax * s <= limit (default: the dtype's max), as float32."""
    return fp8k.pow2_scale_torch(amax, limit or FP8_MAX[fp8_dtype], MAX_SCALE[torch.float32])


def quantize_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fp8_dtype: torch.dtype, *,
                 training: bool = False, history: FP8History | None = None, dropout: float = 0.0
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q8, k8, v8, state): state holds STATE (amax_s and amax_o written by the forward graph).

    Current scaling, or delayed from `history` (which records this call's amaxes). O's scale is V's
    times dropout_headroom(dropout). vnorm (v's largest row norm, for the FP8 backward) only when
    `training`, else NaN."""
    q, k, v = q.detach(), k.detach(), v.detach()
    hist = history.take(q.device) if history is not None else None
    (q8, k8, v8), state = fp8k.quantize((q, k, v), fp8_dtype, hist, dropout_headroom(dropout))
    if training:
        torch.amax(torch.linalg.vector_norm(v, dim=-1, dtype=torch.float32), out=state[_AT["vnorm"]])
    return q8, k8, v8, state


def explicit_state(scales: FP8Scales, v8: torch.Tensor, o_dtype: torch.dtype, dropout: float = 0.0) -> torch.Tensor:
    """The state of caller-quantized inputs (inference): their descales, and O's scale from amax(V)
    (times dropout_headroom(dropout))."""
    descales = [p.detach().reshape(1).float() for p in (scales.descale_q, scales.descale_k, scales.descale_v)]
    amax_v = (v8.float().abs().amax() * descales[2]).reshape(1)
    unknown = torch.full_like(descales[0], float("nan"))
    scale_o = pow2_scale(amax_v, o_dtype) if is_fp8_dtype(o_dtype) else torch.ones_like(amax_v)
    if dropout and is_fp8_dtype(o_dtype):
        scale_o = scale_o * dropout_headroom(dropout)
    return torch.cat(descales + [unknown, unknown, amax_v, unknown, scale_o.reciprocal(), scale_o, unknown, unknown])


def forward_feeds(plan, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, state: torch.Tensor
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(inputs of an sdpa_fp8 forward graph except masks/sink/seqlens, outputs it writes into
    `state`). O's scale is the state's (from V's, where quantize() made it)."""
    c = state.view(len(STATE), 1, 1, 1, 1).unbind(0)  # each entry as a graph's (1, 1, 1, 1) scale
    feeds = {"q": plan.conform("q", q8), "k": plan.conform("k", k8), "v": plan.conform("v", v8)}
    for name in ("descale_q", "descale_k", "descale_v"):
        feeds[name] = plan.conform(name, c[_AT[name]])
    if plan.has("scale_s"):
        feeds["scale_s"] = plan.constant("scale_s", S_SCALE)
    if plan.has("descale_s"):
        feeds["descale_s"] = plan.constant("descale_s", 1.0 / S_SCALE)
    if is_fp8_dtype(plan.specs["o"].dtype):
        feeds["scale_o"] = plan.conform("scale_o", c[_AT["scale_o"]])
    elif plan.has("scale_o"):
        feeds["scale_o"] = plan.constant("scale_o", 1.0)
    outputs = {name: plan.conform(name, c[_AT[name]]) for name in ("amax_s", "amax_o") if plan.has(name)}
    return feeds, outputs


def _grad_out_feeds(plan, feeds: dict, grad_out: torch.Tensor) -> torch.Tensor:
    """Feed dO (quantized with current scaling where the graph takes FP8); returns amax(dO), (1,)."""
    do_dtype = plan.specs["dO"].dtype
    if not is_fp8_dtype(do_dtype):
        feeds["dO"] = plan.conform("dO", grad_out)
        if plan.has("descale_dO"):
            feeds["descale_dO"] = plan.constant("descale_dO", 1.0)
        return fp8k.amax([grad_out])
    (do8,), info = fp8k.quantize([grad_out], do_dtype)
    feeds["dO"] = plan.conform("dO", do8)
    feeds["descale_dO"] = plan.conform("descale_dO", info[0:1])
    return info[3:4]


# Why FP8 training from fp16/bf16 inputs runs the backward in their precision where the gradients are FP8
# (docs/dispatch.md, 'FP8 training runs what is fastest and keeps its gradients').
BOUND_SCALED_GRADIENTS = ("its FP8 gradients would be scaled from worst-case bounds, and dK's grows with seqlen_q "
                          "x query heads per KV head, which costs dK its precision")


def bound_scaled_gradients(cfg) -> str:
    """BOUND_SCALED_GRADIENTS where an FP8 training problem's gradients are FP8, else ""."""
    return BOUND_SCALED_GRADIENTS if dtypes.BY_NAME[cfg.resolved_dqkv_dtype].is_fp8 else ""


def tell_bound_scaled_gradients() -> None:
    """Log, once per process, that FP8 training runs the bf16 backward for bound_scaled_gradients' reason."""
    if dispatcher.first_time(BOUND_SCALED_GRADIENTS):
        log.warning("fusedattn_select: fp8=True training runs the FP8 forward and the bf16 backward: %s",
                    BOUND_SCALED_GRADIENTS)


def backward_feeds(plan, cfg, saved: tuple, out: torch.Tensor, grad_out: torch.Tensor, stats: torch.Tensor
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(inputs of an sdpa_fp8_backward graph except masks/sink/seqlens, descales of its FP8 outputs).

    `saved` is the forward's (q8, k8, v8, state); `out` the forward's returned output (dequantized
    where O was FP8: quantizing it again with descale_o restores the forward's O exactly)."""
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
        feeds["o"] = plan.conform("o", fp8k.scaled_cast(out.detach(), descale_o, o_dtype, inverse=True))
        feeds["descale_o"] = plan.conform("descale_o", descale_o)
    else:
        feeds["o"] = plan.conform("o", out.detach())
        if plan.has("descale_o"):
            feeds["descale_o"] = plan.constant("descale_o", 1.0)
    grad_out = grad_out.detach()
    amax_do = _grad_out_feeds(plan, feeds, grad_out)
    if plan.has("scale_s"):
        feeds["scale_s"] = plan.constant("scale_s", S_SCALE)
    if plan.has("descale_s"):
        feeds["descale_s"] = plan.constant("descale_s", 1.0 / S_SCALE)

    bounds = dtypes.fp8_gradient_bounds(
        cfg.resolved_attn_scale, 1.0 / (1.0 - cfg.dropout), cfg.seqlen_q * (cfg.num_heads_q // cfg.num_heads_kv),
        at(state, "amax_q"), at(state, "amax_k"), amax_do,
        torch.linalg.vector_norm(grad_out.detach(), dim=-1, dtype=torch.float32).amax(), at(state, "vnorm"))
    scale_dp = pow2_scale(bounds.pop("dP"), torch.float8_e4m3fn, limit=dtypes.FP8_INTERNAL_RANGE)
    feeds["scale_dP"] = plan.conform("scale_dP", scale_dp)
    feeds["descale_dP"] = plan.conform("descale_dP", scale_dp.reciprocal())
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
