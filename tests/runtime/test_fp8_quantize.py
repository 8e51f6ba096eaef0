"""FP8 quantization on the CPU (the torch fallback of runtime/fp8_kernels.py): current and delayed
scaling, power-of-two saturating scales, dequantization, the state vector, argument checks."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.errors import ConfigError
from fusedattn_select.runtime import fp8_kernels as fp8k
from fusedattn_select.runtime.run_settings import run_settings
from fusedattn_select.runtime.fp8 import STATE, FP8History, dequantize, pow2_scale, quantize_qkv

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
BF16, FP16 = torch.bfloat16, torch.float16
AT = {name: i for i, name in enumerate(STATE)}


@pytest.fixture(autouse=True)
def _fresh_backend(monkeypatch):
    """After each test the kernel implementation is the environment's choice again."""
    yield
    monkeypatch.undo()  # the test's environment first
    run_settings.reread()
    fp8k.backend(refresh=True)


def _bhsd(b, h, s, d, layout="bshd", dtype=BF16, scale=1.0, seed=0):
    """A logical (B, H, S, D) view of memory in `layout`'s order, values ~ N(0, scale)."""
    gen = torch.Generator().manual_seed(seed)
    order = {"bshd": (b, s, h, d), "sbhd": (s, b, h, d), "bhsd": (b, h, s, d)}[layout]
    back = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}[layout]
    return (torch.randn(order, generator=gen) * scale).to(dtype).permute(back)


def _bytes(t):
    return t.contiguous().view(torch.uint8)


def _is_pow2(values):
    mantissa, _ = torch.frexp(values)
    return bool((mantissa == 0.5).all())


# ----- current scaling ---------------------------------------------------------------------------
def test_round_trip_is_exact_for_representable_values():
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 256, (2, 3, 5, 8), generator=gen, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x38  # no NaN codes (0x7F, 0xFF): 0x38 is 1.0
    grid = codes.view(E4M3).float()
    grid[0, 0, 0, 0] = 448.0  # the amax lands on the fp8 maximum exactly
    for shift in (-6, 0, 5):
        x = (grid * 2.0 ** shift).to(BF16)
        q8, _, v8, state = quantize_qkv(x, x, x, E4M3)
        assert state[AT["descale_q"]].item() == 2.0 ** shift
        assert torch.equal(q8.float(), grid)
        assert torch.equal(dequantize(q8, state[0:1], BF16), x)
        assert torch.equal(dequantize(v8, state[2:3], torch.float32), x.float())


def test_scales_are_largest_powers_of_two_in_range():
    q = _bhsd(2, 4, 16, 8, scale=3.0)
    k = _bhsd(2, 2, 16, 8, scale=700.0, seed=1)
    v = _bhsd(2, 2, 16, 8, scale=1e-3, seed=2)
    q8, k8, v8, state = quantize_qkv(q, k, v, E4M3)
    for i, (x, x8) in enumerate(((q, q8), (k, k8), (v, v8))):
        amax = x.float().abs().max()
        assert state[AT["amax_q"] + i].item() == amax.item()
        scale = 1.0 / state[i]
        assert _is_pow2(scale.reshape(1))
        assert amax * scale <= 448.0 < amax * scale * 2
        assert x8.float().abs().max() <= 448.0
        assert x8.stride() == x.stride()  # cuDNN sees the caller's layout


def test_pow2_scale_matches_the_definition():
    amax = torch.tensor([1e-30, 0.3, 1.0, 1.75, 447.9, 448.0, 448.1, 3e4, 6e4])
    for fp8_dtype, top in ((E4M3, 448.0), (E5M2, 57344.0)):
        scale = pow2_scale(amax, fp8_dtype)
        assert _is_pow2(scale)
        want = [2.0 ** math.floor(math.log2(top / a)) for a in amax.double().tolist()]
        assert scale.tolist() == [min(w, 2.0 ** 100) for w in want]
    assert pow2_scale(torch.tensor([0.0]), E4M3).item() == 2.0 ** 100  # amax 0: the largest scale
    assert pow2_scale(torch.tensor([1.0]), E4M3, limit=128.0).item() == 128.0


def test_fp16_scale_is_clamped_to_what_fp16_holds():
    tiny = (torch.ones(1, 2, 4, 8) * 1e-6).to(FP16)
    q8, _, _, state = quantize_qkv(tiny, tiny, tiny, E4M3)
    assert state[0].item() == 2.0 ** -15
    assert torch.equal(q8.float(), (tiny.float() * 2.0 ** 15).to(E4M3).float())


def test_vnorm_is_nan_unless_training():
    q, k, v = _bhsd(2, 4, 8, 16), _bhsd(2, 2, 8, 16, seed=1), _bhsd(2, 2, 8, 16, seed=2)
    state = quantize_qkv(q, k, v, E4M3)[3]
    assert math.isnan(state[AT["vnorm"]].item())
    # O (an FP8 of V's dtype) takes V's scale: |O| <= the largest value V's FP8 copy holds
    assert state[AT["descale_o"]].item() == state[AT["descale_v"]].item()
    assert state[AT["scale_o"]].item() * state[AT["descale_v"]].item() == 1.0
    state = quantize_qkv(q, k, v, E4M3, training=True)[3]
    want = v.float().norm(dim=-1).max().item()
    assert state[AT["vnorm"]].item() == pytest.approx(want, rel=1e-6)


