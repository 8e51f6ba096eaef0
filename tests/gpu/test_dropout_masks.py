"""Whether cuDNN's dropout mask is a function of [seed, offset] alone, on a real GPU, at a shape off its bucket
(b3 s200; the bucket pads it): the same torch seed must give the same output from a call's inference graph and
its training graph (reentrant checkpointing runs a forward as the one and recomputes it as the other), and from
bucket plans and the shape's own (dense) plans (a promotion can land between a forward and its recomputation).
Where these differ, checkpointed dropout back-propagates another mask."""

from __future__ import annotations

import pytest
from gpu_setup import CUDA, GPU_MARKS, torch
from torch.utils.checkpoint import checkpoint

from fusedattn_select.runtime.api import attention, clear_plans, dispatch_info  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402

pytestmark = GPU_MARKS
P = 0.3


@pytest.fixture
def inline(use_settings):
    use_settings(dense_builds="inline")
    clear_plans()
    yield use_settings
    clear_plans()


def _inputs(requires_grad=False):
    gen = torch.Generator(device=CUDA).manual_seed(3)
    return [torch.randn(3, 200, 4, 64, device=CUDA, dtype=torch.bfloat16, generator=gen).requires_grad_(requires_grad)
            for _ in range(3)]


def _seeded(seed, *qkv):
    torch.manual_seed(seed)
    return attention(*qkv, mask="causal", dropout=P)


def _entries():
    return [(e.opts.training, e.bucketed) for e in dispatcher.entries.values() if e.fused]


@pytest.mark.parametrize("dense_after", [1000, 1])  # bucket plans throughout; the shape's own after its first call
def test_the_inference_and_the_training_graph_draw_one_mask(inline, dense_after):
    inline(dense_after=dense_after)
    q, k, v = _inputs()
    with torch.no_grad():
        for _ in range(2):  # (promoted at the first call where dense_after is 1)
            inference = _seeded(7, q, k, v)
    training = _seeded(7, *(t.detach().requires_grad_() for t in (q, k, v)))
    kinds = _entries()
    assert {training for training, _ in kinds} == {False, True}, kinds
    assert torch.equal(inference, training.detach()), "one [seed, offset], two masks"


def test_bucket_and_dense_plans_draw_one_mask(inline):
    q, k, v = _inputs()
    inline(dense_after=1000)
    with torch.no_grad():
        bucket = _seeded(11, q, k, v)
    assert all(bucketed for _, bucketed in _entries())
    clear_plans()
    inline(dense_after=1)
    with torch.no_grad():
        for _ in range(2):
            dense = _seeded(11, q, k, v)
    assert not any(bucketed for _, bucketed in _entries())
    assert torch.equal(bucket, dense), "bucket and dense plans drew two masks from one [seed, offset]"


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_dropout_over_steps_backpropagates_its_forward_s_mask(inline, reentrant):
    inline(dense_after=2)  # promoted while the steps run
    q, k, v = _inputs(requires_grad=True)
    w = torch.randn(3, 200, 4, 64, device=CUDA, generator=torch.Generator(device=CUDA).manual_seed(5))
    for step in range(4):
        for t in (q, k, v):
            t.grad = None
        fused = dispatch_info()["fused_calls"]
        out = checkpoint(lambda a, b, c: attention(a, b, c, mask="causal", dropout=P), q, k, v,
                         use_reentrant=reentrant)
        loss = (out.float() * w).sum()
        loss.backward()
        assert dispatch_info()["fused_calls"] >= fused + 2
        implied = (v.detach().float() * v.grad.float()).sum()  # O = A_M V is linear in V
        assert float((implied - loss.detach()).abs()) <= 2e-2 * float(loss.detach().abs()), f"step {step}"
