"""Where attention(fp8=True) training runs its backward in the inputs' precision
(runtime/entries._route_fp8_backward), decided on the CPU with a stub selector: no cuDNN involved."""

from __future__ import annotations

import logging
import types

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.config import AttnConfig
from fusedattn_select.runtime import entries, fp8
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.types import Fingerprint

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
    return entries._route_fp8_backward(new, selector, input_dtype), new, selector


@pytest.fixture(autouse=True)
def _said_once_per_test():
    dispatcher.told.discard(fp8.BOUND_SCALED_GRADIENTS)
    yield
    dispatcher.told.discard(fp8.BOUND_SCALED_GRADIENTS)


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