def test_e5m2_and_layouts_keep_strides_and_values():
    for layout in ("bshd", "sbhd", "bhsd"):
        x = _bhsd(3, 5, 7, 9, layout=layout, scale=20.0)
        x8, _, _, state = quantize_qkv(x, x, x, E5M2)
        assert x8.stride() == x.stride() and x8.dtype == E5M2
        want = (x.float() / state[0]).clamp(-57344, 57344).to(E5M2)
        assert torch.equal(_bytes(x8), _bytes(want))


# ----- kernels' fallbacks ------------------------------------------------------------------------
def test_scaled_cast_saturates_inverts_and_records_amax():
    x = torch.tensor([1.0, -3.0, 500.0, -1000.0, 0.0]).to(BF16)
    scale = torch.tensor([2.0])
    got = fp8k.scaled_cast(x, scale, E4M3)
    assert got.float().tolist() == [2.0, -6.0, 448.0, -448.0, 0.0]
    amax = torch.tensor([10.0])
    got = fp8k.scaled_cast(x, torch.tensor([0.5]), E4M3, inverse=True, amax_out=amax)
    assert got.float().tolist() == [2.0, -6.0, 448.0, -448.0, 0.0]
    assert amax.item() == 1000.0


def test_dequantize_computes_in_float32_and_keeps_strides():
    x8 = _bhsd(2, 3, 4, 8, layout="sbhd", scale=10.0).to(E4M3)
    descale = torch.tensor([2.0 ** 20])
    got = dequantize(x8, descale, FP16)
    assert got.stride() == x8.stride()
    want = (x8.float() * 2.0 ** 20).clamp(-65504, 65504).to(FP16)
    assert torch.equal(got, want)  # fp16's largest value where it overflows, never inf or NaN
    assert not got.isnan().any()


def test_amax_of_several_tensors():
    xs = [_bhsd(1, 2, 3, 4, scale=s, seed=i) for i, s in enumerate((1.0, 50.0, 0.01))]
    got = fp8k.amax(xs)
    assert got.dtype == torch.float32
    assert got.tolist() == [x.float().abs().max().item() for x in xs]


# ----- delayed scaling ---------------------------------------------------------------------------
def _qkv(mult, seed=0):
    return (_bhsd(2, 4, 8, 16, scale=mult[0], seed=seed), _bhsd(2, 2, 8, 16, scale=mult[1], seed=seed + 1),
            _bhsd(2, 2, 8, 16, scale=mult[2], seed=seed + 2))


def _amaxes(tensors):
    return [t.float().abs().max().item() for t in tensors]


def test_first_call_with_empty_history_is_current_scaling():
    q, k, v = _qkv((2.0, 30.0, 0.5))
    plain = quantize_qkv(q, k, v, E4M3)
    hist = FP8History()
    assert hist.amax_history is None
    recorded = quantize_qkv(q, k, v, E4M3, history=hist)
    for a, b in zip(plain[:3], recorded[:3]):
        assert torch.equal(_bytes(a), _bytes(b))
    assert torch.equal(plain[3][:6], recorded[3][:6])
    assert hist.amax_history.shape == (16, 3)
    assert hist.amax_history[0].tolist() == _amaxes((q, k, v))
    assert not hist.amax_history[1:].any()


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scales_come_from_the_history_and_it_rolls(algo):
    hist = FP8History(length=3, algo=algo)
    calls = [_qkv(m, seed=i) for i, m in enumerate(((8.0, 1.0, 1.0), (1.0, 4.0, 1.0), (2.0, 1.0, 9.0),
                                                     (1.0, 1.0, 1.0)))]
    seen = []
    for i, (q, k, v) in enumerate(calls):
        q8, k8, v8, state = quantize_qkv(q, k, v, E4M3, history=hist)
        if i:  # delayed: scaled from what earlier calls recorded
            window = seen[-3:]
            basis = window[-1] if algo == "most_recent" else [max(col) for col in zip(*window)]
            want = pow2_scale(torch.tensor(basis), E4M3)
            assert state[:3].tolist() == want.reciprocal().tolist()
            for x, x8, s in zip((q, k, v), (q8, k8, v8), want):
                expect = (x.float() * s).clamp(-448, 448).to(E4M3)
                assert torch.equal(_bytes(x8), _bytes(expect))
        amax = _amaxes((q, k, v))
        seen.append(amax)
        assert state[3:6].tolist() == amax  # the true amaxes of this call (O's scale, gradient bounds)
        rows = hist.amax_history.tolist()
        assert rows[:len(seen)] == seen[::-1][:3]
    assert hist.calls == 4


