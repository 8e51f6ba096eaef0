"""A transformers model of float32 weights trained under torch.autocast (the mixed-precision recipe) with
attn_implementation="fusedattn": its loss and gradients are "sdpa"'s. Its rotary embedding leaves q and k
in float32 and v in bf16; the first forward raised ConfigError ("k and v must have q's dtype")."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_test_models import CPU_TINY as TINY  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from fusedattn_select.integrations import transformers as fa_hf  # noqa: E402



@pytest.mark.parametrize("padding", [None, "left"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_mixed_precision_training_step_gives_sdpa_s_loss_and_gradients(family, padding):
    assert fa_hf.register() == "fusedattn"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(TINY.config(family), attn_implementation="sdpa")
    ids, mask = TINY.inputs(padding)
    found = {}
    for implementation in ("sdpa", "fusedattn"):
        model.set_attn_implementation(implementation)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        found[implementation] = (loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
    (loss_sdpa, grads_sdpa), (loss_ours, grads_ours) = found["sdpa"], found["fusedattn"]
    assert torch.allclose(loss_ours, loss_sdpa, rtol=1e-2, atol=1e-3)
    assert len(grads_ours) == len(grads_sdpa)
    for ours, theirs in zip(grads_ours, grads_sdpa):
        # (both in bf16: padded rows run another kernel than sdpa's, whose roundings differ)
        assert ours.dtype == torch.float32
        assert float((ours - theirs).norm()) <= 0.05 * float(theirs.norm()) + 1e-6
