"""GPU test of T5's relative position bias under attn_implementation="fusedattn" (bf16 on CUDA).

transformers passes the bias to the attention function as `position_bias`; "fusedattn" runs it as the
runtime's additive bias. A tiny random T5 (head dim 64) in bf16 must be as close to the float32 model
as "sdpa" in bf16 is, with no padding, left padding and right padding, and a training step's gradients
too (the bias is learned: its gradient flows through the attention's bias input).
"""

from __future__ import annotations

import copy

import pytest
from gpu_setup import GPU_MARKS, torch

pytestmark = GPU_MARKS
pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForSeq2SeqLM  # noqa: E402

from fusedattn_select.integrations import transformers as fa_hf  # noqa: E402
from fusedattn_select.runtime.api import dispatch_info  # noqa: E402

CUDA = torch.device("cuda")
VOCAB, BATCH, LENGTH, PAD = 128, 3, 48, 7


@pytest.fixture(scope="module")
def models():
    fa_hf.register()
    config = AutoConfig.for_model("t5", vocab_size=VOCAB, d_model=256, d_kv=64, num_heads=4, num_layers=2,
                                  d_ff=512, pad_token_id=0, decoder_start_token_id=0, initializer_factor=1.0)
    torch.manual_seed(0)
    truth = AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager").to(CUDA).eval()
    built = {"truth": truth}
    for name in ("sdpa", "fusedattn"):
        model = copy.deepcopy(truth).to(torch.bfloat16)
        model.set_attn_implementation(name)
        built[name] = model
    return built


def _inputs(padding: str | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (BATCH, LENGTH), generator=generator).to(CUDA)
    labels = torch.randint(1, VOCAB, (BATCH, 16), generator=generator).to(CUDA)
    mask = torch.ones_like(ids)
    if padding == "left":
        mask[0, :PAD] = 0
    elif padding == "right":
        mask[0, LENGTH - PAD:] = 0
    return ids, mask, labels


def _error(model, truth_out, ids, mask, labels) -> float:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=labels).logits.float()
    return (out - truth_out).abs().max().item()


@pytest.mark.parametrize("padding", [None, "left", "right"])
def test_bf16_logits_are_as_accurate_as_sdpa(models, padding):
    ids, mask, labels = _inputs(padding)
    with torch.no_grad():
        truth = models["truth"](input_ids=ids, attention_mask=mask, labels=labels).logits
    before = dispatch_info()["fused_calls"]
    ours = _error(models["fusedattn"], truth, ids, mask, labels)
    fused = dispatch_info()["fused_calls"] - before
    theirs = _error(models["sdpa"], truth, ids, mask, labels)
    assert ours <= 2 * theirs + 1e-2, f"fusedattn {ours:.4f} vs sdpa {theirs:.4f} off the float32 model ({fused} fused)"


def test_bf16_gradients_of_the_relative_bias_are_as_accurate_as_sdpa(models):
    ids, mask, labels = _inputs("right")
    grads = {}
    for name in ("truth", "sdpa", "fusedattn"):
        model = models[name]
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        table = model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
        grads[name] = table.grad.float().clone()
        model.zero_grad(set_to_none=True)
    scale = grads["truth"].abs().max().item()
    ours, theirs = ((grads[name] - grads["truth"]).abs().max().item() for name in ("fusedattn", "sdpa"))
    assert scale > 0 and ours <= 2 * theirs + 1e-2 * scale, (ours, theirs, scale)
