"""Careless or hostile input gets a clear error, never a traceback (issue 33, items 12-14): a reader
that closes stdout early, model configs with impossible numbers, a --png that is not a PNG path,
YAML that expands without bound or repeats a key, and values too long to print."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fusedattn_select import cli, config_files
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_SUITE = ROOT / "probes" / "hopper-suite-sample.yaml"
LLAMA = {"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4,
         "num_hidden_layers": 4, "max_position_embeddings": 2048}
MEMORY_LIMIT = 2 * 1024**3  # a child that expands a billion laughs runs out here, not on the machine


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def child_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEDATTN_SELECT_")}
    env["FUSEDATTN_SELECT_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def cli_command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "fusedattn_select.cli", *argv]


# ----- item 12: a reader that closes stdout early ---------------------------------------------------
def assert_quiet(stderr: str) -> None:
    for noise in ("Traceback", "Exception ignored", "BrokenPipeError"):
        assert noise not in stderr, stderr


def test_a_reader_that_stops_after_one_line_ends_the_command_quietly_with_141(tmp_path):
    # Far more output than a pipe buffers, so the command is still writing when the reader leaves.
    configs = sorted(str(p) for p in (ROOT / "configs").glob("*.yaml"))
    proc = subprocess.Popen(cli_command("why", "--json", *configs), cwd=ROOT, env=child_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "{\n"
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 141
    assert_quiet(stderr)


def test_a_reader_gone_before_the_first_write_is_141_without_a_traceback(tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)  # no reader at all: the first write fails, however short the output
    try:
        proc = subprocess.run(cli_command("why", str(ROOT / "configs" / "gpt2.yaml")), cwd=ROOT,
                              env=child_env(tmp_path), stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert_quiet(proc.stderr)


# ----- item 13: model configs with impossible numbers -----------------------------------------------
@pytest.mark.parametrize("value", [0, -4, float("nan"), "32", True, 3.5, float("inf"), [32]])
def test_an_impossible_head_count_is_an_error_naming_the_field(capsys, value):
    code, out, err = run(capsys, "why", "--hf-config", json.dumps({**LLAMA, "num_attention_heads": value}))
    assert code == 2 and out == ""
    assert err.startswith("error: hf_config.num_attention_heads=") and "must be a positive integer" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("field, value, allowed", [
    ("hidden_size", 0, "must be a positive integer"),
    ("num_key_value_heads", 0, "must be a positive integer"),
    ("num_key_value_heads", 5, "must divide num_attention_heads (32)"),
    ("head_dim", "128", "must be a positive integer"),
    ("num_hidden_layers", -1, "must be a positive integer"),
    ("max_position_embeddings", "4k", "must be a positive integer"),
    ("sliding_window", 0, "must be a positive integer"),
    ("attention_dropout", 1.5, "must be a number in [0, 1)"),
    ("query_pre_attn_scalar", 0, "must be a positive finite number"),
    ("layer_types", "full_attention", "must be a list of layer type names"),
])
def test_every_field_read_from_a_model_config_is_checked(capsys, field, value, allowed):
    code, _, err = run(capsys, "why", "--hf-config", json.dumps({**LLAMA, field: value}))
    assert code == 2
    assert err.startswith(f"error: hf_config.{field}=") and allowed in err, err


def test_a_model_type_transformers_does_not_know_is_checked_too(capsys):
    config = {**LLAMA, "model_type": "not-a-transformers-model", "num_attention_heads": 0}
    code, _, err = run(capsys, "why", "--hf-config", json.dumps(config))
    assert code == 2 and err.startswith("error: hf_config.num_attention_heads=0")


def test_hidden_size_must_split_into_the_heads_when_head_dim_is_not_given(capsys):
    config = {**LLAMA, "model_type": "not-a-transformers-model", "hidden_size": 2050}
    code, _, err = run(capsys, "why", "--hf-config", json.dumps(config))
    assert code == 2 and err.startswith("error: hf_config.hidden_size=2050: must be a positive multiple")


def test_json_with_an_integer_too_long_to_read_is_an_error(capsys):
    code, _, err = run(capsys, "why", "--hf-config", '{"num_attention_heads": ' + "1" * 5000 + "}")
    assert code == 2 and err.startswith("error: hf_config=") and len(err) < 1000


# ----- item 13: --png ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["heatmap.txt", "heatmap", ""])
def test_png_must_name_a_png_file(capsys, tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "matrix", str(SAMPLE_SUITE), "--png", path)
    assert code == 2 and out == ""
    assert err.startswith(f"error: --png={path!r}: must be a file name ending in .png")
    assert not list(tmp_path.glob("heatmap*"))


def test_png_prints_exactly_the_path_it_wrote(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plots").mkdir()
    _, out, _ = run(capsys, "matrix", str(SAMPLE_SUITE), "--png", "./plots/../heat.png")
    assert "heatmap -> ./plots/../heat.png" in out.splitlines()
    assert (tmp_path / "heat.png").read_bytes().startswith(b"\x89PNG")


# ----- item 14: YAML ----------------------------------------------------------------------------------
def billion_laughs(indent: str = "") -> str:
    """Nine levels of nine aliases: a few hundred bytes that describe 9**9 strings."""
    lines = [f'{indent}a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 9):
        name, below = chr(ord("a") + level), chr(ord("a") + level - 1)
        lines.append(f"{indent}{name}: &{name} [" + ", ".join([f"*{below}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("key", ["description", "defaults"])
def test_a_billion_laughs_is_refused_at_once_with_a_short_message(tmp_path, key):
    path = tmp_path / "laughs.yaml"
    path.write_text(f"{key}:\n{billion_laughs('  ')}configs:\n  - {{name: x, batch_size: 1}}\n")
    started = time.monotonic()
    proc = subprocess.run(cli_command("why", str(path)), cwd=ROOT, env=child_env(tmp_path), capture_output=True,
                          text=True, timeout=60, preexec_fn=_limit_memory)
    assert time.monotonic() - started < 20
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: config file={str(path)!r}: its aliases expand it by ")
    assert "a 'billion laughs' document?" in proc.stderr and len(proc.stderr) < 500


def test_an_alias_that_holds_itself_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("description: &loop [*loop]\nconfigs: [{name: x}]\n")
    with pytest.raises(ConfigError, match="holds an alias that contains itself"):
        load_config_file(path)


def test_aliases_within_the_budget_still_load(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("defaults: &shape {batch_size: 2, num_heads_q: 8, num_heads_kv: 8, seqlen_q: 64, seqlen_kv: 64,"
                    " head_dim_qk: 64}\nconfigs:\n  - {<<: *shape, name: a}\n  - {<<: *shape, name: b, batch_size: 4}\n")
    entries = load_config_file(path).entries
    assert [(e.name, e.config.batch_size) for e in entries] == [("a", 2), ("b", 4)]


def test_a_repeated_key_is_an_error_naming_the_key_and_its_lines(tmp_path):
    path = tmp_path / "repeated.yaml"
    path.write_text("configs:\n  - name: x\n    batch_size: 1\n    batch_size: 2\n")
    with pytest.raises(ConfigError) as err:
        load_config_file(path)
    assert "line 4, column 5: found duplicate key 'batch_size' (first at line 3)" in str(err.value)


def test_a_repeated_key_in_a_set_value_is_an_error(capsys):
    code, _, err = run(capsys, "why", "--set", "window_size={left: 1, left: 2}")
    assert code == 2 and "found duplicate key 'left'" in err


def test_a_value_yaml_cannot_build_is_an_error_at_its_line(tmp_path):
    path = tmp_path / "built.yaml"
    path.write_text("name: m\ndescription: 2001-13-45\nconfigs: [{name: x}]\n")
    with pytest.raises(ConfigError, match="line 2, column 14: cannot build this value"):
        load_config_file(path)


def test_the_c_loader_reads_yaml_where_pyyaml_has_it():
    if not getattr(yaml, "__with_libyaml__", False):
        pytest.skip("this PyYAML was built without libyaml")
    assert issubclass(config_files.yaml_loader(), yaml.CSafeLoader)


def test_without_the_c_loader_the_python_one_keeps_the_same_rules(tmp_path, monkeypatch):
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    config_files.yaml_loader.cache_clear()
    try:
        assert issubclass(config_files.yaml_loader(), yaml.SafeLoader)  # the pure-Python one
        path = tmp_path / "repeated.yaml"
        path.write_text("name: a\nname: b\nconfigs: [{name: x}]\n")
        with pytest.raises(ConfigError, match="found duplicate key 'name'"):
            load_config_file(path)
    finally:
        monkeypatch.undo()
        config_files.yaml_loader.cache_clear()


# ----- item 14: values too long to print ---------------------------------------------------------------
def test_an_error_shows_a_long_value_cut_with_its_length():
    message = str(ConfigError("description", "x" * 1_000_000, "must be short"))
    assert len(message) < 500
    assert message.endswith("... (1,000,000 characters): must be short")


def test_an_error_never_formats_a_huge_nested_value_in_full():
    value: list = ["lol"] * 9
    for _ in range(8):
        value = [value] * 9  # 9**9 strings, shared: its repr() would be gigabytes
    started = time.monotonic()
    message = str(ConfigError("defaults", value, "must be a mapping"))
    assert time.monotonic() - started < 1
    assert len(message) < 500 and "... (a list of 9 items)" in message


def test_an_error_shows_an_integer_too_long_to_print():
    assert "<an integer of" in str(ConfigError("batch_size", 10**5000, "must be small"))
