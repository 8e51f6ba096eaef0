"""FP8 quantization kernels: amax, saturating scaled cast (optionally recording the input's amax),
delayed-scaling history update, and dequantization.

Every operation has a Triton kernel and a torch fallback with the same results (the same fp8 bytes
for the same scale, for finite inputs; NaN/inf inputs give NaN/saturated bytes, but their amax
and scale are unspecified). The Triton kernels run on CUDA tensors whose memory is dense in some
dim order (a BHSD view of BSHD, SBHD or BHSD memory): they walk the memory in storage order from
the tensor's first element (the start of dense memory), and outputs get the input's strides.
Anything else (CPU tensors, views into packed buffers, Triton missing, a GPU without FP8
conversions) runs the fallback, whose outputs also keep the input's strides where it is dense.
Scales are read from device memory and nothing waits for the host, so both paths can be captured
in a CUDA graph (call once before capturing: Triton compiles on the first call).

Scales are powers of two: `scale = 2**floor(log2(top / amax))`, times `2**-margin`, at most the
largest power of two the compute dtype holds. The quotient is rounded to float32 before its
exponent is taken; for amax and top on the float32 grid that never crosses a power of two, so the
scale is exact and `amax * scale <= top`. Delayed scaling follows TransformerEngine's update: a
reduced amax of 0 or not finite keeps the previous scale (the history's reduced amax is left as it
was), and with none yet the scale is 1.0 (TE's initial scale).

FUSEDATTN_SELECT_FP8_KERNELS picks the implementation once (docs/environment.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import torch

from fusedattn_select import dtypes, settings
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.run_settings import run_settings

log = logging.getLogger("fusedattn_select")

ENV_VAR = settings.FP8_KERNELS
FP8_MAX = {dtypes.torch_dtype(name, torch): dtypes.BY_NAME[name].largest for name in dtypes.FP8_DTYPES}
# The largest power-of-two scale a compute dtype can hold (fp16 overflows above 2**15).
MAX_SCALE = {torch.float16: 2.0 ** 15, torch.bfloat16: 2.0 ** 100, torch.float32: 2.0 ** 100}
# The FP8 state of one call: a float32 vector with these entries. quantize() writes the first nine
# (descale_o and scale_o from V's: see fp8.py); the forward graph writes amax_s and amax_o.
STATE = ("descale_q", "descale_k", "descale_v", "amax_q", "amax_k", "amax_v", "vnorm", "descale_o", "scale_o",
         "amax_s", "amax_o")

# The amax pass: BLOCK elements per program and step, AMAX_PROGRAMS_PER_SM programs per SM
# (chosen by tools/bench_amax.py; docs/performance.md).
_AMAX_BLOCK = 16384
_AMAX_PROGRAMS_PER_SM = 6
_CAST_BLOCK = 8192
_DEQUANT_BLOCK = 8192
_MAX_PARTIALS = 1024  # literal in _t_scale_of: programs of the amax kernel per tensor, at most
_MAX_NUMEL = 2 ** 31 - 2 ** 24  # int32 offsets in the kernels
_EXPONENT = 0x7F800000
_FROM_PARTIALS, _FROM_AMAX, _FROM_SCALE, _FROM_DESCALE = 0, 1, 2, 3

# The chosen backend, the jitted kernels and per-device facts are the Dispatcher's (fp8_backend,
# fp8_kernels, fp8_capable). `tl` and the jitted helpers stay module globals: Triton's JIT resolves
# the names a kernel calls in its module's globals.
tl = None  # triton.language once _load_triton() has run: the kernels below name it


class Delayed(NamedTuple):
    """A delayed-scaling history as the kernels see it (see fp8.FP8History).

    `buf` is float32 ((length + 2) * 3 + 1,): rows 0..length-1 the amax history (row 0 most
    recent), row `length` the reduced amax the next call scales with (the latest one that was
    positive and finite, 0 while there is none: see _good_reduced), row `length + 1` scratch for
    the running amax, and last an int32 count of the cast's finished programs (both zero between
    calls)."""

    buf: torch.Tensor
    length: int
    margin: int
    most_recent: bool
    fresh: bool  # nothing recorded yet: scale from the current amax, then record it


# ----- implementation choice ---------------------------------------------------------------------
def configured_choice() -> str:
    """The value of FUSEDATTN_SELECT_FP8_KERNELS ("auto" when unset); ConfigError if not allowed."""
    return run_settings.get().fp8_kernels


def backend(refresh: bool = False) -> str:
    """"triton" or "torch": what CUDA tensors get, decided once (again with refresh=True)."""
    if dispatcher.fp8_backend is None or refresh:
        choice = configured_choice()
        if choice == "torch":
            chosen, why = "torch", f"{ENV_VAR}=torch"
        else:
            error = _load_triton()
            if error is None:
                chosen, why = "triton", f"{ENV_VAR}={choice}"
            elif choice == "triton":
                raise RuntimeError(f"{ENV_VAR}=triton, but Triton cannot be used: {error}")
            else:
                chosen, why = "torch", f"Triton cannot be used: {error}"
        dispatcher.fp8_backend = chosen
        log.debug("fp8 quantization kernels: %s (%s)", chosen, why)
    return dispatcher.fp8_backend


def _load_triton() -> str | None:
    """Import Triton and JIT the kernels (once); None, or why Triton cannot be used."""
    global tl
    if dispatcher.fp8_kernels:
        return None
    try:
        import triton
        from triton import language
    except Exception as err:  # noqa: BLE001  (ImportError, or a broken install)
        return f"{type(err).__name__}: {err}"
    tl = language
    names = globals()
    for name in ("_t_pow2", "_t_amax_range", "_t_scale_of", "_t_cast_one", "_t_commit"):
        names[name] = triton.jit(names[name])
    for name in ("_k_amax", "_k_cast", "_k_commit", "_k_dequant"):
        dispatcher.fp8_kernels[name] = triton.jit(names[name])
    return None


def _dense(x: torch.Tensor) -> bool:
    """True when x covers its memory without gaps or overlaps, in any dim order."""
    expect = 1
    for stride, size in sorted((s, n) for n, s in zip(x.shape, x.stride()) if n != 1):
        if stride != expect:
            return False
        expect *= size
    return True


def _device_info(device: torch.device) -> tuple[bool, int]:
    """(has FP8 conversions, SM count), cached per device."""
    capable = dispatcher.fp8_capable
    if device not in capable:
        props = torch.cuda.get_device_properties(device)
        capable[device] = ((props.major, props.minor) >= (8, 9), props.multi_processor_count)
    return capable[device]


def uses_triton(*tensors: torch.Tensor) -> bool:
    """Whether these tensors go to the Triton kernels (else the torch fallback)."""
    return (all(t.is_cuda and 0 < t.numel() < _MAX_NUMEL and _dense(t) for t in tensors)
            and backend() == "triton" and _device_info(tensors[0].device)[0])


def _like(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(x.shape, x.stride(), dtype=dtype, device=x.device)


# ----- torch fallbacks ---------------------------------------------------------------------------
def pow2_scale_torch(amax: torch.Tensor, top: float, max_scale: float, margin: int = 0) -> torch.Tensor:
    """2**floor(log2(top / amax)) * 2**-margin, at most max_scale (float32, amax's shape)."""
    ratio = torch.div(torch.tensor(top, dtype=torch.float32), amax.float())
    scale = torch.bitwise_and(ratio.view(torch.int32), _EXPONENT).view(torch.float32)
    if margin:
        scale = scale.mul_(2.0 ** -margin)
    return scale.clamp_(max=max_scale)


def _torch_amax(xs: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack(torch._foreach_norm(list(xs), float("inf"))).float()


def _torch_cast(x: torch.Tensor, scale: torch.Tensor, top: float, fp8_dtype: torch.dtype) -> torch.Tensor:
    """saturate(x * scale) as fp8; scale a 0-dim tensor of x's dtype (exact: a power of two)."""
    return torch.mul(x, scale).clamp_(-top, top).to(fp8_dtype)


def _torch_commit(hist: Delayed, amax: torch.Tensor) -> None:
    rows = hist.buf[:hist.length * 3].view(hist.length, 3)
    if hist.length > 1:
        rows[1:].copy_(rows[:-1].clone())
    rows[0].copy_(amax)
    reduced = hist.buf[hist.length * 3:hist.length * 3 + 3]
    new = amax if hist.most_recent else rows.amax(dim=0)
    reduced.copy_(torch.where(_good_reduced(new), new, reduced))


def _good_reduced(amax: torch.Tensor) -> torch.Tensor:
    """Where a reduced amax may set a scale. As TransformerEngine's delayed-scaling update, an amax of 0
    (an all-zero tensor, or nothing recorded) or not finite keeps the previous scale: the reduced amax
    row keeps its last good value, and where it never had one (0) the scale is 1.0, TE's initial scale."""
    return torch.isfinite(amax) & (amax > 0)


def _torch_quantize(xs: Sequence[torch.Tensor], fp8_dtype: torch.dtype, info: torch.Tensor,
                    hist: Delayed | None, o_factor: float) -> list[torch.Tensor]:
    top, count = FP8_MAX[fp8_dtype], len(xs)
    max_scale = MAX_SCALE.get(xs[0].dtype, 2.0 ** 100)
    amax = info[3:3 + count]
    if hist is None or hist.fresh:
        amax.copy_(_torch_amax(xs))
        scale = pow2_scale_torch(amax, top, max_scale)
    else:
        reduced = hist.buf[hist.length * 3:hist.length * 3 + count]
        scale = torch.where(_good_reduced(reduced), pow2_scale_torch(reduced, top, max_scale, hist.margin), 1.0)
    torch.reciprocal(scale, out=info[:count])
    if count == 3:
        info[7:9].copy_(torch.stack((info[2] / o_factor, scale[2] * o_factor)) if o_factor != 1.0
                        else torch.stack((info[2], scale[2])))
    low = scale.to(xs[0].dtype)
    outs = [_torch_cast(x, low[i], top, fp8_dtype) for i, x in enumerate(xs)]
    if hist is not None and not hist.fresh:
        amax.copy_(_torch_amax(xs))
    if hist is not None:
        _torch_commit(hist, amax)
    return outs


# ----- public operations -------------------------------------------------------------------------
def quantize(xs: Sequence[torch.Tensor], fp8_dtype: torch.dtype, hist: Delayed | None = None,
             o_factor: float = 1.0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(fp8 copies of 1 to 3 same-dtype tensors, a float32 vector laid out as STATE).

    Entry i of the vector is tensor i's descale, entry 3 + i its amax; entry 6 is NaN; with three
    tensors, entries 7 and 8 are O's descale and scale: the third's scale times `o_factor` (a power of
    two <= 1: headroom for dropout, fp8.dropout_headroom). Current scaling (scale from
    each tensor's amax) unless `hist` holds a recorded history: then the scales come from it (no
    amax pass before the cast) and values beyond the delayed scale saturate. With `hist`, the
    amaxes of this call are recorded into it (rows shift down one).
    """
    if not 1 <= len(xs) <= 3:
        raise ValueError(f"quantize takes 1 to 3 tensors, got {len(xs)}")
    if uses_triton(*xs):  # the kernels write every entry of the tensors given
        info = torch.empty(len(STATE), dtype=torch.float32, device=xs[0].device)
        return _triton_quantize(xs, fp8_dtype, info, hist, o_factor), info
    info = torch.full((len(STATE),), float("nan"), dtype=torch.float32, device=xs[0].device)
    return _torch_quantize(xs, fp8_dtype, info, hist, o_factor), info


def amax(xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """max |x| of each of 1 to 3 tensors, as a float32 (len(xs),) tensor on their device."""
    if not uses_triton(*xs):
        return _torch_amax(xs)
    out = torch.zeros(len(xs), dtype=torch.float32, device=xs[0].device)
    _launch_amax(xs, out, atomic=True)
    return out


def scaled_cast(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype, *, inverse: bool = False,
                amax_out: torch.Tensor | None = None) -> torch.Tensor:
    """saturate(x * s) as fp8 with x's strides, s = scale[0] (or 1 / scale[0] with inverse=True),
    a power of two in float32 device memory. With amax_out (float32, 1 element), max |x| is
    folded into it in the same pass (amax_out = max(amax_out, amax(x)))."""
    top = FP8_MAX[fp8_dtype]
    scale = scale.reshape(-1)[:1]
    if not uses_triton(x):
        s = scale.reciprocal() if inverse else scale
        out = _torch_cast(x, s.to(x.dtype)[0], top, fp8_dtype)
        if amax_out is not None:
            torch.maximum(amax_out.view(-1)[:1], _torch_amax([x]), out=amax_out.view(-1)[:1])
        return out
    out = _like(x, fp8_dtype)
    blocks = -(-x.numel() // _CAST_BLOCK)
    record = amax_out is not None
    dispatcher.fp8_kernels["_k_cast"][(blocks,)](
        ((x, x, x), (out, out, out), (x.numel(), 0, 0)), (blocks, blocks),
        ((scale, 0, 0, 0, 0), (scale, amax_out if record else scale), (top, 1.0, 1.0, float("nan"), 1.0)),
        (scale, 0, 0),
        MODE=_FROM_DESCALE if inverse else _FROM_SCALE, RECORD=record, COMMIT=False, MOST_RECENT=False, LB=1,
        BLOCK=_CAST_BLOCK, num_warps=8)
    return out


def dequantize(x8: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x8 * descale[0] in `dtype` (computed in float32, rounded once), with x8's strides. For fp16,
    values beyond 65504 become +-65504, not inf (65504 quantized is 256 * 2**8 = 65536). Only fp16 is
    clamped (a float32 pass on the torch path): its range is reached by ordinary values, bf16's and
    float32's only near 3e38."""
    descale = descale.reshape(-1)[:1]
    top = torch.finfo(dtype).max if dtype == torch.float16 else float("inf")
    if not uses_triton(x8):
        out = torch.empty_like(x8, dtype=dtype)
        if dtype != torch.float16:
            return torch.mul(x8.to(dtype), descale.float(), out=out)
        return out.copy_(torch.mul(x8.float(), descale.float()).clamp_(-top, top))
    out = _like(x8, dtype)
    n = x8.numel()
    dispatcher.fp8_kernels["_k_dequant"][(-(-n // _DEQUANT_BLOCK),)](
        x8, out, n, descale, top, BLOCK=_DEQUANT_BLOCK, num_warps=8)
    return out


# ----- Triton launches ---------------------------------------------------------------------------
def _padded(xs: Sequence[torch.Tensor], fill) -> tuple:
    return tuple(xs) + (fill,) * (3 - len(xs))


def _ends(counts: Sequence[int]) -> tuple[int, int, int]:
    e0 = counts[0]
    e1 = e0 + counts[1]
    return e0, e1, e1 + counts[2]


def _launch_amax(xs: Sequence[torch.Tensor], out: torch.Tensor, atomic: bool, block: int = _AMAX_BLOCK,
                 programs_per_sm: int = _AMAX_PROGRAMS_PER_SM, warps: int = 8) -> tuple[int, int, int]:
    """Run the amax kernel; returns the end of each tensor's programs (their partials' slots). The
    launch shape is the defaults' except in tools/bench_amax.py, which compares others."""
    ns = [x.numel() for x in xs] + [0] * (3 - len(xs))
    total = sum(ns)
    target = programs_per_sm * _device_info(xs[0].device)[1]
    counts = [min(-(-n // block), _MAX_PARTIALS, max(1, round(target * n / total))) for n in ns]
    ends = _ends(counts)
    amax_kernel = dispatcher.fp8_kernels["_k_amax"]
    amax_kernel[(ends[2],)](_padded(xs, xs[0]), tuple(ns), ends, out, ATOMIC=atomic, BLOCK=block, num_warps=warps)
    return ends


def _triton_quantize(xs: Sequence[torch.Tensor], fp8_dtype: torch.dtype, info: torch.Tensor,
                     hist: Delayed | None, o_factor: float) -> list[torch.Tensor]:
    top = FP8_MAX[fp8_dtype]
    max_scale = MAX_SCALE.get(xs[0].dtype, 2.0 ** 100)
    outs = [_like(x, fp8_dtype) for x in xs]
    ns = tuple(x.numel() for x in xs) + (0,) * (3 - len(xs))
    blocks = _ends([-(-n // _CAST_BLOCK) for n in ns])
    delayed = hist is not None and not hist.fresh
    if delayed:
        length = hist.length
        src = (hist.buf[length * 3:], 0, 0, 0, 0)
        cur = hist.buf[(length + 1) * 3:]
        mode, margin = _FROM_AMAX, 2.0 ** -hist.margin
    else:
        partials = torch.empty(3 * _MAX_PARTIALS, dtype=torch.float32, device=xs[0].device)
        src = (partials, 0) + _launch_amax(xs, partials, atomic=False)
        cur, mode, margin = info, _FROM_PARTIALS, 1.0
    lb = 1 << max(hist.length - 1, 0).bit_length() if hist is not None else 1
    # Delayed scaling: the cast's last program records the amaxes (no second launch).
    commit = (hist.buf, hist.length, blocks[2]) if delayed else (info, 0, 0)
    dispatcher.fp8_kernels["_k_cast"][(blocks[2],)](
        (_padded(xs, xs[0]), _padded(outs, outs[0]), ns),
        blocks[:2], (src, (info, cur), (top, max_scale, margin, float("nan"), o_factor)), commit,
        MODE=mode, RECORD=delayed, COMMIT=delayed, MOST_RECENT=hist is not None and hist.most_recent, LB=lb,
        BLOCK=_CAST_BLOCK, num_warps=8)
    if hist is not None and not delayed:  # the first call of a history: its current-scaling amaxes
        commit_kernel = dispatcher.fp8_kernels["_k_commit"]
        commit_kernel[(1,)](hist.buf, info[3:], info, hist.length, MOST_RECENT=hist.most_recent, LB=lb, num_warps=4)
    return outs


# ----- Triton kernels (plain functions here; _load_triton() JITs them) ---------------------------
def _t_pow2(amax, top, max_scale, margin):
    bits = tl.math.div_rn(top, amax).to(tl.int32, bitcast=True) & 0x7F800000
    return tl.minimum(bits.to(tl.float32, bitcast=True) * margin, max_scale)


def _t_amax_range(x, n, p, g, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for base in range(p * BLOCK, n, g * BLOCK):
        offs = base + tl.arange(0, BLOCK)
        acc = tl.maximum(acc, tl.abs(tl.load(x + offs, mask=offs < n, other=0.0).to(tl.float32)))
    return tl.max(acc, axis=0)


def _k_amax(xs, ns, ends, out, ATOMIC: tl.constexpr, BLOCK: tl.constexpr):
    # Programs [0, ends[0]) read xs[0], [ends[0], ends[1]) xs[1], [ends[1], ends[2]) xs[2]; each
    # writes its max to out[program] (or folds it into out[tensor] with ATOMIC).
    pid = tl.program_id(0)
    if pid < ends[0]:
        m = _t_amax_range(xs[0], ns[0], pid, ends[0], BLOCK)
    elif pid < ends[1]:
        m = _t_amax_range(xs[1], ns[1], pid - ends[0], ends[1] - ends[0], BLOCK)
    else:
        m = _t_amax_range(xs[2], ns[2], pid - ends[1], ends[2] - ends[1], BLOCK)
    if ATOMIC:
        t = (pid >= ends[0]).to(tl.int32) + (pid >= ends[1]).to(tl.int32)
        tl.atomic_max(out + t, m, sem="relaxed")
    else:
        tl.store(out + pid, m)


def _t_scale_of(T: tl.constexpr, b, src, info, consts, MODE: tl.constexpr):
    if MODE == 0:  # current scaling: the max of tensor T's partials, src[1 + T] <= slot < src[2 + T]
        slots = src[1 + T] + tl.arange(0, 1024)
        amax = tl.max(tl.load(src[0] + slots, mask=slots < src[2 + T], other=0.0), axis=0)
        scale = _t_pow2(amax, consts[0], consts[1], 1.0)
    elif MODE == 1:  # delayed scaling: the history's reduced amax, with the margin (1.0 where none: _good_reduced)
        amax = tl.load(src[0] + T)
        scale = tl.where((amax > 0) & (amax < float("inf")), _t_pow2(amax, consts[0], consts[1], consts[2]), 1.0)
    elif MODE == 2:
        scale = tl.load(src[0] + T)
    else:
        scale = tl.math.div_rn(1.0, tl.load(src[0] + T))
    if MODE < 2:  # noqa: SIM102  (MODE is static, b is not)
        if b == 0:
            tl.store(info + T, tl.math.div_rn(1.0, scale))
            if MODE == 0:
                tl.store(info + 3 + T, amax)
            if T == 0:
                tl.store(info + 6, consts[3])
            if T == 2:  # O's scale: V's times the dropout headroom consts[4]
                tl.store(info + 7, tl.math.div_rn(1.0, scale * consts[4]))
                tl.store(info + 8, scale * consts[4])
    return scale


def _t_cast_one(io, b, T: tl.constexpr, scaling, MODE: tl.constexpr, RECORD: tl.constexpr,
                BLOCK: tl.constexpr):
    x, y, n = io[0][T], io[1][T], io[2][T]
    src, outs, consts = scaling
    scale = _t_scale_of(T, b, src, outs[0], consts, MODE)
    top = consts[0]
    offs = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    s = v * scale
    s = tl.where(s != s, s,  # noqa: PLR0124  (NaN test)
                  tl.minimum(tl.maximum(s, -top), top))  # saturate, keeping NaN
    tl.store(y + offs, s.to(y.dtype.element_ty), mask=mask)
    if RECORD:
        tl.atomic_max(outs[1] + T, tl.max(tl.abs(v), axis=0), sem="relaxed")


def _k_cast(io, ends, scaling, commit, MODE: tl.constexpr, RECORD: tl.constexpr, COMMIT: tl.constexpr,
            MOST_RECENT: tl.constexpr, LB: tl.constexpr, BLOCK: tl.constexpr):
    # io is (xs, ys, ns): ys[i] = saturate(xs[i] * scale_i) for the programs of tensor i (ends as in
    # _k_amax). scaling is (src, outs, consts): src as _t_scale_of reads it, outs (info, running
    # amax), consts (top, max scale, margin factor, NaN, O's factor). With COMMIT, commit is (history buffer,
    # length, programs): the last program to finish commits the running amax (as _k_commit).
    pid = tl.program_id(0)
    if pid < ends[0]:
        _t_cast_one(io, pid, 0, scaling, MODE, RECORD, BLOCK)
    elif pid < ends[1]:
        _t_cast_one(io, pid - ends[0], 1, scaling, MODE, RECORD, BLOCK)
    else:
        _t_cast_one(io, pid - ends[1], 2, scaling, MODE, RECORD, BLOCK)
    if COMMIT:
        buf, length, programs = commit
        tl.debug_barrier()  # this program's amax folded in before it counts itself done
        count = (buf + (length + 2) * 3).to(tl.pointer_type(tl.int32))
        if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == programs - 1:
            _t_commit(buf, scaling[1][1], scaling[1][0], length, MOST_RECENT, True, LB)
            tl.store(count, 0)


def _k_commit(buf, src, info, length, MOST_RECENT: tl.constexpr, LB: tl.constexpr):
    # A history's first call: its current-scaling amaxes (src, info[3:6]) recorded.
    _t_commit(buf, src, info, length, MOST_RECENT, False, LB)


def _t_commit(buf, src, info, length, MOST_RECENT: tl.constexpr, FROM_CUR: tl.constexpr,
              LB: tl.constexpr):
    # One program: rows shift down one, row 0 = src[0:3], the reduced amax row is updated; with
    # FROM_CUR src is the running amax (read past the L1 cache: other programs folded into it): it
    # is copied to info[3:6] and zeroed.
    cols = tl.arange(0, 4)
    valid = cols < 3
    new = tl.load(src + cols, mask=valid, other=0.0, volatile=True)
    rows = tl.arange(0, LB)[:, None]
    keep = (rows < length - 1) & valid[None, :]
    old = tl.load(buf + rows * 3 + cols[None, :], mask=keep, other=0.0)
    previous = tl.load(buf + length * 3 + cols, mask=valid, other=0.0)
    tl.debug_barrier()  # every load above before any store below (they overlap)
    tl.store(buf + (rows + 1) * 3 + cols[None, :], old, mask=keep)
    tl.store(buf + cols, new, mask=valid)
    if MOST_RECENT:
        reduced = new
    else:
        reduced = tl.maximum(tl.max(old, axis=0), new)
    # An amax of 0 or not finite keeps the previous reduced amax (_good_reduced, TransformerEngine's rule).
    good = (reduced > 0) & (reduced < float("inf"))
    tl.store(buf + length * 3 + cols, tl.where(good, reduced, previous), mask=valid)
    if FROM_CUR:
        tl.store(info + 3 + cols, new, mask=valid)
        tl.store(src + cols, tl.zeros([4], dtype=tl.float32), mask=valid)


def _k_dequant(x, y, n, descale, top, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32) * tl.load(descale)
    v = tl.where(v != v, v, tl.minimum(tl.maximum(v, -top), top))  # noqa: PLR0124  (y's finite range, keeping NaN)
    tl.store(y + offs, v.to(y.dtype.element_ty), mask=mask)
