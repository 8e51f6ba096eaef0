"""Where attention(fp8=True) training runs its backward in the inputs' precision
(runtime/fp8_training), decided on the CPU with a stub selector: no cuDNN involved."""

from __future__ import annotations

import logging
import types

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.config import AttnConfig
from fusedattn_select.runtime import fp8, fp8_training
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.types import Backend, Fingerprint

SHAPE = {"batch_size": 2, "num_heads_q": 8, "num_heads_kv": 2, "seqlen_q": 512, "seqlen_kv": 512,
         "head_dim_qk": 128, "mask": "causal"}
FP8_GRADIENTS = {"qkv_dtype": "fp8_e4m3"}  # delayed scaling: O, dQ, dK, dV in e4m3
SIXTEEN_BIT_GRADIENTS = {"qkv_dtype": "fp8_e4m3", "o_dtype": "bf16", "dqkv_dtype": "bf16"}


class StubSelector:
    """A platform without an FP8 speed record whose bf16 backward is or is not selected."""

    def __init__(self, bf16_selected: bool):
        self.fingerprint = Fingerprint("cpu")
        self.bf16_selected, self.asked = bf16_selected, []

    def select_dense(self, cfg):
        self.asked.append(cfg)
        return types.SimpleNamespace(selected=self.bf16_selected)


def _route(input_dtype=torch.bfloat16, bf16_selected=True, **fields):
    new = types.SimpleNamespace(cfg=AttnConfig(**{**SHAPE, **fields}), backward_cfg=None)
    selector = StubSelector(bf16_selected)
    return fp8_training.route_backward(new, selector, input_dtype), new, selector


REFUSED_NOTE = fp8_training.FP8_BACKWARD_REFUSED.format(dtype="bf16")


@pytest.fixture(autouse=True)
def _said_once_per_test():
    for note in (fp8.BOUND_SCALED_GRADIENTS, REFUSED_NOTE):
        dispatcher.told.discard(note)
    yield
    for note in (fp8.BOUND_SCALED_GRADIENTS, REFUSED_NOTE):
        dispatcher.told.discard(note)


def test_training_with_fp8_gradients_runs_the_backward_in_the_inputs_precision(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    why, new, _ = _route(**FP8_GRADIENTS)
    assert why == "" and new.backward_cfg is not None
    assert (new.backward_cfg.qkv_dtype, new.backward_cfg.dqkv_dtype, new.backward_cfg.scaling_mode) == ("bf16", None, None)
    assert new.backward_cfg.num_heads_kv == 2 and new.backward_cfg.mask == "causal"  # the same problem, in bf16
    assert [r.getMessage() for r in caplog.records if "the bf16 backward" in r.getMessage()]


def test_no_bf16_backward_means_no_fused_fp8_training_rather_than_bound_scaled_gradients(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    why, new, _ = _route(bf16_selected=False, **FP8_GRADIENTS)
    assert new.backward_cfg is None
    assert why.startswith("fp8=True training: its FP8 gradients would be scaled from worst-case bounds")
    assert why.endswith("the backward in bf16 is not selected")
    assert not [r for r in caplog.records if "the bf16 backward" in r.getMessage()]  # nothing routed: not said


@pytest.mark.parametrize("case, kwargs", [
    ("inference", dict(is_training=False, **FP8_GRADIENTS)),
    ("16-bit gradients, no speed record", SIXTEEN_BIT_GRADIENTS),
    ("float8 inputs", dict(input_dtype=torch.float8_e4m3fn, **FP8_GRADIENTS)),
    ("not FP8", {"qkv_dtype": "bf16"}),
])
def test_nothing_to_route_asks_nothing(case, kwargs):
    why, new, selector = _route(**kwargs)
    assert why == "" and new.backward_cfg is None and selector.asked == [], case


# ----- FP8 training whose FP8 backward no recipe answers: the FP8 forward, the backward in bf16 ---------
class RefusingSelector:
    """A platform whose FP8 backward is refused (every FP8 training problem NONE) while its FP8 forward
    (with an FP8 output) and its bf16 problems are selected, as cuDNN 9.19 on Hopper answers a GQA
    problem with FP8 gradients; `forward` / `bf16` False refuse those too."""

    def __init__(self, forward: bool = True, bf16: bool = True):
        self.fingerprint = Fingerprint("cpu")
        self.forward, self.bf16, self.asked = forward, bf16, []

    def select(self, cfg):
        self.asked.append(cfg)
        if not cfg.is_fp8:
            ok = self.bf16
        else:  # a Hopper-like FP8 forward writes an FP8 O only
            ok = self.forward and not cfg.is_training and cfg.resolved_o_dtype.startswith("fp8")
        backend = (Backend.FP8 if cfg.is_fp8 else Backend.F16) if ok else Backend.NONE
        return types.SimpleNamespace(selected=ok, backend=backend, message="" if ok else "refused (stub)")

    select_dense = select_own = select


def _forward_only(selector, input_dtype=torch.bfloat16, runners=(Backend.F16, Backend.FP8), **fields):
    cfg = AttnConfig(**{**SHAPE, "qkv_dtype": "fp8_e4m3", "scaling_mode": "current", **fields})
    new = types.SimpleNamespace(cfg=cfg, selection=None, backward_cfg=None, reason="FP8 backward refused (stub)")
    return fp8_training.forward_only(new, selector, input_dtype, False, runners), new


def test_a_refused_fp8_backward_runs_the_fp8_forward_and_the_bf16_backward(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    refused, new = _forward_only(RefusingSelector())
    assert refused == "FP8 backward refused (stub)" and new.reason == "" and new.selection.selected
    assert new.cfg.is_training and new.cfg.qkv_dtype == "fp8_e4m3" and new.cfg.resolved_o_dtype == "fp8_e4m3"
    assert (new.backward_cfg.qkv_dtype, new.backward_cfg.is_training, new.backward_cfg.num_heads_kv) == ("bf16", True, 2)
    # Said by tell_forward_only once the plans are built (dispatch calls it then), once per process.
    assert not [r for r in caplog.records if REFUSED_NOTE in r.getMessage()]
    fp8_training.tell_forward_only(new, refused)
    fp8_training.tell_forward_only(new, refused)
    said = [r.getMessage() for r in caplog.records if REFUSED_NOTE in r.getMessage()]
    assert len(said) == 1 and "FP8 backward refused (stub)" in said[0]


@pytest.mark.parametrize("case, selector, kwargs", [
    ("no FP8 forward", RefusingSelector(forward=False), {}),
    ("no bf16 backward", RefusingSelector(bf16=False), {}),
    ("no runner for the forward's backend", RefusingSelector(), dict(runners=(Backend.F16,))),
    ("float8 inputs", RefusingSelector(), dict(input_dtype=torch.float8_e4m3fn)),
    ("inference", RefusingSelector(), dict(is_training=False)),
])
def test_nothing_runs_when_a_part_is_missing_and_the_reason_stays(case, selector, kwargs):
    refused, new = _forward_only(selector, **kwargs)
    assert refused == "" and new.backward_cfg is None and new.reason == "FP8 backward refused (stub)", case
