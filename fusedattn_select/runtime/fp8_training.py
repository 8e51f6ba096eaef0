"""Which backward FP8 training from fp16/bf16 inputs runs: the FP8 graph, or the graph in the inputs'
precision behind the FP8 forward. Decided once per call signature, when its entry is made."""

from __future__ import annotations

import logging
from collections.abc import Collection

import torch

from fusedattn_select.config import AttnConfig
from fusedattn_select.planning.planner import with_fp8_outputs
from fusedattn_select.runtime import fp8 as fp8q
from fusedattn_select.runtime.args import F16_NAMES
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.selection import fp8_speed
from fusedattn_select.selection.rules import apply_rules
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Backend, Phase

log = logging.getLogger("fusedattn_select")

FP8_BACKWARD_REFUSED = "fp8=True training runs the FP8 forward and the {dtype} backward: the FP8 backward is not selected"


def _f16(cfg: AttnConfig, input_dtype: torch.dtype) -> AttnConfig:
    """The problem in the inputs' precision, which the backward runs in when the FP8 one does not."""
    return cfg.replace(qkv_dtype=F16_NAMES[input_dtype], o_dtype=None, do_dtype=None, dqkv_dtype=None,
                       scaling_mode=None)


def route_backward(new, selector: Selector, input_dtype: torch.dtype) -> str:
    """FP8 from fp16/bf16 inputs: say once where its forward was measured no faster than bf16 here; in training,
    give the entry the backward in the input precision (where selected) where the FP8 one was measured slower
    or writes FP8 gradients. Returns why it cannot run fused (FP8 gradients, no such backward), else ""."""
    cfg = new.cfg
    if not (cfg.is_fp8 and input_dtype in F16_NAMES) or new.backward_cfg is not None:
        return ""
    fp8_speed.forward_note(selector.fingerprint)
    record = fp8_speed.record_for(selector.fingerprint)
    bounded = fp8q.bound_scaled_gradients(cfg) if cfg.is_training else ""
    if not (bounded or cfg.is_training and record is not None and record.backward_slower):
        return ""
    f16 = _f16(cfg, input_dtype)
    if not selector.select_dense(f16).selected:
        return f"fp8=True training: {bounded}, and the backward in {f16.qkv_dtype} is not selected" if bounded else ""
    new.backward_cfg = f16
    if not fp8_speed.f16_backward_reason(selector.fingerprint):  # says why, once per process
        fp8q.tell_bound_scaled_gradients()
    return ""


def forward_only(new, selector: Selector, input_dtype: torch.dtype, dense: bool, runners: Collection[Backend]) -> str:
    """FP8 training from fp16/bf16 inputs that no FP8 recipe answers (FP8 backward refused by cuDNN or a rule):
    route the entry (cfg, selection, backward_cfg) to the FP8 forward and the backward in the inputs' precision,
    where both are selected. Returns the refusal it replaced, or "" (entry unchanged); then call tell_forward_only
    once its plans are built."""
    cfg = new.cfg
    if not (cfg.is_training and cfg.is_fp8 and input_dtype in F16_NAMES):
        return ""
    f16 = _f16(cfg, input_dtype)
    if not selector.select_dense(f16).selected:
        return ""
    inference = cfg.replace(is_training=False, do_dtype=None, dqkv_dtype=None)
    first = selector.select_dense(inference) if dense else selector.select_own(inference)
    chosen, selection, _ = with_fp8_outputs(selector.select, inference, first, False)
    if not selection.selected or selection.backend not in runners:
        return ""
    # The forward runs as training's (it writes the stats the backward reads), built from the training problem
    # at the selected output precision and not probed (runtime/dense_builds.plan_phases), so check its rules here.
    training = chosen.replace(is_training=True)
    if apply_rules(training, selector.fingerprint, Phase.FORWARD) is not None:
        return ""
    fp8_speed.forward_note(selector.fingerprint)
    refused = new.reason or "no FP8 recipe of the training problem is selected"
    new.cfg, new.selection, new.backward_cfg, new.reason = training, selection, f16, ""
    return refused


def tell_forward_only(new, refused: str) -> None:
    """Log, once per process, that FP8 training runs the FP8 forward with the backward in the inputs'
    precision because `refused` (forward_only's answer); call once the entry's plans are built."""
    note = FP8_BACKWARD_REFUSED.format(dtype=new.backward_cfg.qkv_dtype)
    if dispatcher.first_time(note):
        log.warning("fusedattn_select: %s (%s)", note, refused)
