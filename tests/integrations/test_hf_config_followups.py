"""Follow-ups of the --hf-config audit (7051e60): Llama 4's chunked layers within one chunk, the reader's
notes in report(), Kimi-K2 read as DeepSeek-V3, and the error for a config without a layer count.

Llama 4: transformers' chunked mask is and_masks(chunked_overlay(c), causal); its "sdpa" mask function skips
the mask (None: plain causal) while the keys are fewer than c and no padding is masked
(masking_utils._ignore_causal_mask_sdpa), and the "fusedattn" attention function then runs the layer through
attention() as causal. From c keys on the mask is dense and the layer runs on torch SDPA."""

from __future__ import annotations

import json
import logging
import math

import pytest

from fusedattn_select import cli
from fusedattn_select.integrations.transformers import configs_from_hf, format_report, layer_problems, report
from fusedattn_select.integrations.transformers.problems import hf_config
from fusedattn_select.selection.selector import Selector

# meta-llama/Llama-4-Scout-17B-16E-Instruct's text_config (attention keys), cut to 8 layers.
LLAMA4 = {"model_type": "llama4_text", "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 8,
          "head_dim": 128, "num_hidden_layers": 8, "attention_chunk_size": 8192,
          "max_position_embeddings": 10485760, "torch_dtype": "bfloat16"}
# moonshotai/Kimi-K2-Instruct's config.json (attention keys): DeepSeek-V3's architecture under its own model_type.
KIMI_K2 = {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168,
           "num_attention_heads": 64, "num_key_value_heads": 64, "num_hidden_layers": 61, "q_lora_rank": 1536,
           "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "max_position_embeddings": 131072,
           "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                            "original_max_position_embeddings": 4096, "type": "yarn"},
           "torch_dtype": "bfloat16"}
