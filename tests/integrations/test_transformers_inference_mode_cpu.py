"""attn_implementation="fusedattn" under torch.inference_mode(), where tensors made inside carry no version
counter: generate() with a static or sliding-window cache (each decode step's mask is a dense tensor, run as a
bias) and packed sequences (a dense mask tagged by the mask function) raised "Inference tensors do not track
version counter" from the integration; they must give what "sdpa" gives, and an edit to a tagged mask made
under inference mode must still be seen."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_test_models import CPU_TINY as TINY  # noqa: E402
from hf_test_models import fresh_log_once, registered  # noqa: E402, F401 (the module's fixtures)
from transformers import AutoModelForCausalLM  # noqa: E402

from fusedattn_select.integrations.transformers import masks  # noqa: E402




def model_of(name: str):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(TINY.config(name)).eval()


@pytest.mark.parametrize("padding", [None, "left"])
@pytest.mark.parametrize("cache", ["static", "sliding_window"])
@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_generate_under_inference_mode_gives_sdpa_s_tokens(name, cache, padding, caplog):
    model = model_of(name)
    ids, mask = TINY.inputs(padding)
    mask = torch.ones_like(ids) if mask is None else mask
    tokens = {}
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        for implementation in ("sdpa", "fusedattn"):
            model.set_attn_implementation(implementation)
            with torch.inference_mode():
                tokens[implementation] = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                                        pad_token_id=0, cache_implementation=cache)
    assert torch.equal(tokens["fusedattn"], tokens["sdpa"])
    # the prefill's tagged mask and the steps' one-row masks were taken as the mask function made them
    assert "did not describe" not in caplog.text


def test_packed_sequences_under_inference_mode_give_sdpa_s_logits():
    model = model_of("llama")
    ids, _ = TINY.inputs(None)
    packed = dict(position_ids=torch.tensor([list(range(6)) + list(range(4))] * 2), use_cache=False)
    out = {}
    for implementation in ("sdpa", "fusedattn"):
        model.set_attn_implementation(implementation)
        with torch.inference_mode():
            out[implementation] = model(ids, **packed).logits
    torch.testing.assert_close(out["fusedattn"], out["sdpa"], atol=2e-5, rtol=1e-4)


def test_a_mask_tagged_under_inference_mode_is_taken_until_it_is_edited():
    description = masks.CudnnMask("causal", (-1, -1), 3, 3)
    with torch.inference_mode():
        dense = masks.tag(torch.ones(1, 1, 3, 3, dtype=torch.bool).tril(), description)
        assert masks.tagged(dense, 3, 3) == (True, description)
        dense[0, 0, 0, 1] = True  # the model edits its mask in place
        assert masks.tagged(dense, 3, 3) == (False, None)


def test_one_row_bias_of_an_inference_tensor_is_the_bias_it_stands_for():
    with torch.inference_mode():
        row = torch.tensor([True, False, True]).reshape(1, 1, 1, 3)
        bias = masks.one_row_bias(row, 2, 3, torch.float32)
        assert torch.equal(bias, torch.tensor([0.0, float("-inf"), 0.0]).reshape(1, 1, 1, 3))
        row[0, 0, 0, 1] = True  # changed in place: the bias follows it
        assert torch.equal(masks.one_row_bias(row, 2, 3, torch.float32), torch.zeros(1, 1, 1, 3))


def test_a_dense_mask_made_under_inference_mode_is_not_copied(monkeypatch):
    """A dense mask (packed sequences' B x Sq x Skv; a static cache's decode row) is made outside inference mode,
    so the tag watches its version counter without a copy (a copy held it twice while the forward ran)."""
    from transformers import masking_utils

    made = []
    real = masking_utils.sdpa_mask

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(masking_utils, "sdpa_mask", recording)
    model = model_of("llama")
    model.set_attn_implementation("fusedattn")
    ids, mask = TINY.inputs("left")
    packed = dict(position_ids=torch.tensor([list(range(6)) + list(range(4))] * 2), use_cache=False)
    with torch.inference_mode():
        model(ids, **packed)
        model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=0,
                       cache_implementation="static")
    dense = [m for m in made if m is not None]
    assert {m.shape[-2] for m in dense} == {1, ids.shape[1]}  # the steps' rows and the packed forward's mask
    assert not any(m.is_inference() for m in dense)
    assert any(hasattr(m, masks._TAG) for m in dense)  # the packed mask is tagged as made, not a copy of it
