"""The compiled FP8 forward's logic on CPU: where each of a graph's tensors comes from in a call's
buffers, and that without a built module it declines a call untouched (the general path runs it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime import fp8 as fp8q  # noqa: E402
from fusedattn_select.runtime.native import fp8_plan  # noqa: E402

E4M3 = torch.float8_e4m3fn
ORDER = ("q", "k", "v", "descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o", "o", "amax_s",
         "amax_o")


class _Spec:
    def __init__(self, dtype):
        self.dtype = dtype


class _Plan:
    def __init__(self, order=ORDER, o_dtype=E4M3):
        self.order, self.specs, self.derived = order, {"o": _Spec(o_dtype)}, {}

    def constant(self, name, value):
        return torch.full((1,), value)


def _state(name):
    return fp8_plan._STATE_AT + fp8q.STATE.index(name)


def test_fp8_graph_tensors_come_from_the_calls_buffers_state_and_constants():
    positions, constants = fp8_plan._call_index(_Plan())
    first = fp8_plan._CONSTANTS_AT
    assert positions == [0, 1, 2, _state("descale_q"), _state("descale_k"), _state("descale_v"), first, first + 1,
                         _state("scale_o"), 3, _state("amax_s"), _state("amax_o")]
    assert [c.item() for c in constants] == [1.0 / fp8q.S_SCALE, fp8q.S_SCALE]


def test_a_graph_with_bf16_output_is_fed_a_unit_output_scale():
    positions, constants = fp8_plan._call_index(_Plan(o_dtype=torch.bfloat16))
    assert positions[ORDER.index("scale_o")] == fp8_plan._CONSTANTS_AT + 2 and constants[2].item() == 1.0


def test_a_graph_reading_anything_else_is_left_to_the_general_path():
    assert fp8_plan._call_index(_Plan(order=ORDER + ("bias",))) is None


def test_without_a_module_a_call_is_declined_and_its_history_untouched(monkeypatch):
    monkeypatch.setattr(fp8_plan.native, "load", lambda: None)

    class Options:
        layout, fp8, training = "bshd", True, False

    class Entry:
        opts, forward, bucketed, rng = Options(), _Plan(), False, None

    history = fp8q.FP8History()
    q = torch.zeros(1, 8, 2, 16, dtype=torch.bfloat16)
    assert fp8_plan.forward(Entry(), q, q, q, history) is None
    assert history.calls == 0


def test_each_call_geometry_and_precision_is_judged_on_its_own(monkeypatch):
    """Entries that share a forward plan (other strides, say a non-dense q the general path copies,
    or fp16 against bf16) each get their own decision, made once; nothing is kept without a module."""
    made = []

    def make(module, entry, q, k, v, o_dtype):
        made.append((q.dtype, q.stride()))
        return None if q.stride()[1] == 0 else "plan"

    class Options:
        layout = "bshd"

    class Entry:
        opts, forward = Options(), _Plan()

    entry = Entry()
    monkeypatch.setattr(fp8_plan, "_make", make)
    dense = torch.zeros(1, 8, 2, 16, dtype=torch.bfloat16)
    monkeypatch.setattr(fp8_plan.native, "load", lambda: None)
    assert fp8_plan._plan(entry, dense, dense, dense, dense.dtype) is None and made == []
    monkeypatch.setattr(fp8_plan.native, "load", lambda: "module")
    broadcast = torch.zeros(1, 1, 2, 16, dtype=torch.bfloat16).expand(1, 8, 2, 16)
    for q in (dense, dense, broadcast, dense.half(), broadcast):
        fp8_plan._plan(entry, q, dense, dense, q.dtype)
    assert made == [(torch.bfloat16, dense.stride()), (torch.bfloat16, broadcast.stride()),
                    (torch.float16, dense.stride())]
    assert fp8_plan._plan(entry, dense, dense, dense, dense.dtype) == "plan"
    assert fp8_plan._plan(entry, broadcast, dense, dense, dense.dtype) is None
