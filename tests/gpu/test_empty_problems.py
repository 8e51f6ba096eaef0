"""Empty problems on a real GPU (batch 0, no queries, no keys: a rank's empty share of a batch, an empty
prompt): attention() answers as torch's SDPA does on the CPU (on a GPU, torch 2.11's returns None for
batch 0), eagerly and compiled, counted as fallback calls."""

from __future__ import annotations

import pytest
from gpu_setup import CUDA, GPU_MARKS, torch

from fusedattn_select.runtime.api import attention, dispatch_info  # noqa: E402

pytestmark = GPU_MARKS
EMPTY = [((0, 64, 8, 64), (0, 64, 2, 64)), ((2, 0, 8, 64), (2, 64, 2, 64)), ((2, 64, 8, 64), (2, 0, 2, 64))]


def _sdpa(q, k, v, causal):
    bhsd = (t.transpose(1, 2) for t in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(*bhsd, is_causal=causal, enable_gqa=True).transpose(1, 2)


@pytest.mark.parametrize(("q_shape", "kv_shape"), EMPTY, ids=["batch 0", "seqlen_q 0", "seqlen_kv 0"])
@pytest.mark.parametrize("compiled", [False, True])
def test_an_empty_problem_answers_as_torch_sdpa(q_shape, kv_shape, compiled):
    q = torch.randn(*q_shape, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(*kv_shape, device=CUDA, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    on_cpu = [t.detach().cpu().requires_grad_() for t in (q, k, v)]
    want = _sdpa(*on_cpu, causal=True)
    want_grads = torch.autograd.grad(want.float().square().sum(), on_cpu)
    run = torch.compile(attention, backend="aot_eager", fullgraph=True) if compiled else attention
    before = dispatch_info()["fallback_calls"]
    out = run(q, k, v, mask="causal")
    assert out.shape == want.shape and out.dtype == want.dtype and out.is_cuda and torch.equal(out.cpu(), want)
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    for name, g, expected in zip("qkv", grads, want_grads):
        assert g.shape == expected.shape and g.is_cuda and torch.equal(g.cpu(), expected), name
    if not compiled:
        assert dispatch_info()["fallback_calls"] == before + 1
