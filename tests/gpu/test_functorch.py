"""attention() under torch.func transforms on a real GPU: per-sample gradients (vmap of grad, as Opacus computes
them) and a vmapped inference call run on torch and give torch SDPA's results; a plain call of the same shape
still runs fused. Before, the fused autograd Functions raised torch's "must override the setup_context
staticmethod" under grad, and cuDNN was handed vmap's wrapped tensors."""

from __future__ import annotations

import time

from gpu_setup import CUDA, GPU_MARKS, assert_close, torch

from fusedattn_select.runtime.api import attention, dispatch_info  # noqa: E402

pytestmark = GPU_MARKS


def _sdpa(q, k, v):
    bhsd = (t.transpose(1, 2) for t in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(*bhsd, is_causal=True).transpose(1, 2)


def test_per_sample_gradients_and_a_vmapped_call_are_torch_sdpa_s(use_settings):
    gen = torch.Generator(device=CUDA).manual_seed(0)
    q, k, v = (torch.randn(3, 1, 128, 4, 64, generator=gen, device=CUDA, dtype=torch.bfloat16) for _ in range(3))

    def grads(attend):
        return torch.func.vmap(torch.func.grad(lambda *t: attend(*t).float().square().sum(), argnums=(0, 1, 2)))

    fused = dispatch_info()["fused_calls"]
    want = grads(_sdpa)(q, k, v)
    for _ in range(20):  # first contact's defaults: nothing prepared off the caller's thread is swapped in
        ours = grads(lambda *a: attention(*a, mask="causal"))(q, k, v)
        for name, got, expected in zip("qkv", ours, want):
            assert_close(got, expected, 2e-2, "d" + name)
        assert_close(torch.func.vmap(lambda *a: attention(*a, mask="causal"))(q, k, v),
                     torch.func.vmap(_sdpa)(q, k, v), 2e-2, "vmapped out")
        time.sleep(0.05)
    assert dispatch_info()["fused_calls"] == fused, "a transformed call ran cuDNN"
    use_settings(first_calls="wait")  # the plain call runs cuDNN at once
    assert_close(attention(q[0], k[0], v[0], mask="causal"), _sdpa(q[0], k[0], v[0]), 2e-2, "plain out")
    assert dispatch_info()["fused_calls"] == fused + 1, "the plain call of the shape fell back"
