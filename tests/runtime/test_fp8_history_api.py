"""attention(q, k, v, fp8=FP8History()) on CPU: argument checks, the package's exports, and the
fallback a machine without a GPU runs (in the input precision, no quantization)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import fusedattn_select
from fusedattn_select.errors import ConfigError
from fusedattn_select.runtime import api
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.fp8 import FP8History, FP8Scales

pytestmark = pytest.mark.usefixtures("no_platform")


def _qkv(dtype=torch.bfloat16, grad=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 6, 4, 16, generator=gen).to(dtype)  # bshd, GQA 4/2
    k = torch.randn(2, 10, 2, 16, generator=gen).to(dtype)
    v = torch.randn(2, 10, 2, 16, generator=gen).to(dtype)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def _sdpa(q, k, v, **kw):
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True, **kw)
    return out.transpose(1, 2)


# ----- exports ---------------------------------------------------------------------------------------
def test_fp8_history_and_scales_are_exported_at_the_top_level():
    assert fusedattn_select.FP8History is FP8History
    assert fusedattn_select.FP8Scales is FP8Scales
    assert {"FP8History", "FP8Scales"} <= set(fusedattn_select.__all__)
    from fusedattn_select import FP8History as imported
    assert imported is FP8History


# ----- argument checks -------------------------------------------------------------------------------
def test_fp8_history_with_float32_inputs_is_refused():
    q, k, v = _qkv(torch.float32)
    with pytest.raises(ConfigError, match="fp8") as err:
        api.attention(q, k, v, fp8=FP8History())
    assert err.value.field == "fp8"
    assert "float32" in str(err.value)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_fp8_of_another_type_is_refused_listing_the_allowed_values(bad):
    q, k, v = _qkv()
    with pytest.raises(ConfigError) as err:
        api.attention(q, k, v, fp8=bad)
    assert err.value.field == "fp8" and err.value.value == bad
    for allowed in ("True", "False", "FP8History", "FP8Scales"):
        assert allowed in err.value.allowed


def test_fp8_history_checks_its_own_arguments():
    with pytest.raises(ConfigError, match="FP8History.length"):
        FP8History(length=0)
    with pytest.raises(ConfigError, match="FP8History.algo"):
        FP8History(algo="mean")
    with pytest.raises(ConfigError, match="FP8History.margin"):
        FP8History(margin=True)


# ----- the CPU fallback ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_history_on_cpu_falls_back_in_the_input_precision(dtype):
    q, k, v = _qkv(dtype)
    history = FP8History()
    out = api.attention(q, k, v, mask="causal", fp8=history)
    assert out.shape == q.shape and out.dtype == dtype
    # The fallback computes in the input precision: torch's SDPA result exactly, no FP8 rounding.
    torch.testing.assert_close(out, _sdpa(q, k, v, is_causal=True), rtol=0, atol=0)
    assert history.calls == 0 and history.amax_history is None  # nothing quantized, nothing recorded
    found = [e for e in dispatcher.entries.values()]
    assert len(found) == 1 and not found[0].fused and found[0].opts.fp8 is True


def test_fp8_history_calls_of_one_signature_share_one_decision():
    q, k, v = _qkv()
    first = api.attention(q, k, v, fp8=FP8History())
    second = api.attention(q, k, v, fp8=FP8History(length=4, algo="most_recent"))
    assert dispatcher.counters["entries_built"] == 1
    assert dispatcher.counters["fallback_calls"] == 2
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_fp8_history_calls_are_found_by_their_output_precision_not_the_history():
    import gc
    import weakref

    q, k, v = _qkv()
    history = FP8History()
    alive = weakref.ref(history)
    api.attention(q, k, v, fp8=history)
    api.attention(q, k, v, fp8=FP8History(length=2))
    assert len(dispatcher.by_call) == 1  # one fast-path key for every history of this signature
    api.attention(q, k, v, fp8=FP8History(o_dtype=torch.float8_e4m3fn))
    assert len(dispatcher.by_call) == 2 and dispatcher.counters["entries_built"] == 2
    del history
    gc.collect()
    assert alive() is None  # the tables hold no history


def test_fp8_history_training_on_cpu_falls_back_with_sdpa_gradients():
    q, k, v = _qkv(grad=True)
    out = api.attention(q, k, v, fp8=FP8History())
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.dtype)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    ref = _sdpa(q, k, v)
    rq, rk, rv = torch.autograd.grad(ref, (q, k, v), grad)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for got, want in ((dq, rq), (dk, rk), (dv, rv)):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# ----- FP8 output (o_dtype) ----------------------------------------------------------------------------
def test_fp8_history_output_precision_is_checked_and_shown():
    with pytest.raises(ConfigError) as err:
        FP8History(o_dtype=torch.bfloat16)
    assert err.value.field == "FP8History.o_dtype" and "float8_e4m3fn" in err.value.allowed
    assert "o_dtype=torch.float8_e4m3fn" in repr(FP8History(o_dtype=torch.float8_e4m3fn))
    assert "o_dtype" not in repr(FP8History())


def test_fp8_output_is_refused_for_training_naming_the_field():
    q, k, v = _qkv(grad=True)
    with pytest.raises(ConfigError) as err:
        api.attention(q, k, v, fp8=FP8History(o_dtype=torch.float8_e4m3fn))
    assert err.value.field == "fp8.o_dtype" and "inference" in err.value.allowed
    # The same call without FP8 output is a different signature and runs.
    assert api.attention(q, k, v, fp8=FP8History()).dtype == torch.bfloat16


def test_fp8_output_on_cpu_is_an_fp8_tensor_of_the_fallback_result():
    from fusedattn_select.runtime.fp8 import FP8Tensor

    q, k, v = _qkv()
    out = api.attention(q, k, v, mask="causal", fp8=FP8History(o_dtype=torch.float8_e4m3fn))
    assert isinstance(out, FP8Tensor)  # asked for FP8: never silently the input precision
    assert out.data.dtype == torch.float8_e4m3fn and out.data.shape == q.shape
    ref = _sdpa(q, k, v, is_causal=True).float()
    got = out.dequantize(torch.float32)
    # e4m3 keeps 3 mantissa bits: each value within 2**-4 of itself (plus the smallest step).
    assert bool(((got - ref).abs() <= ref.abs() * 2 ** -4 + 2 ** -9 * ref.abs().max()).all())
    plain = api.attention(q, k, v, mask="causal", fp8=FP8History())
    assert plain.dtype == torch.bfloat16 and dispatcher.counters["entries_built"] == 2  # separate signatures
