"""attention() under torch.func transforms (vmap, grad: per-sample gradients, as Opacus computes them): vmap's
and grad's wrapped tensors have no memory of their own and the fused autograd Functions no functorch rules
(torch refuses them: "it must override the setup_context staticmethod"), so such calls are decided apart from
plain calls of the same shape and run on torch, with torch SDPA's results."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime.api import attention, clear_plans  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402

FUNCTORCH = "under a torch.func transform"


@pytest.fixture(autouse=True)
def fresh():
    clear_plans()
    yield
    clear_plans()


def _sdpa(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                                            is_causal=True).transpose(1, 2)


def test_per_sample_gradients_by_vmap_of_grad_are_torch_sdpa_s_and_decided_apart():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 1, 5, 2, 8, generator=gen) for _ in range(3))  # 3 samples of batch 1

    def loss(attend, q, k, v):
        return attend(q, k, v).square().sum()

    ours = torch.func.vmap(torch.func.grad(lambda *t: loss(lambda *a: attention(*a, mask="causal"), *t)))(q, k, v)
    want = torch.func.vmap(torch.func.grad(lambda *t: loss(_sdpa, *t)))(q, k, v)
    torch.testing.assert_close(ours, want)
    reasons = [e.reason for e in dispatcher.entries.values()]
    assert reasons and all(r.startswith(FUNCTORCH) for r in reasons)
    assert not dispatcher.by_call  # never filed under the fast key, which a plain call of the shape finds
    attention(q[0], k[0], v[0], mask="causal")  # the same shape, plain: its own signature, not the transform's
    assert sum(not e.reason.startswith(FUNCTORCH) for e in dispatcher.entries.values()) == 1


def test_a_vmapped_inference_call_is_torch_sdpa_s():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(4, 2, 6, 2, 8, generator=gen, dtype=torch.bfloat16) for _ in range(3))
    got = torch.func.vmap(lambda *a: attention(*a, mask="causal"))(q, k, v)
    torch.testing.assert_close(got, torch.func.vmap(_sdpa)(q, k, v))


def test_a_transformed_call_is_decided_on_the_caller_s_thread():
    """The preparer's thread is under no transform: a call prepared there would be decided fused and swapped in
    (on a GPU, a torch-first call). wait_reason keeps it on the caller's thread, where the transform is seen."""
    from fusedattn_select.runtime import entries, tiers
    from fusedattn_select.runtime.args import Arguments, call_options
    from fusedattn_select.runtime.options import NO_INPUTS

    def reason(q, k, v):
        signature = entries.key(q, k, v, call_options(q, k, v, NO_INPUTS, Arguments()), NO_INPUTS)
        return tiers.wait_reason(signature, q, k, v, NO_INPUTS, None)

    q = torch.randn(3, 1, 5, 2, 8)
    seen = []
    torch.func.vmap(lambda t: seen.append(reason(t, t, t)) or t)(q)
    assert seen == ["a torch.func transform"]
    assert reason(q[0], q[0], q[0]) == "not a CUDA call"  # what a plain CPU call is decided for
