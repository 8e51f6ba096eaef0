"""attention() and the transformers integration inside torch.autocast on a real GPU: float32 inputs (and
mixed float32 q, k with bf16 v, as a float32 model's rotary embedding leaves them) run the fused bf16
kernels, as torch SDPA runs its own in the autocast dtype, and train as "sdpa" does."""

from __future__ import annotations

import pytest
from gpu_setup import CUDA, GPU_MARKS, assert_close, torch

from fusedattn_select.runtime.api import attention, dispatch_info  # noqa: E402

pytestmark = GPU_MARKS
BF16 = torch.bfloat16


def test_float32_and_mixed_inputs_under_autocast_run_fused_as_their_bf16_cast():
    gen = torch.Generator(device=CUDA).manual_seed(0)
    q, k, v = (torch.randn(2, 256, h, 64, generator=gen, device=CUDA) for h in (8, 2, 2))
    v = v.to(BF16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    before = dispatch_info()["fused_calls"]
    with torch.autocast("cuda", dtype=BF16):
        out = attention(*leaves, mask="causal")
    assert dispatch_info()["fused_calls"] == before + 1, "an autocast call fell back"
    cast = [t.detach().to(BF16).requires_grad_() for t in (q, k, v)]
    want = attention(*cast, mask="causal")
    assert out.dtype == BF16 and torch.equal(out, want)
    grad = torch.randn_like(out)
    got, expected = torch.autograd.grad(out, leaves, grad), torch.autograd.grad(want, cast, grad)
    assert [g.dtype for g in got] == [torch.float32, torch.float32, BF16]
    for label, g, w in zip(("dq", "dk", "dv"), got, expected):
        assert_close(g, w, 1e-2, label)  # the same kernels; deterministic=False may reorder the sums


def test_a_float32_llama_trained_under_autocast_runs_fused_and_tracks_sdpa():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from fusedattn_select.integrations import transformers as fa_hf

    fa_hf.register()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).to(CUDA)
    ids = torch.randint(0, 512, (2, 128), device=CUDA)
    found = {}
    for implementation in ("sdpa", "fusedattn"):
        model.set_attn_implementation(implementation)
        model.zero_grad()
        fused = dispatch_info()["fused_calls"]
        with torch.autocast("cuda", dtype=BF16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        found[implementation] = (float(loss.detach()), torch.cat([p.grad.flatten() for p in model.parameters()]),
                                 dispatch_info()["fused_calls"] - fused)
    (loss_sdpa, grads_sdpa, _), (loss_ours, grads_ours, fused_calls) = found["sdpa"], found["fusedattn"]
    assert fused_calls == 2, "the model's two attention layers did not run fused"
    assert abs(loss_ours - loss_sdpa) <= 1e-2 * abs(loss_sdpa)
    assert float((grads_ours - grads_sdpa).norm()) <= 0.05 * float(grads_sdpa.norm())
