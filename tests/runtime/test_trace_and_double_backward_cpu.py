"""What attention() cannot do says so: torch.jit.trace (a trace records torch ops, and cuDNN's kernels
are none: a traced module would replay empty outputs; on CPU it failed with a TypeError from inside the
fallback), a double backward through the fused autograd Functions (their gradients came back detached:
a gradient penalty lost its terms without an error; torch's flash kernel raises), and a strided nested q
(it failed in the hot path's key, before the checks that name it)."""

from __future__ import annotations

import types
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch.utils.checkpoint import checkpoint  # noqa: E402

from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime import fused, lean  # noqa: E402
from fusedattn_select.runtime.api import attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_platform")


def test_tracing_a_module_that_calls_attention_is_refused_naming_torch_compile_and_export():
    class Attend(torch.nn.Module):
        def forward(self, q):
            return attention(q, q, q, mask="causal")

    q = torch.randn(1, 8, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match="cannot be traced.*torch.compile or torch.export") as err:
        torch.jit.trace(Attend(), (q,))
    assert err.value.field == "q"
    assert attention(q, q, q, mask="causal").shape == q.shape  # outside a trace, as before


def test_a_strided_nested_q_is_refused_by_the_checks():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's prototype warning for the strided nested layout
        nested = torch.nested.nested_tensor([torch.randn(3, 2, 8), torch.randn(5, 2, 8)]).to(torch.bfloat16)
    with pytest.raises(ConfigError, match=r"^q=.*nested.*must be a dense"):
        attention(nested, nested, nested)


def _stand_in_kernels(monkeypatch):
    """The Functions' kernel calls replaced by torch code that, like cuDNN's, records no graph: only the
    Functions' own autograd contract is under test here (no selection, no plan, no probe)."""
    def forward(entry, q, k, v, inputs, scales):
        with torch.no_grad():
            return fused.Saved(torch.nn.functional.scaled_dot_product_attention(q, k, v), None, None, None)

    def backward(entry, grad_out, q, k, v, inputs, saved):
        with torch.no_grad():
            return grad_out * 2, grad_out * 3, grad_out * 4, None, None

    monkeypatch.setattr(fused, "fused_forward", forward)
    monkeypatch.setattr(fused, "fused_backward", backward)
    monkeypatch.setattr(lean, "lean_forward", lambda entry, q, k, v: (forward(entry, q, k, v, None, None).out, None))
    monkeypatch.setattr(lean, "lean_backward", lambda entry, g, q, k, v, out, stats: backward(entry, g, q, k, v, 0, 0)[:3])


def _function_and_leaves(monkeypatch, function):
    """attention's (the stand-in kernels') output of q, k, v by the fused or the lean Function, and q, k, v."""
    _stand_in_kernels(monkeypatch)
    entry = types.SimpleNamespace(opts=types.SimpleNamespace(layout="bhsd"), lse=lambda stats, b, s: None)

    def run(q, k, v):
        if function == "fused":
            return fused.FusedAttention.apply(entry, None, q, k, v)[0]
        return lean.LeanAttention.apply(entry, q, k, v)
    return run, [torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("function", ["fused", "lean"])
def test_a_double_backward_through_the_fused_functions_raises_instead_of_dropping_terms(monkeypatch, function):
    run, (q, k, v) = _function_and_leaves(monkeypatch, function)
    out = run(q, k, v)
    loss = out.square().sum()  # its gradient requires grad, as a real loss's does
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v), create_graph=True)
    assert torch.equal(dq, 4 * out.detach())  # the first backward is as it was (2 * dL/dO)
    penalty = dq.square().sum() + dv.sum()
    # Every way to differentiate again: autograd.grad and backward(inputs=...) run only the nodes on a path to
    # their inputs, so the raising node must lead back to q, k and v (it once had no edges: those forms
    # returned the first-order terms alone, silently).
    for again in (lambda: (loss + penalty).backward(retain_graph=True),
                  lambda: torch.autograd.grad(loss + penalty, (q,), retain_graph=True),
                  lambda: torch.autograd.grad(penalty, (k,), retain_graph=True),
                  lambda: (loss + penalty).backward(inputs=[v], retain_graph=True)):
        with pytest.raises(RuntimeError, match="double backward is not supported"):
            again()


@pytest.mark.parametrize("function", ["fused", "lean"])
def test_create_graph_through_a_checkpointed_call_gives_gradients_and_then_raises(monkeypatch, function):
    # Non-reentrant checkpointing refuses a second unpack of the saved tensors: the Functions unpack them once.
    run, (q, k, v) = _function_and_leaves(monkeypatch, function)
    out = checkpoint(lambda a, b, c: run(a * 1, b, c), q, k, v, use_reentrant=False)
    (dq,) = torch.autograd.grad(out.square().sum(), (q,), create_graph=True)
    assert torch.equal(dq, 4 * out.detach())
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(dq.sum(), (k,))
