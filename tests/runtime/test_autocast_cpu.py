"""attention() inside torch.autocast takes its inputs as torch's autocast hands them to
scaled_dot_product_attention: float32, fp16 and bf16 q, k, v in the autocast dtype. Mixed-precision
training of float32 weights gives attention float32 q and k (out of the rotary embedding) and v in
the autocast dtype; such a call raised ConfigError ("k and v must have q's dtype"), and float32
inputs alone fell back as "no fused config" where torch runs them in bf16."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime.api import attention, config_from_tensors  # noqa: E402
from fusedattn_select.runtime.args import autocast_inputs  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_platform")
BF16 = torch.bfloat16


def _inputs():
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 12, 4, 16, generator=gen).requires_grad_() for _ in range(2))
    v = torch.randn(2, 12, 4, 16, generator=gen).to(BF16).requires_grad_()
    return q, k, v


def test_mixed_float32_and_bf16_inputs_run_as_their_bf16_cast_with_float32_gradients():
    q, k, v = _inputs()
    with torch.autocast("cpu", dtype=BF16):
        out = attention(q, k, v, mask="causal")
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    q16, k16 = (t.detach().to(BF16).requires_grad_() for t in (q, k))
    v16 = v.detach().requires_grad_()
    want_out = attention(q16, k16, v16, mask="causal")
    want = torch.autograd.grad(want_out, (q16, k16, v16), grad)
    assert out.dtype == BF16 and torch.equal(out, want_out)
    assert [g.dtype for g in got] == [torch.float32, torch.float32, BF16]
    for g, w in zip(got, want):
        assert torch.equal(g, w.to(g.dtype))


def test_the_config_of_a_call_under_autocast_is_in_the_autocast_dtype():
    q, k, v = _inputs()
    with pytest.raises(Exception, match="fused kernels take fp16, bf16 or float8"):
        config_from_tensors(q, k, v.float())  # float32 outside autocast: no config
    with torch.autocast("cpu", dtype=BF16):
        assert config_from_tensors(q, k, v).qkv_dtype == "bf16"
    with torch.autocast("cpu", dtype=torch.float16):
        assert config_from_tensors(q, k, v).qkv_dtype == "fp16"  # bf16 v too, as torch's autocast casts it


def test_outside_autocast_or_for_float8_and_float64_inputs_nothing_is_cast():
    q, k, v = _inputs()
    assert all(a is b for a, b in zip(autocast_inputs(q, k, v), (q, k, v)))
    f8 = tuple(t.detach().to(torch.float8_e4m3fn) for t in (q, k, v))
    f64 = tuple(t.detach().double() for t in (q, k, v))
    with torch.autocast("cpu", dtype=BF16):
        assert all(a is b for a, b in zip(autocast_inputs(*f8), f8))
        assert all(a is b for a, b in zip(autocast_inputs(*f64), f64))
        assert attention(*f64).dtype == torch.float64
    with torch.autocast("cpu", dtype=BF16, enabled=False):
        with pytest.raises(Exception, match="k and v must have q's dtype"):
            attention(q, k, v)


def test_a_compiled_call_under_autocast_traces_the_cast_in_one_graph():
    q, k, v = _inputs()

    def step(q, k, v):
        return attention(q, k, v, mask="causal")

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    try:
        with torch.autocast("cpu", dtype=BF16):
            out = compiled(q, k, v)
        out.float().sum().backward()
    finally:
        torch._dynamo.reset()
    assert out.dtype == BF16 and q.grad.dtype == torch.float32


def test_an_mkldnn_q_inside_autocast_is_refused_by_the_checks_not_by_the_cast():
    q = torch.randn(2, 12, 4, 16).to_mkldnn()
    with torch.autocast("cpu", dtype=BF16), pytest.raises(Exception, match=r"^q=.*must be a dense \(strided\) tensor"):
        attention(q, q, q)
