"""One process, two GPUs (a model split over them, as transformers' device_map="auto" places its layers):
a call on tensors of the GPU that is not current runs there, fused, forward and backward, eager, compiled
and FP8, and leaves the current device as it was. cuDNN and Triton launch on the current device: such a
call launched its kernels on the other GPU's stream from the current one."""

from __future__ import annotations

import pytest
from gpu_setup import GPU_MARKS, assert_close, torch

from fusedattn_select.reference.autograd_reference import reference_attention  # noqa: E402
from fusedattn_select.runtime.api import attention, dispatch_info  # noqa: E402

pytestmark = GPU_MARKS + [pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]
BF16 = torch.bfloat16


def _inputs(device: str, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(2, h, 192, 64, generator=gen, device=device).to(BF16).requires_grad_()
                 for h in (8, 2, 2))


def _check(out, q, k, v):
    want = reference_attention(*(t.detach().double() for t in (q, k, v)), mask="causal")
    assert_close(out, want, 2e-2, f"out on {q.device}")
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(reference_attention(*ref_leaves, mask="causal"), ref_leaves, grad.double())
    for label, g, w in zip(("dq", "dk", "dv"), got, want):
        assert_close(g, w, 4e-2, f"{label} on {q.device}")


@pytest.mark.parametrize("compiled", [False, True])
def test_calls_on_the_gpu_that_is_not_current_run_fused_there(compiled):
    torch.cuda.set_device(0)

    def call(q, k, v):
        return attention(q, k, v, layout="bhsd", mask="causal")

    run = torch.compile(call, fullgraph=True) if compiled else call
    for device in ("cuda:1", "cuda:0", "cuda:1"):
        q, k, v = _inputs(device)
        fused = dispatch_info()["fused_calls"]
        out = run(q, k, v)
        assert dispatch_info()["fused_calls"] == fused + 1, f"the call on {device} did not run fused"
        assert out.device == q.device
        _check(out, q, k, v)
        torch.cuda.synchronize(device)
    assert torch.cuda.current_device() == 0


def test_fp8_on_the_gpu_that_is_not_current_tracks_bf16():
    torch.cuda.set_device(0)
    q, k, v = (t.detach() for t in _inputs("cuda:1", seed=3))
    with torch.no_grad():
        out8 = attention(q, k, v, layout="bhsd", fp8=True)
        out16 = attention(q, k, v, layout="bhsd")
    torch.cuda.synchronize("cuda:1")
    cosine = torch.nn.functional.cosine_similarity(out8.float().flatten(), out16.float().flatten(), dim=0)
    assert out8.device == q.device and float(cosine) > 0.99