def test_delayed_values_beyond_the_scale_saturate():
    hist = FP8History(length=2)
    quantize_qkv(*_qkv((1.0, 1.0, 1.0)), E4M3, history=hist)
    q, k, v = _qkv((100.0, 1.0, 1.0), seed=5)
    q8, _, _, state = quantize_qkv(q, k, v, E4M3, history=hist)
    assert q8.float().abs().max().item() == 448.0
    assert not q8.float().isnan().any()
    assert state[AT["amax_q"]].item() == q.float().abs().max().item()


def test_margin_divides_the_delayed_scale():
    q, k, v = _qkv((3.0, 3.0, 3.0))
    plain, margined = FP8History(margin=0), FP8History(margin=2)
    for hist in (plain, margined):
        quantize_qkv(q, k, v, E4M3, history=hist)
    s0 = quantize_qkv(q, k, v, E4M3, history=plain)[3][:3]
    s2 = quantize_qkv(q, k, v, E4M3, history=margined)[3][:3]
    assert torch.equal(s2, s0 * 4)  # descales: 2**margin larger


def test_reset_and_device_checks():
    hist = FP8History(length=2)
    quantize_qkv(*_qkv((5.0, 1.0, 1.0)), E4M3, history=hist)
    hist.reset()
    assert hist.calls == 0 and not hist.amax_history.any()
    q, k, v = _qkv((1.0, 1.0, 1.0))
    assert torch.equal(quantize_qkv(q, k, v, E4M3, history=hist)[3][:6], quantize_qkv(q, k, v, E4M3)[3][:6])
    assert "length=2" in repr(hist)


@pytest.mark.parametrize("kwargs, field", [
    ({"length": 0}, "FP8History.length"), ({"length": 5000}, "FP8History.length"),
    ({"length": True}, "FP8History.length"), ({"length": 2.0}, "FP8History.length"),
    ({"algo": "mean"}, "FP8History.algo"), ({"margin": -1}, "FP8History.margin"),
    ({"margin": 1.5}, "FP8History.margin"), ({"margin": 65}, "FP8History.margin"),
])
def test_history_arguments_are_checked(kwargs, field):
    with pytest.raises(ConfigError) as err:
        FP8History(**kwargs)
    assert err.value.field == field
    assert field in str(err.value)


# ----- implementation choice ---------------------------------------------------------------------
def test_env_var_is_validated(monkeypatch):
    monkeypatch.setenv(fp8k.ENV_VAR, "cuda")
    with pytest.raises(ValueError) as err:
        fp8k.backend(refresh=True)
    message = str(err.value)
    assert fp8k.ENV_VAR in message and "'cuda'" in message
    assert all(choice in message for choice in ("auto", "triton", "torch"))


def test_env_var_torch_and_auto(monkeypatch):
    monkeypatch.setenv(fp8k.ENV_VAR, " Torch ")
    assert fp8k.backend(refresh=True) == "torch"
    monkeypatch.delenv(fp8k.ENV_VAR)
    run_settings.reread()  # the runtime reads its settings once
    assert fp8k.configured_choice() == "auto"
    try:
        import triton  # noqa: F401
    except ImportError:
        assert fp8k.backend(refresh=True) == "torch"
        monkeypatch.setenv(fp8k.ENV_VAR, "triton")
        run_settings.reread()
        with pytest.raises(RuntimeError, match=fp8k.ENV_VAR):
            fp8k.backend(refresh=True)
    else:
        assert fp8k.backend(refresh=True) == "triton"
    assert not fp8k.uses_triton(torch.zeros(4))  # CPU tensors always take the fallback


def test_training_with_fp8_gradients_says_why_it_runs_the_bf16_backward(caplog):
    # Gradients written in FP8 take scales from worst-case bounds: dispatch runs the bf16 backward
    # (runtime/fp8_training.route_backward); where the gradients are 16-bit there is no reason.
    import logging

    from fusedattn_select.config import AttnConfig
    from fusedattn_select.runtime import fp8
    from fusedattn_select.runtime.dispatcher import dispatcher

    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    dispatcher.told.discard(fp8.BOUND_SCALED_GRADIENTS)
    shape = {"batch_size": 2, "num_heads_q": 8, "num_heads_kv": 2, "seqlen_q": 512, "seqlen_kv": 512,
             "head_dim_qk": 128, "mask": "causal"}
    delayed = AttnConfig(qkv_dtype="fp8_e4m3", **shape)  # O and the gradients in e4m3
    assert delayed.resolved_dqkv_dtype == "fp8_e4m3"
    assert "dK its precision" in fp8.bound_scaled_gradients(delayed)
    fp8.tell_bound_scaled_gradients()
    fp8.tell_bound_scaled_gradients()  # said once per process
    logged = [r.getMessage() for r in caplog.records if "bf16 backward" in r.getMessage()]
    assert len(logged) == 1 and "seqlen_q x query heads per KV head" in logged[0]
    sixteen_bit = AttnConfig(qkv_dtype="fp8_e4m3", o_dtype="bf16", dqkv_dtype="bf16", **shape)
    assert fp8.bound_scaled_gradients(sixteen_bit) == ""
