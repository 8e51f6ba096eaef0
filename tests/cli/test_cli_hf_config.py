"""`fusedattn-select why --hf-config`: a Hugging Face model config answered layer by layer.

Answers come from the H100 snapshot bundled with the package (recorded on a real H100), so these
tests check the CLI's mapping and exit codes, not a device.
"""

from __future__ import annotations

import json

import pytest

from fusedattn_select import cli
from fusedattn_select.probing import bundled_snapshot

pytestmark = pytest.mark.skipif(
    not bundled_snapshot("h100", "configs").exists(), reason="bundled H100 snapshot not installed"
)

LLAMA_3_8B = {
    "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 32, "max_position_embeddings": 8192,
}
GEMMA_2_9B = {
    "model_type": "gemma2", "hidden_size": 3584, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 256, "num_hidden_layers": 42, "max_position_embeddings": 8192, "sliding_window": 4096,
    "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 256,
}
TRAIN_8K = ["--set", "batch_size=2", "--set", "seqlen_q=8192", "--set", "seqlen_kv=8192"]


def why(capsys, *args):
    code = cli.main(["why", "--target", "h100", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(tmp_path, config) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_llama_config_answers_one_problem_for_all_layers(tmp_path, capsys):
    code, out, _ = why(capsys, "--hf-config", write(tmp_path, LLAMA_3_8B), *TRAIN_8K)
    assert code == 0
    assert "full_attention (layers 0-31)" in out
    assert "num_heads_kv=8" in out and "head_dim_qk=128" in out
    assert out.count("-> F16") == 1


def test_json_string_is_accepted_as_hf_config(capsys):
    code, out, _ = why(capsys, "--hf-config", json.dumps(LLAMA_3_8B), *TRAIN_8K, "--json")
    document = json.loads(out)
    assert code == 0
    assert [r["selection"]["backend"] for r in document["results"]] == ["F16"]


def test_sliding_window_follows_the_sequence_length_given_with_set(tmp_path, capsys):
    _, out, _ = why(capsys, "--hf-config", write(tmp_path, GEMMA_2_9B), *TRAIN_8K)
    sliding = next(line for line in out.splitlines() if line.startswith("sliding_attention"))
    full = next(line for line in out.splitlines() if line.startswith("full_attention"))
    assert "window_size=[4095, 0]" in sliding
    assert "window_size" not in full


def test_softcapping_layers_are_reported_as_not_fused_and_exit_1(tmp_path, capsys):
    code, out, _ = why(capsys, "--hf-config", write(tmp_path, GEMMA_2_9B), *TRAIN_8K)
    assert code == 1
    assert out.count("not fused by the transformers integration: attn_logit_softcapping=50") == 2


def test_hf_config_with_a_config_file_is_bad_input(tmp_path, capsys):
    code, _, err = why(capsys, "configs/llama-3-8b.yaml", "--hf-config", write(tmp_path, LLAMA_3_8B))
    assert code == 2
    assert "--hf-config" in err and "Traceback" not in err


def test_missing_hf_config_file_is_bad_input(tmp_path, capsys):
    code, _, err = why(capsys, "--hf-config", str(tmp_path / "missing.json"))
    assert code == 2
    assert err.startswith("error: hf_config=")


@pytest.mark.parametrize(("value", "hint"), [("bf17", "did you mean 'bf16'? "), ("float16", "did you mean 'fp16'? "),
                                           ("int8", "")])
def test_a_set_dtype_is_checked_as_a_config_files_field_and_named(tmp_path, capsys, value, hint):
    code, out, err = why(capsys, "--hf-config", write(tmp_path, LLAMA_3_8B), "--set", f"qkv_dtype={value}")
    assert code == 2 and out == ""
    assert err.strip() == f"error: qkv_dtype={value!r}: {hint}must be one of 'fp16', 'bf16', 'fp8_e4m3', 'fp8_e5m2'", err


def test_a_set_dtype_of_the_config_files_names_is_asked(tmp_path, capsys):
    code, out, _ = why(capsys, "--hf-config", write(tmp_path, LLAMA_3_8B), *TRAIN_8K, "--set", "qkv_dtype=fp16")
    assert code != 2 and "head_dim_v=128 qkv_dtype=fp16 mask=causal" in out, out


@pytest.mark.parametrize("model_type,said", [
    ("frobnicator", "hf_config.model_type='frobnicator' is not a model type this reader knows: it is read as a causal "
                    "decoder with the common keys"),
    (None, "hf_config.model_type is not given: it is read as a causal decoder with the common keys"),
])
def test_a_model_type_no_family_names_is_said_to_be_read_as_a_causal_decoder(tmp_path, capsys, model_type, said):
    config = {key: value for key, value in LLAMA_3_8B.items() if key != "model_type"}
    if model_type is not None:
        config["model_type"] = model_type
    code, out, err = why(capsys, "--hf-config", write(tmp_path, config), *TRAIN_8K)
    assert code == 0 and "full_attention (layers 0-31)" in out
    assert said in out + err, out + err


@pytest.mark.parametrize("config", [LLAMA_3_8B, {"model_type": "llava", "text_config": LLAMA_3_8B}])
def test_a_known_model_type_gets_no_such_note(tmp_path, capsys, config):
    code, out, err = why(capsys, "--hf-config", write(tmp_path, config), *TRAIN_8K)
    assert code == 0 and "full_attention (layers 0-31)" in out and "reader knows" not in out + err, out + err


def test_clips_text_tower_gets_no_unknown_type_note(tmp_path, capsys):
    text = {"hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 12, "max_position_embeddings": 77}
    for config in ({"model_type": "clip", "text_config": text},
                   {"model_type": "clip", "text_config": {**text, "model_type": "clip_text_model"}}):
        code, out, err = why(capsys, "--hf-config", write(tmp_path, config))
        assert code != 2 and "head_dim_qk=64" in out and "reader knows" not in out + err, out + err


def test_an_empty_set_dtype_is_refused_naming_it(tmp_path, capsys):
    code, out, err = why(capsys, "--hf-config", write(tmp_path, LLAMA_3_8B), "--set", "qkv_dtype=")
    assert code == 2 and out == "" and err.startswith("error: qkv_dtype=None: must be one of 'fp16', 'bf16'"), err


@pytest.mark.parametrize("field", ["seqlen_q", "seqlen_kv"])
@pytest.mark.parametrize("value, said", [(3000000000, "must be at most 2147483647 (2**31-1, an int32)"),
                                         (0, "must be a positive integer"), ("null", "must be a positive integer")])
def test_a_set_length_that_is_no_length_is_refused_naming_the_set_field(tmp_path, capsys, field, value, said):
    # 3000000000 was refused by configs_from_hf naming its own argument (seqlen=...) and offering
    # None, which --set does not take.
    code, out, err = why(capsys, "--hf-config", write(tmp_path, LLAMA_3_8B), "--set", f"{field}={value}")
    shown = None if value == "null" else value
    assert code == 2 and out == "" and err.strip() == f"error: {field}={shown}: {said}", err


def test_a_set_length_of_int32_max_is_taken_as_the_length(tmp_path, capsys):
    from fusedattn_select.cli.problem_input import problems

    asked = problems(None, None, write(tmp_path, LLAMA_3_8B), ["seqlen_q=2147483647", "seqlen_kv=2147483647"])
    assert {(entry.config.seqlen_q, entry.config.seqlen_kv) for entry, _ in asked.problems} == {(2**31 - 1,) * 2}


# ----- a config.json that is not a JSON object: the error names the path given, with line and column ----------
@pytest.mark.parametrize("text, said", [
    ('{"model_type": "llama", "hidden_size": 40', "is not valid JSON (line 1, column 42: Expecting ',' delimiter)"),
    ('{"model_type": "lla', "is not valid JSON (line 1, column 16: Unterminated string starting at)"),
    ("", "is not valid JSON (line 1, column 1: Expecting value)"),
    ('{\n  "model_type": "llama",\n}', "is not valid JSON (line 3, column 1: Expecting property name enclosed in "
                                         "double quotes)"),
    ('[{"model_type": "llama"}]\n', "must be a JSON object, not an array"),
])
def test_a_config_file_that_is_no_json_object_is_named_by_its_path(tmp_path, capsys, text, said):
    path = tmp_path / "config.json"
    path.write_text(text)
    for given in (str(path), str(tmp_path)):  # the file, or its directory
        code, out, err = why(capsys, "--hf-config", given)
        assert code == 2 and out == ""
        assert err == f"error: hf_config={given!r}: {said}\n"


@pytest.mark.parametrize("text", ["[1,2]", " [] ", '["llama"]'])
def test_an_inline_json_array_is_read_as_json_and_refused(capsys, text):
    code, out, err = why(capsys, "--hf-config", text)
    assert code == 2 and out == ""
    assert err == f"error: hf_config={text!r}: must be a JSON object, not an array\n"


def test_inline_json_that_is_not_valid_says_where(capsys):
    code, _, err = why(capsys, "--hf-config", '{"model_type": "llama",')
    assert code == 2
    assert err == "error: hf_config='{\"model_type\": \"llama\",': is not valid JSON (line 1, column 24: " \
                  "Expecting property name enclosed in double quotes)\n"


def test_a_config_file_whose_name_starts_with_a_bracket_is_still_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "[llama].json").write_text(json.dumps(LLAMA_3_8B))
    code, out, err = why(capsys, "--hf-config", "[llama].json")
    assert code == 0, err
    assert "full_attention (layers 0-31)" in out
