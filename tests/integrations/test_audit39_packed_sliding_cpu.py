"""Packed sequences (position_ids restarting inside a row) on sliding-window models: transformers wraps
the sliding-window mask function in another and_mask with the same local_size, which the "fusedattn"
mask function must not take for a plain sliding window."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_test_models import TinyModels, fresh_log_once, registered  # noqa: E402, F401 (fixtures)
from transformers import AutoModelForCausalLM, masking_utils  # noqa: E402

from fusedattn_select.integrations.transformers import CudnnMask, fusedattn_mask  # noqa: E402

TINY = TinyModels(vocab=61, seq=10, window=3, hidden=32, intermediate=48, head_dim=8, init_range=0.2,
                  softcap=0.5, experts_per_tok=1, pad=3)



@pytest.mark.parametrize("name", ["mistral", "qwen2"])
@pytest.mark.parametrize("lengths", [(20, 10), (6, 4)])
def test_packed_sequences_on_a_sliding_window_model_give_what_sdpa_gives(name, lengths):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(TINY.config(name)).eval()
    ids = torch.randint(1, TINY.vocab, (2, sum(lengths)), generator=torch.Generator().manual_seed(1))
    packed = dict(position_ids=torch.tensor([[p for n in lengths for p in range(n)]] * 2), use_cache=False)
    out = {}
    with torch.no_grad():
        for impl in ("fusedattn", "sdpa"):
            model.set_attn_implementation(impl)
            out[impl] = model(ids, **packed).logits
    torch.testing.assert_close(out["fusedattn"], out["sdpa"], atol=2e-5, rtol=1e-4)


def test_a_packed_sliding_window_mask_function_is_materialised_not_described(caplog):
    window, length = 3, 30
    position_ids = torch.tensor([list(range(20)) + list(range(10))])
    sliding = masking_utils.sliding_window_causal_mask_function(window)
    packed = masking_utils.and_masks(
        masking_utils.remap_positions_for_packed_sequence(sliding, position_ids),
        masking_utils.packed_sequence_mask_function(masking_utils.find_packed_sequence_indices(position_ids)),
    )
    config = TINY.config("mistral", sliding_window=window)
    arguments = dict(batch_size=1, q_length=length, kv_length=length, allow_is_causal_skip=False,
                     local_size=window, config=config, dtype=torch.float32, device="cpu")
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        got = fusedattn_mask(mask_function=packed, **arguments)
    assert not isinstance(got, CudnnMask) and getattr(got, "_fusedattn_description")[0] is None
    assert torch.equal(got, masking_utils.sdpa_mask(mask_function=packed, **arguments))
    assert "materialised densely" in caplog.text
    # The plain sliding-window function of the same window is still described.
    assert isinstance(fusedattn_mask(mask_function=sliding, **{**arguments, "allow_is_causal_skip": True}), CudnnMask)
