"""T5's relative position bias under "fusedattn" (CPU): transformers hands it to the attention function
as `position_bias`, and "sdpa" folds it into its mask; "fusedattn" must add it to the scores too, on
every path (no mask, a padding description with left padding rolled, a decode step's one-row bias,
a dense mask), or the model computes something else without a word.

Tiny random T5 models in float32, the same weights under both implementations; the encoder's
output, the first decoder logits and greedy generate() (dynamic and static cache) are compared.
"""

from __future__ import annotations

import copy

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import AutoConfig, AutoModelForSeq2SeqLM  # noqa: E402

from fusedattn_select.integrations.transformers import register  # noqa: E402

VOCAB, BATCH, LENGTH, NEW_TOKENS = 128, 3, 10, 8
PADS = [3, 0, 5]


def _models(model_type: str) -> dict[str, object]:
    # A large initializer factor makes the relative bias big enough to change every greedy token.
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, d_model=64, d_kv=16, num_heads=4, num_layers=2,
                                  d_ff=128, pad_token_id=0, decoder_start_token_id=0, initializer_factor=4.0)
    register()
    torch.manual_seed(0)
    built = {}
    for implementation in ("sdpa", "fusedattn"):
        model = AutoModelForSeq2SeqLM.from_config(copy.deepcopy(config), attn_implementation=implementation)
        if built:
            model.load_state_dict(built["sdpa"].state_dict())
        built[implementation] = model.eval()
    return built


def _inputs(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    for row, pad in enumerate(PADS if side != "none" else []):
        if side == "left":
            mask[row, :pad] = 0
        else:
            mask[row, LENGTH - pad:] = 0
    return ids, mask


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    # Logits reach 50-500 here, and "sdpa" and "eager" differ by 1e-5 of that; without the bias
    # "fusedattn" was off by 1e-3 to 1e-1 of it.
    torch.testing.assert_close(ours, theirs, atol=2e-5 * theirs.abs().max().item(), rtol=1e-4)


@pytest.fixture(scope="module", params=["t5", "mt5"])
def models(request):
    return _models(request.param)


@pytest.mark.parametrize("side", ["none", "left", "right"])
def test_the_encoder_and_the_first_decoder_step_add_the_position_bias(models, side):
    ids, mask = _inputs(side)
    start = torch.zeros(BATCH, 1, dtype=torch.long)
    with torch.no_grad():
        outs = {name: model(input_ids=ids, attention_mask=mask, decoder_input_ids=start)
                for name, model in models.items()}
    valid = mask.bool()[..., None]
    encoded = {name: out.encoder_last_hidden_state.masked_fill(~valid, 0) for name, out in outs.items()}
    torch.testing.assert_close(encoded["fusedattn"], encoded["sdpa"], atol=1e-4, rtol=1e-4)
    _close(outs["fusedattn"].logits, outs["sdpa"].logits)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_greedy_generate_gives_sdpas_tokens(models, cache, side):
    ids, mask = _inputs(side)
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.no_grad():
        runs = {name: model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                                     output_scores=True, return_dict_in_generate=True, **extra)
                for name, model in models.items()}
    assert torch.equal(runs["fusedattn"].sequences, runs["sdpa"].sequences)
    _close(torch.stack(runs["fusedattn"].scores), torch.stack(runs["sdpa"].scores))