# Qwen3-Next layout (12 layers): every 4th layer softmax attention, the rest linear attention.
QWEN3_NEXT = {"model_type": "qwen3_next", "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 2,
              "head_dim": 256, "num_hidden_layers": 12, "full_attention_interval": 4,
              "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}
NO_CUDA = "no CUDA device with cuDNN (test)"


def no_cuda() -> Selector:
    return Selector(None, unavailable_reason=NO_CUDA)


# ----- 1. Llama 4: chunked layers whose keys fit in one chunk are causal attention ---------------------------
def test_llama4_chunked_layers_within_one_chunk_are_answered_as_causal_attention():
    problems = {name: (cfg, layers, reasons) for name, cfg, layers, reasons in layer_problems(LLAMA4)}
    cfg, layers, reasons = problems["chunked_attention"]
    assert (cfg.seqlen_kv, cfg.mask, cfg.window_size, layers) == (4096, "causal", (-1, -1), [0, 1, 2, 4, 5, 6])
    assert reasons == ()


@pytest.mark.parametrize("seqlen", [8192, 9000])
def test_llama4_chunked_layers_from_one_chunk_of_keys_on_run_on_sdpa(seqlen):
    problems = {name: reasons for name, _, _, reasons in layer_problems(LLAMA4, seqlen=seqlen)}
    assert problems["full_attention"] == ()
    (reason,) = problems["chunked_attention"]
    assert "attention_chunk_size=8192" in reason and "torch SDPA" in reason


def test_llama4_reading_says_when_chunked_layers_run_fused():
    (note,) = [n for n in hf_config(LLAMA4).notes if "chunk" in n]
    assert "6 of 8 layers" in note and "8192" in note and "causal" in note


def test_why_answers_llama4_at_its_default_length_with_exit_0(capsys):
    code = cli.main(["why", "--hf-config", json.dumps(LLAMA4), "--target", "h100"])
    out = capsys.readouterr().out
    assert "not fused by the transformers integration" not in out
    assert "chunked_attention (layers 0-2,4-6)" in out and "note: the model's layers: 6 of 8 layers" in out
    assert code == 0
    code = cli.main(["why", "--hf-config", json.dumps(LLAMA4), "--target", "h100",
                     "--set", "seqlen_q=8192", "--set", "seqlen_kv=8192"])
    assert "not fused by the transformers integration: chunked attention" in capsys.readouterr().out
    assert code == 1


# ----- 2. report() carries the reader's notes ---------------------------------------------------------------
def test_report_carries_and_prints_the_readers_notes():
    rows = report(QWEN3_NEXT, selector=no_cuda())
    expected = hf_config(QWEN3_NEXT).notes
    assert any("linear_attention" in note for note in expected)
    assert rows.notes == expected
    text = format_report(rows)
    for note in expected:
        assert f"note: {note}" in text
    assert [row.layers for row in rows] == [(3, 7, 11)]  # still the list of rows it was


# ----- 3. Kimi-K2 is DeepSeek-V3's attention ---------------------------------------------------------------
def test_kimi_k2_gets_deepseeks_yarn_softmax_scale():
    (_, cfg, _), = configs_from_hf(KIMI_K2)
    mscale = 0.1 * 1.0 * math.log(32.0) + 1.0
    assert (cfg.head_dim_qk, cfg.head_dim_v) == (192, 128)
    assert cfg.attn_scale == pytest.approx(192 ** -0.5 * mscale * mscale)
    assert cfg.attn_scale == pytest.approx(0.1309, abs=1e-4)
    assert not [note for note in hf_config(KIMI_K2).notes if "not a model type this reader knows" in note]
    as_deepseek = configs_from_hf({**KIMI_K2, "model_type": "deepseek_v3"})
    assert configs_from_hf(KIMI_K2) == as_deepseek


def test_kimi_k25_text_config_is_read_as_deepseek_v3():
    outer = {"model_type": "kimi_k25", "text_config": KIMI_K2}
    (_, cfg, layers), = configs_from_hf(outer)
    assert cfg.attn_scale == pytest.approx(0.1309, abs=1e-4) and len(layers) == 61


def test_kimi_k2_scale_is_what_transformers_deepseek_v3_attention_uses():
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    modeling = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    config = transformers.DeepseekV3Config(**{k: v for k, v in KIMI_K2.items() if k != "model_type"})
    theirs = modeling.yarn_apply_mscale(config.rope_parameters, config.qk_head_dim ** -0.5)
    (_, cfg, _), = configs_from_hf(KIMI_K2)
    assert cfg.attn_scale == pytest.approx(theirs)


# ----- 4. a config without a layer count ------------------------------------------------------------------
def test_a_config_file_without_a_layer_count_names_the_file_and_its_model_type(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_attention_heads": 8, "hidden_size": 512}))
    assert cli.main(["why", "--hf-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "hf_config='llama'" not in err
    assert str(path) in err and "model_type 'llama'" in err
    assert "num_hidden_layers" in err and "n_layer" in err and "num_layers" in err
    assert "Traceback" not in err


def test_json_text_without_a_layer_count_is_named_as_the_json_given(capsys):
    assert cli.main(["why", "--hf-config", json.dumps({"model_type": "llama", "num_attention_heads": 8})]) == 2
    err = capsys.readouterr().err
    assert "the JSON given" in err and "model_type 'llama'" in err and "num_hidden_layers" in err
    assert "hf_config='llama'" not in err


def test_a_nested_text_config_without_a_layer_count_names_its_path():
    with pytest.raises(Exception) as caught:
        configs_from_hf({"model_type": "llava", "text_config": {"model_type": "llama", "num_attention_heads": 8}})
    message = str(caught.value)
    assert "hf_config.text_config.num_hidden_layers" in message and "model_type 'llama'" in message
    assert "the dict given" in message


# ----- 1 (runtime). what the integration does with Llama 4's chunked layers ---------------------------------
@pytest.mark.parametrize("seq,fused", [(7, True), (8, False), (9, False)])
def test_llama4_runtime_matches_the_report(seq, fused, caplog):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from fusedattn_select.integrations import transformers as fa_hf
    from fusedattn_select.integrations.transformers import dependencies, tracing

    fa_hf.register()
    tracing._logged.keys.clear()
    real = dependencies.loaded()
    calls: list[str] = []

    def spy(name, function):
        def call(*args, **kwargs):
            calls.append(name)
            return function(*args, **kwargs)
        return call

    config = transformers.Llama4TextConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, intermediate_size_mlp=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_chunk_size=8, num_local_experts=2,
        max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.Llama4ForCausalLM(config).eval()
    ids = torch.randint(0, 61, (2, seq))
    dependencies._loaded = real._replace(dispatch_attention=spy("attention()", real.dispatch_attention),
                                         sdpa_attention_forward=spy("sdpa", real.sdpa_attention_forward))
    try:
        model.set_attn_implementation("fusedattn")
        with torch.no_grad(), caplog.at_level(logging.INFO, logger="fusedattn_select"):
            ours = model(ids).logits
    finally:
        dependencies._loaded = real
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        theirs = model(ids).logits
    torch.testing.assert_close(ours, theirs)
    chunked = [layer for layer, kind in enumerate(config.layer_types) if kind == "chunked_attention"]
    assert [calls[layer] for layer in chunked] == ["attention()" if fused else "sdpa"] * len(chunked)
    # report() says the same of those layers at that length
    (reasons,) = [r for name, _, _, r in layer_problems(config, seqlen=seq) if name == "chunked_attention"]
    assert (reasons == ()) is fused
    # and nothing logs that these layers run on torch SDPA when they do not
    said_sdpa = any("run on torch SDPA" in record.getMessage() for record in caplog.records)
    assert said_sdpa is not fused


# ----- review follow-ups: what the notes and errors say ------------------------------------------------------
def test_a_top_level_kimi_k2_config_says_its_remote_code_runs_its_attention():
    notes = hf_config(KIMI_K2).notes
    assert any("'kimi_k2' is read as 'deepseek_v3'" in n and "trust_remote_code" in n for n in notes), notes
    outer = hf_config({"model_type": "kimi_k25", "text_config": KIMI_K2}).notes  # transformers reads this one
    assert not any("trust_remote_code" in n for n in outer), outer


def test_llama4_note_names_a_prefill_that_continues_a_cache_as_torch_served():
    (note,) = [n for n in hf_config(LLAMA4).notes if "chunk" in n]
    assert "continues a cache" in note


def test_a_config_with_no_softmax_attention_layer_names_the_config_and_why(capsys):
    given = json.dumps({"model_type": "nemotron_h", "num_attention_heads": 8, "hybrid_override_pattern": "MMM"})
    assert cli.main(["why", "--hf-config", given]) == 2
    err = capsys.readouterr().err
    assert "the JSON given" in err and "'nemotron_h'" in err and "no softmax attention" in err, err
    assert "layer_types=" not in err  # the file has no layer_types to blame
