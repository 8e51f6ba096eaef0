"""A config.json that gives no maximum length is read at the length transformers' own config class
gives it (BERT 512, Llama 2048, Whisper 1500 / 448), not at 4096; where transformers gives none (BLOOM's
ALiBi, T5's relative positions, a model_type the reader does not know) a note says the length was assumed
and which. The defaults are data in model_families.py: reading never imports transformers."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

from fusedattn_select import cli
from fusedattn_select.integrations.transformers import model_families as families
from fusedattn_select.integrations.transformers.model_reading import DEFAULT_REPORT_SEQLEN
from fusedattn_select.integrations.transformers.problems import hf_config

ASSUMED = f"seqlen {DEFAULT_REPORT_SEQLEN} is assumed"
DECODER = {"num_attention_heads": 8, "hidden_size": 512, "num_hidden_layers": 2}


def lengths(config: dict) -> list[tuple[str, int | None, int, int]]:
    return [(s.prefix, s.positions, s.seqlen_q, s.seqlen_kv) for s in hf_config(config).stacks]


@pytest.mark.parametrize("model_type, positions", [
    ("llama", 2048), ("phi3", 4096), ("gpt_neox", 2048), ("opt", 2048), ("deepseek_v2", 2048),
    ("deepseek_v3", 4096), ("clip_text_model", 77),
])
def test_a_decoder_without_its_length_is_read_at_transformers_default(model_type, positions):
    reading = hf_config({"model_type": model_type, **DECODER})
    assert lengths({"model_type": model_type, **DECODER}) == [("", positions, positions, positions)]
    assert not any(ASSUMED in note for note in reading.notes)


@pytest.mark.parametrize("model_type, positions", [
    ("mistral", 131072), ("qwen2", 32768), ("gemma2", 8192), ("gpt_oss", 131072), ("mixtral", 131072),
])
def test_a_longer_default_is_kept_as_the_models_length_and_read_at_4096(model_type, positions):
    [(prefix, kept, seqlen_q, seqlen_kv)] = lengths({"model_type": model_type, **DECODER, "head_dim": 64})
    assert (kept, seqlen_q, seqlen_kv) == (positions, DEFAULT_REPORT_SEQLEN, DEFAULT_REPORT_SEQLEN)


def test_bert_without_max_position_embeddings_is_read_at_512():
    bert = {"model_type": "bert", "num_attention_heads": 12, "hidden_size": 768, "num_hidden_layers": 12}
    assert lengths(bert) == [("encoder", 512, 512, 512)]
    assert hf_config(bert).notes == ()


def test_roberta_without_length_or_pad_token_is_read_at_transformers_510():
    roberta = {"model_type": "roberta", "num_attention_heads": 12, "hidden_size": 768, "num_hidden_layers": 12}
    assert lengths(roberta) == [("encoder", 510, 510, 510)]  # 512 positions less pad_token_id 1 and one more
    assert lengths({**roberta, "max_position_embeddings": 514}) == [("encoder", 512, 512, 512)]
    assert lengths({**roberta, "max_position_embeddings": 514, "pad_token_id": 0}) == [("encoder", 513, 513, 513)]


def test_whisper_without_its_lengths_reads_transformers_1500_and_448():
    whisper = {"model_type": "whisper", "encoder_attention_heads": 8, "decoder_attention_heads": 8, "d_model": 512,
               "encoder_layers": 2, "decoder_layers": 2}
    assert lengths(whisper) == [("encoder", 1500, 1500, 1500), ("decoder", 448, 448, 448),
                                ("cross_attention", 448, 448, 1500)]


@pytest.mark.parametrize("config, stacks, said", [
    ({"model_type": "bloom", "n_head": 8, "hidden_size": 512, "n_layer": 2}, "the model's layers",
     "transformers' bloom config sets no default for it"),
    ({"model_type": "t5", "num_heads": 8, "d_model": 512, "d_kv": 64, "num_layers": 2},
     "encoder, decoder, cross_attention", "transformers' t5 config sets no default for it"),
    ({"model_type": "not-a-family", **DECODER}, "the model's layers",
     "this reader knows no default for its model_type"),
])
def test_a_length_nothing_gives_is_assumed_and_said(config, stacks, said):
    notes = [note for note in hf_config(config).notes if ASSUMED in note]
    assert len(notes) == 1
    assert notes[0].startswith(f"{stacks}: the config gives no maximum length (") and said in notes[0]
    assert all(seqlen == DEFAULT_REPORT_SEQLEN for _, _, seqlen, _ in lengths(config))


def test_t5_with_n_positions_is_read_at_it_without_a_note():
    t5 = {"model_type": "t5", "num_heads": 8, "d_model": 512, "d_kv": 64, "num_layers": 2, "n_positions": 512}
    assert {seqlen for _, _, seqlen, _ in lengths(t5)} == {512}
    assert not any(ASSUMED in note for note in hf_config(t5).notes)


def test_why_says_the_assumed_length_in_a_note_line(capsys):
    code = cli.main(["why", "--target", "h100", "--hf-config", '{"model_type": "bloom", "n_head": 8, '
                     '"hidden_size": 512, "n_layer": 2}'])
    out = capsys.readouterr().out
    assert code in (0, 1, 3)
    assert any(line.startswith("note: the model's layers: the config gives no maximum length") and ASSUMED in line
               for line in out.splitlines())
    assert f"seqlen_q={DEFAULT_REPORT_SEQLEN}" in out


def test_why_reads_a_sparse_llama_at_2048(capsys):
    code = cli.main(["why", "--target", "h100", "--hf-config", '{"model_type": "llama", "num_attention_heads": 32, '
                     '"hidden_size": 4096, "num_hidden_layers": 32}'])
    out = capsys.readouterr().out
    assert "seqlen_q=2048 seqlen_kv=2048" in out and "note:" not in out


def _transformers_positions(model_type: str) -> list[int | None]:
    from transformers import AutoConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.for_model(model_type)
    family = families.FAMILIES[model_type]
    if family.encoder_decoder:
        return [getattr(config, keys.positions[0], None) for keys in (family.encoder_keys, family.decoder_keys)]
    return [getattr(config, "max_position_embeddings", None)]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
@pytest.mark.parametrize("model_type", [name for name, f in families.FAMILIES.items() if not f.vision])
def test_each_familys_default_length_is_transformers_own(model_type):
    family = families.FAMILIES[model_type]
    if family.encoder_decoder:
        ours = [family.encoder_keys.positions_default, family.decoder_keys.positions_default]
    else:
        ours = [family.positions_default]
    assert ours == _transformers_positions(model_type)
