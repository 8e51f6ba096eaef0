"""Fused dropout under activation checkpointing and torch.manual_seed on a real GPU: the backward of a
checkpointed call uses the mask its forward drew (O = A_M V is linear in V, so with L = sum(O * W),
<V, dL/dV> equals L exactly when the backward's mask is the forward's), and the same torch seed gives the
same masks. Each call draws its seed and offset from torch's generator (fused._next_rng)."""

from __future__ import annotations

import pytest
from gpu_setup import CUDA, GPU_MARKS, torch
from torch.utils.checkpoint import checkpoint

from fusedattn_select.runtime.api import attention, dispatch_info  # noqa: E402

pytestmark = GPU_MARKS


def _inputs():
    gen = torch.Generator(device=CUDA).manual_seed(1)
    q, k, v = (torch.randn(2, 4, 256, 64, device=CUDA, dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    return q, k, v, torch.randn(2, 4, 256, 64, device=CUDA, generator=gen)


def _call(q, k, v):
    return attention(q, k, v, layout="bhsd", mask="causal", dropout=0.3)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_call_backpropagates_through_its_forward_s_mask(reentrant):
    q, k, v, w = _inputs()
    fused = dispatch_info()["fused_calls"]
    out = checkpoint(_call, q, k, v, use_reentrant=reentrant)
    loss = (out.float() * w).sum()
    loss.backward()
    assert dispatch_info()["fused_calls"] >= fused + 2  # the forward and its recomputation, on cuDNN
    implied = (v.detach().float() * v.grad.float()).sum()
    assert float((implied - loss).abs()) <= 2e-2 * float(loss.abs()), "the backward used another mask"


def test_the_same_torch_seed_repeats_the_masks_and_another_call_draws_a_new_one():
    q, k, v, _ = _inputs()
    with torch.no_grad():
        torch.manual_seed(5)
        first, second = _call(q, k, v), _call(q, k, v)
        torch.manual_seed(5)
        again = _call(q, k, v)
    assert torch.equal(first, again) and not torch.equal(first, second)
