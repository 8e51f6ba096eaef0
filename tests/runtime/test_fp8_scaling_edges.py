"""FP8 scale arithmetic at its edges on the CPU (the torch fallback of runtime/fp8_kernels.py): delayed
scaling after an amax of 0 or not finite, O's scale under dropout, fp16 dequantization at its largest
value. The Triton kernels' agreement with it: tests/gpu/test_fp8_kernels.py."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime import fp8_kernels as fp8k  # noqa: E402
from fusedattn_select.runtime.fp8 import (FP8History, FP8Scales, at, dequantize, dropout_headroom,  # noqa: E402
                                          explicit_state, pow2_scale, quantize_qkv)
from fusedattn_select.runtime.run_settings import run_settings  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
BF16, FP16 = torch.bfloat16, torch.float16


@pytest.fixture(autouse=True)
def _fresh_backend(monkeypatch):
    yield
    monkeypatch.undo()
    run_settings.reread()
    fp8k.backend(refresh=True)


def _t(scale=1.0, seed=0, shape=(1, 2, 8, 16), dtype=BF16):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def _rel_err(x8, state, index, want):
    back = dequantize(x8, state[index:index + 1], torch.float32)
    return float((back - want.float()).norm() / want.float().norm())


# ----- delayed scaling after an amax of 0 or not finite (TransformerEngine keeps the previous scale) ----
@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_a_zero_first_amax_gives_the_next_call_scale_one_not_a_huge_one(algo):
    hist = FP8History(length=4, algo=algo)
    q, k = _t(seed=1), _t(seed=2)
    quantize_qkv(q, k, torch.zeros_like(q), E4M3, history=hist)  # V all zeros (a zero-initialised cache)
    v = _t(3.0, seed=3)
    _, _, v8, state = quantize_qkv(q, k, v, E4M3, history=hist)
    assert float(state[2]) == 1.0  # descale_v: nothing good recorded yet, TE's initial scale
    assert _rel_err(v8, state, 2, v) < 0.07  # e4m3 rounding, not zeroed (was 1.0 with scale 2**100)
    assert hist.amax_history[1, 2].item() == 0.0  # the zero amax is still recorded as it was


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("bad", [0.0, math.inf, math.nan])
def test_an_amax_of_zero_inf_or_nan_keeps_the_previous_scale(algo, bad):
    hist = FP8History(length=1, algo=algo)
    q, k = _t(seed=1), _t(seed=2)
    quantize_qkv(q, k, _t(2.0, seed=3), E4M3, history=hist)
    quantize_qkv(q, k, _t(2.0, seed=4), E4M3, history=hist)  # delayed: from call 1's amax
    v_bad = torch.full_like(q, bad)
    state3 = quantize_qkv(q, k, v_bad, E4M3, history=hist)[3]  # from call 2's amax
    v = _t(2.0, seed=5)
    _, _, v8, state4 = quantize_qkv(q, k, v, E4M3, history=hist)  # call 3 recorded `bad`: call 3's scale kept
    assert float(state4[2]) == float(state3[2]) and math.isfinite(float(state4[2])) and float(state4[2]) > 0
    assert torch.equal(state4[:2], state3[:2])  # q and k: their good amaxes were recorded
    assert _rel_err(v8, state4, 2, v) < 0.07


def test_an_inf_in_a_max_window_keeps_the_scale_until_it_leaves():
    hist = FP8History(length=2, algo="max")
    q = _t(seed=1)
    quantize_qkv(q, q, _t(2.0, seed=2), E4M3, history=hist)
    before = quantize_qkv(q, q, _t(2.0, seed=3), E4M3, history=hist)[3][2]
    quantize_qkv(q, q, torch.full_like(q, math.inf), E4M3, history=hist)
    during = [quantize_qkv(q, q, _t(8.0, seed=s), E4M3, history=hist)[3][2] for s in (4, 5)]
    assert all(float(d) == float(before) for d in during)  # the window's max is inf: kept
    after = quantize_qkv(q, q, _t(8.0, seed=6), E4M3, history=hist)[3][2]  # the inf has left the window
    assert float(after) == float(pow2_scale(hist.amax_history[1:, 2].amax().reshape(1), E4M3).reciprocal())


# ----- O's scale under dropout ---------------------------------------------------------------------------
@pytest.mark.parametrize("dropout, factor", [(0.0, 1.0), (0.1, 0.5), (0.5, 0.5), (0.6, 0.25), (0.99, 2.0 ** -7)])
def test_dropout_headroom_is_the_power_of_two_below_one_minus_dropout(dropout, factor):
    assert dropout_headroom(dropout) == factor == 2.0 ** math.floor(math.log2(1 - dropout))


@pytest.mark.parametrize("delayed", [False, True])
def test_o_scale_leaves_room_for_dropout(delayed):
    p = 0.1
    history = FP8History(length=2) if delayed else None
    v = torch.randn(1, 1, 64, 16, generator=torch.Generator().manual_seed(0))
    v[0, 0, 5, 0] = 6.9  # amax(V)
    v = v.bfloat16()
    q, k = torch.randn(1, 1, 1, 16).bfloat16(), torch.randn(1, 1, 64, 16).bfloat16()
    if history is not None:
        quantize_qkv(q, k, v, E4M3, history=history)  # the next call is delayed
    plain = quantize_qkv(q, k, v, E4M3, training=True)[3]
    q8, k8, v8, state = quantize_qkv(q, k, v, E4M3, training=True, history=history, dropout=p)
    assert float(at(state, "scale_o")) == float(1 / at(state, "descale_v")) * 0.5
    assert float(at(state, "descale_o")) == float(at(state, "descale_v")) * 2
    assert float(at(plain, "scale_o")) == float(1 / at(plain, "descale_v"))  # no dropout: V's scale
    # A query row attending only to key 5, which dropout keeps: O = V[5] / (1 - p), stored at scale_o.
    o_true = dequantize(v8, at(state, "descale_v"), torch.float32)[0, 0, 5] / (1 - p)
    o_back = dequantize(fp8k.scaled_cast(o_true, at(state, "scale_o"), E4M3), at(state, "descale_o"), torch.float32)
    assert abs(float(o_back[0] - o_true[0])) <= abs(float(o_true[0])) / 16  # e4m3 rounding, not saturation


def test_explicit_state_leaves_room_for_dropout_where_o_is_fp8():
    v8 = (torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(0)) * 50).to(E4M3)
    scales = FP8Scales(*(torch.tensor([0.125]) for _ in range(3)))
    plain = explicit_state(scales, v8, E4M3)
    dropped = explicit_state(scales, v8, E4M3, dropout=0.3)
    assert float(at(dropped, "scale_o")) == float(at(plain, "scale_o")) * 0.5
    assert float(at(dropped, "descale_o")) == float(at(plain, "descale_o")) * 2
    assert float(at(explicit_state(scales, v8, BF16, dropout=0.3), "scale_o")) == 1.0  # unused where O is bf16


# ----- fp16 dequantization at its largest value ------------------------------------------------------------
def test_fp16_dequantization_at_its_largest_value_is_finite():
    x = torch.tensor([[65504.0, 1.0, -65000.0, 3.0]], dtype=FP16)
    (x8,), info = fp8k.quantize([x], E4M3)
    back = dequantize(x8, info[0:1], FP16)
    assert back.tolist() == [[65504.0, 1.0, -65504.0, 3.0]]  # 256 * 2**8 = 65536 is clamped, not inf
    (again,), info2 = fp8k.quantize([back], E4M3)
    assert torch.equal(again.view(torch.uint8), x8.view(torch.uint8)) and torch.equal(info2[:1], info[:1])
    nan8 = torch.tensor([float("nan"), 1.0]).to(E4M3)
    assert dequantize(nan8, torch.tensor([256.0]), FP16).isnan().tolist() == [True, False]
    assert dequantize(x8, info[0:1], BF16).float().tolist() == [[65536.0, 1.0, -65536.0, 3.0]]
