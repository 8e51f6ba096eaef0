"""What the fused path cannot do raises, on a real GPU: a double backward through cuDNN's backward (a
gradient penalty) and torch.jit.trace of a module calling attention()."""

from __future__ import annotations

import pytest
from gpu_setup import CUDA, GPU_MARKS, assert_close, torch

from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime.api import attention, dispatch_info  # noqa: E402

pytestmark = GPU_MARKS


def test_a_gradient_penalty_through_the_fused_backward_raises_when_differentiated(use_settings):
    # The Python autograd Functions (test_native.py tests the compiled module's C++ node).
    use_settings(native="0")
    q, k, v = (torch.randn(2, 128, h, 64, device=CUDA, dtype=torch.bfloat16, requires_grad=True) for h in (8, 2, 2))
    fused = dispatch_info()["fused_calls"]
    out = attention(q, k, v, mask="causal")
    assert dispatch_info()["fused_calls"] == fused + 1
    loss = out.float().square().mean()  # its gradient requires grad, as a real loss's does
    (dq,) = torch.autograd.grad(loss, (q,), create_graph=True)
    penalty = dq.float().square().sum()
    for again in (lambda: (loss + penalty).backward(retain_graph=True),  # and the forms that run only the
                  lambda: torch.autograd.grad(loss + penalty, (q,), retain_graph=True),  # nodes on a path to
                  lambda: torch.autograd.grad(penalty, (q,), retain_graph=True)):  # their inputs
        with pytest.raises(RuntimeError, match="double backward is not supported"):
            again()


def test_tracing_a_fused_call_is_refused():
    q = torch.randn(1, 64, 2, 64, device=CUDA, dtype=torch.bfloat16)

    class Attend(torch.nn.Module):
        def forward(self, q):
            return attention(q, q, q)

    with pytest.raises(ConfigError, match="cannot be traced"):
        torch.jit.trace(Attend(), (q,))


def test_create_graph_through_a_checkpointed_fused_call_gives_gradients_then_raises(use_settings):
    # Non-reentrant checkpointing refuses a second unpack of the saved tensors (the Functions unpack them once).
    from torch.utils.checkpoint import checkpoint

    use_settings(native="0", first_calls="wait")  # cuDNN from the first call, checkpointed or not
    q, k, v = (torch.randn(2, 128, h, 64, device=CUDA, dtype=torch.bfloat16, requires_grad=True) for h in (8, 2, 2))
    plain = torch.autograd.grad(attention(q, k, v, mask="causal").float().square().mean(), (q,))[0]
    fused = dispatch_info()["fused_calls"]
    out = checkpoint(lambda a, b, c: attention(a, b, c, mask="causal"), q, k, v, use_reentrant=False)
    (dq,) = torch.autograd.grad(out.float().square().mean(), (q,), create_graph=True)
    assert dispatch_info()["fused_calls"] >= fused + 2  # the forward and its recomputation
    assert_close(dq, plain, 2e-2, "dq")
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(dq.float().square().sum(), (k,))
