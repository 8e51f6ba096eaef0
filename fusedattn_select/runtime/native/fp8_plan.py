"""The compiled FP8 forward: an FP8 inference call (`fp8=True`, or an `FP8History`) quantized, run
and converted back from C++ (lean.cpp's Fp8Plan, fp8.cu's kernels), with the bytes, FP8 state and
history updates of runtime/fp8.py's path, at a fraction of its host time.

It takes an entry whose forward plan reads q, k, v and the FP8 scales and writes O and the two amaxes
(no masks' lengths, bias, sink or dropout), inputs in fp16 or bf16 whose memory is dense, e4m3 q, k,
v and O. Anything else, no module built, or FUSEDATTN_SELECT_FP8_KERNELS=torch returns None: the
general path runs the call.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from fusedattn_select.runtime import fp8 as fp8q
from fusedattn_select.runtime import fp8_kernels as fp8k
from fusedattn_select.runtime import native
from fusedattn_select.runtime.layouts import bhsd
from fusedattn_select.runtime.lean import caller_geometry, same_memory

E4M3 = torch.float8_e4m3fn
# A call's buffers: q8, k8, v8, o8, the FP8 state's entries (fp8.STATE), then the plan's constants.
_STATE_AT = 4
_CONSTANTS_AT = _STATE_AT + len(fp8q.STATE)
# The graph's scale inputs fed a constant (fp8.forward_feeds: S is scaled by S_SCALE inside).
_CONSTANTS = {"scale_s": fp8q.S_SCALE, "descale_s": 1.0 / fp8q.S_SCALE}


def forward(entry: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            history: Optional[fp8q.FP8History]) -> Optional[Any]:
    """The output of an FP8 inference call run by the compiled module (an FP8Tensor where the
    history asks for FP8 output), or None where it cannot run it."""
    o_dtype = getattr(history, "o_dtype", None) or q.dtype
    plan = _plan(entry, q, k, v, o_dtype)
    if plan is None:
        return None
    if history is None:
        out, state = plan(q, k, v, None, 0, 1.0, False, False)
    else:
        taken = history.take(q.device)
        out, state = plan(q, k, v, taken.buf, taken.length, 2.0 ** -taken.margin, taken.most_recent, taken.fresh)
    if fp8q.is_fp8_dtype(o_dtype):
        return fp8q.FP8Tensor(out, fp8q.at(state, "descale_o"))
    return out


def _plan(entry: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o_dtype: torch.dtype) -> Optional[Any]:
    """The Fp8Plan of a call, or None. Made once per forward plan and call geometry: entries of
    other strides (a non-dense q, say, which the general path copies) or input precision share the
    plan, and each is checked on its own. Nothing is kept while no module is loaded."""
    module = native.load()
    if module is None or entry.forward is None:
        return None
    key = ("fp8-native", entry.opts.layout, o_dtype, q.dtype, q.stride(), k.stride(), v.stride())
    derived = entry.forward.derived
    if key not in derived:
        derived[key] = _make(module, entry, q, k, v, o_dtype)
    return derived[key]


def _call_index(plan: Any) -> Optional[tuple[list[int], list[torch.Tensor]]]:
    """(the call position of each of the plan's tensors, the constants it reads), or None where it
    reads something else."""
    positions, constants = [], []
    fp8_o = fp8q.is_fp8_dtype(plan.specs["o"].dtype)
    for name in plan.order:
        if name in ("q", "k", "v", "o"):
            positions.append(("q", "k", "v", "o").index(name))
        elif name in ("descale_q", "descale_k", "descale_v", "amax_s", "amax_o") or (name == "scale_o" and fp8_o):
            positions.append(_STATE_AT + fp8q.STATE.index(name))
        elif name in _CONSTANTS or name == "scale_o":
            positions.append(_CONSTANTS_AT + len(constants))
            constants.append(plan.constant(name, _CONSTANTS.get(name, 1.0)))
        else:
            return None
    return positions, constants


def _make(module: Any, entry: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          o_dtype: torch.dtype) -> Optional[Any]:
    opts, plan = entry.opts, entry.forward
    if (not opts.fp8 or opts.training or entry.bucketed or entry.rng is not None or fp8k.configured_choice() == "torch"
            or plan is None or plan.specs["q"].dtype != E4M3 or plan.specs["o"].dtype != E4M3
            or q.dtype not in (torch.float16, torch.bfloat16) or o_dtype not in (q.dtype, E4M3)
            or not q.is_cuda or not fp8k._device_info(q.device)[0]):
        return None
    for name, t in zip("qkv", (q, k, v)):
        tb, spec = bhsd(t, opts.layout), plan.specs[name]
        if not (fp8k._dense(t) and tuple(tb.shape) == spec.dims and same_memory(spec.dims, spec.strides, tb.stride())):
            return None
    index = _call_index(plan)
    if index is None:
        return None
    positions, constants = index
    graph = native.graph(module, plan, tuple(positions))
    if graph is None:
        return None
    shape, strides = caller_geometry(plan.specs["o"], opts.layout)
    sms = fp8k._device_info(q.device)[1]
    max_scale = fp8k.MAX_SCALE.get(q.dtype, 2.0 ** 100)
    return module.Fp8Plan(graph, list(shape), list(strides), o_dtype, constants, fp8k.FP8_MAX[E4M3], max_scale, sms)
