"""A compiled training call with dropout inside activation checkpointing back-propagates through the mask
its forward drew. The op drew its seed inside itself, so the recomputation in the backward drew another
mask: gradients of a loss never computed. O = A_M V is linear in V, so with L = sum(O * W),
<V, dL/dV> equals L exactly when the backward's mask is the forward's. Runs the fallback inside the op
(CPU); the cuDNN path takes the same seed input (ops.compiled_attention)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.checkpoint import checkpoint  # noqa: E402

from fusedattn_select.runtime.api import attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_platform")


def _step(q, k, v):
    return attention(q, k, v, dropout=0.5)


@pytest.mark.parametrize("backend", ["aot_eager", "aot_eager_decomp_partition"])
def test_a_checkpointed_compiled_call_backpropagates_through_its_forward_s_mask(backend):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2, 16, generator=gen).requires_grad_() for _ in range(3))
    w = torch.randn(1, 8, 2, 16, generator=gen)
    compiled = torch.compile(lambda q, k, v: checkpoint(_step, q, k, v, use_reentrant=False), backend=backend)
    try:
        loss = (compiled(q, k, v) * w).sum()
        loss.backward()
    finally:
        torch._dynamo.reset()
    implied = (v.detach() * v.grad).sum()
    assert torch.allclose(implied, loss.detach(), rtol=1e-4, atol=1e-5), (float(implied), float(loss))


def test_compiled_dropout_repeats_under_the_same_torch_seed():
    q = torch.randn(1, 8, 2, 16)
    compiled = torch.compile(_step, backend="aot_eager")
    try:
        torch.manual_seed(3)
        first, second = compiled(q, q, q), compiled(q, q, q)
        torch.manual_seed(3)
        again = compiled(q, q, q)
    finally:
        torch._dynamo.reset()
    assert torch.equal(first, again) and not torch.equal(first, second)
