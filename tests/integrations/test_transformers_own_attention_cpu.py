"""Models whose own code reads the mask (CPU): BLOOM, MPT and others run their attention in their own code,
not through transformers' attention interface, yet make their masks through it, so under "fusedattn"
they are handed a CudnnMask. They must stop with an error that says why and what to use instead, not
a TypeError from inside their layers; report() and `why --hf-config` say so before any model is built.
"""

from __future__ import annotations

import copy
import pickle

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from fusedattn_select import Backend, cli  # noqa: E402
from fusedattn_select.integrations.transformers import register, report  # noqa: E402
from fusedattn_select.integrations.transformers.masks import CudnnMask, MaskUsedAsTensor  # noqa: E402

BLOOM = {"model_type": "bloom", "vocab_size": 128, "hidden_size": 64, "n_layer": 2, "n_head": 4, "pad_token_id": 0}
MPT = {"model_type": "mpt", "vocab_size": 128, "d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 64,
       "pad_token_id": 0}
SAYS = "attn_implementation='fusedattn' cannot run it: use 'eager' or 'sdpa'"


def _forward(spec: dict) -> None:
    register()
    spec = dict(spec)
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="fusedattn").eval()
    ids = torch.randint(1, 128, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))


def test_a_model_adding_the_mask_to_its_scores_is_told_why_it_cannot_run():
    with pytest.raises(MaskUsedAsTensor, match=SAYS):  # BLOOM: scores + mask
        _forward(BLOOM)


def test_a_model_reading_a_tensor_attribute_of_the_mask_is_told_why_it_cannot_run():
    with pytest.raises(AttributeError, match=SAYS):  # MPT: mask.to(...)
        _forward(MPT)


def test_the_mask_description_still_copies_pickles_and_answers_what_transformers_asks():
    mask = CudnnMask("causal", (-1, -1), 4, 4)
    assert copy.deepcopy(mask) == mask and pickle.loads(pickle.dumps(mask)) == mask
    assert mask.ndim == 4 and mask.contiguous() is mask and not hasattr(mask, "dtype")
    with pytest.raises(MaskUsedAsTensor, match=r"\(where\)"):
        torch.where(mask, 0.0, 1.0)
    with pytest.raises(MaskUsedAsTensor, match=r"\(mask \+ \.\.\.\)"):  # a tuple's + would concatenate
        mask + torch.zeros(1)


def test_report_and_why_say_transformers_runs_bloom_and_falcon_in_their_own_code(capsys):
    for model_type in ("bloom", "falcon"):
        config = {"model_type": model_type, "hidden_size": 1024, "n_head": 16, "n_layer": 2, "vocab_size": 1000}
        rows = report(config)
        assert rows and all(row.backend is Backend.NONE and "model's own code" in row.reason for row in rows), rows
    cli.main(["why", "--hf-config", str(BLOOM).replace("'", '"')])
    out = capsys.readouterr().out
    assert "not fused by the transformers integration: transformers runs this model's attention in the model's " \
           "own code" in out, out
