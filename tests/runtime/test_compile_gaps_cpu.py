"""attention() under torch.compile on the CPU (every call falls back), for what the compile tests of
test_dispatch_cpu.py leave out: dropout in compiled training, return_lse's lse, float64 inputs, and
numbers dynamo traces as symbols (a function argument with dynamic shapes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime.api import attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_platform")


def _qkv(dtype=torch.float32, sq=5, skv=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, s, h, 8, generator=gen).to(dtype).requires_grad_()
                 for s, h in ((sq, 4), (skv, 2), (skv, 2)))


def _compiled(fn, **kwargs):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="aot_eager", **kwargs)


@pytest.mark.parametrize("arguments", [dict(), dict(mask="causal", window_size=(2, 0))],
                         ids=["torch_sdpa", "reference"])
def test_compiled_dropout_gradients_are_those_of_the_forward_that_ran(arguments):
    # With the dropout mask fixed, the output is linear in v (out = A v), so <out, G> must equal
    # <v, dL/dv> for L = <out, G>: a backward that drew another mask than its forward breaks this.
    compiled = _compiled(lambda q, k, v: attention(q, k, v, dropout=0.5, **arguments))
    q, k, v = _qkv()
    torch.manual_seed(7)
    out = compiled(q, k, v)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    dv, dq = torch.autograd.grad(out, (v, q), grad)
    torch.testing.assert_close((v * dv).sum(), (out * grad).sum(), atol=1e-4, rtol=1e-4)
    torch.manual_seed(7)  # seeded alike, the compiled call repeats itself, backward included
    again = compiled(q, k, v)
    torch.testing.assert_close(again, out, atol=0, rtol=0)
    torch.testing.assert_close(torch.autograd.grad(again, (v, q), grad), (dv, dq), atol=0, rtol=0)


def test_compiled_lse_takes_no_gradient_and_has_the_documented_dtype():
    def layer(q, k, v):
        return attention(q, k, v, mask="causal", return_lse=True)

    compiled = _compiled(layer)
    for dtype in (torch.bfloat16, torch.float64):  # lse: float32, float64 for float64 inputs
        q, k, v = _qkv(dtype)
        (out, lse), (want_out, want_lse) = compiled(q, k, v), layer(q, k, v)
        assert (lse.shape, lse.dtype, lse.requires_grad) == ((2, 4, 5, 1), want_lse.dtype, False)
        assert want_lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        torch.testing.assert_close(lse, want_lse)
        torch.testing.assert_close(torch.autograd.grad(out.sum(), q), torch.autograd.grad(want_out.sum(), q))


def test_attn_scale_traced_as_a_symbol_runs_as_its_value():
    # A float argument of a function compiled with dynamic=True reaches attention() as a SymFloat.
    def layer(q, k, v, scale):
        return attention(q, k, v, attn_scale=scale)

    compiled = _compiled(layer, dynamic=True)
    q, k, v = _qkv()
    for scale in (0.25, 0.5):
        out = compiled(q, k, v, scale)
        torch.testing.assert_close(out, layer(q, k, v, scale))
        want = torch.autograd.grad(layer(q, k, v, scale).sum(), k)
        torch.testing.assert_close(torch.autograd.grad(out.sum(), k), want)


def test_lengths_marked_dynamic_compile_once():
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, mask="causal_bottom_right"), fullgraph=True,
                             backend=counter)
    for sq, skv in ((3, 7), (6, 11), (9, 16)):
        q, k, v = _qkv(torch.bfloat16, sq, skv)
        for t in (q, k, v):
            torch._dynamo.mark_dynamic(t, 1)
        out = compiled(q, k, v)
        torch.testing.assert_close(out, attention(q, k, v, mask="causal_bottom_right"))
    assert counter.frame_count == 1
