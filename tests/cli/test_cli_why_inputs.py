"""What `why` takes: several config files (as warmup does), --name across them, nothing at all
(a usage error, exit 2), and --hf-config without transformers' import noise (issue 13, item 9).

Answers come from a snapshot recorded with RecordingTestEngine (a test double, tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusedattn_select import cli
from fusedattn_select.probing import bundled_snapshot

ROOT = Path(__file__).resolve().parents[2]
SECOND_FILE = """
name: second-model
defaults: {batch_size: 1, num_heads_q: 8, num_heads_kv: 8, seqlen_q: 512, seqlen_kv: 512, head_dim_qk: 64}
configs:
  - {name: train-causal, mask: causal}
  - {name: decode, seqlen_q: 1, mask: causal_bottom_right, is_training: false}
"""
HF_CONFIG = ('{"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, '
             '"num_hidden_layers": 4, "max_position_embeddings": 2048}')


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def second_file(tmp_path):
    path = tmp_path / "second-model.yaml"
    path.write_text(SECOND_FILE)
    return str(path)


def answered_names(out):
    return [line.split(": ", 1)[0] for line in out.splitlines() if line and not line.startswith((" ", "engine", "answers"))]


def test_why_with_no_arguments_says_what_to_pass_and_exits_2(capsys):
    code, out, err = run(capsys, "why")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith("error: why: nothing to answer: give CONFIG.yaml files, --hf-config PATH_OR_JSON, "
                          "or --set key=value pairs")
    assert "None" not in err


def test_why_answers_every_entry_of_several_config_files_named_as_warmup_names_them(
        capsys, tmp_path, suite_file, recorded_snapshot):
    code, out, err = run(capsys, "why", str(suite_file), second_file(tmp_path), "--snapshot", str(recorded_snapshot))
    names = answered_names(out)
    assert names[:2] == ["test-suite/train-causal", "test-suite/infer"]
    assert names[-2:] == ["second-model/train-causal", "second-model/decode"]
    assert len(names) == 7 + 2
    assert code == 1  # head-dim-512 is NONE in the test snapshot


def test_why_with_one_config_file_keeps_the_plain_entry_names(capsys, suite_file, recorded_snapshot):
    _, out, _ = run(capsys, "why", str(suite_file), "--snapshot", str(recorded_snapshot))
    assert answered_names(out)[0] == "train-causal"


def test_why_name_picks_that_entry_in_every_file_that_has_it(capsys, tmp_path, suite_file, recorded_snapshot):
    code, out, _ = run(capsys, "why", str(suite_file), second_file(tmp_path), "--name", "train-causal",
                       "--snapshot", str(recorded_snapshot))
    assert answered_names(out) == ["test-suite/train-causal", "second-model/train-causal"]


def test_why_name_in_none_of_the_files_exits_2_with_a_suggestion(capsys, tmp_path, suite_file, recorded_snapshot):
    code, out, err = run(capsys, "why", str(suite_file), second_file(tmp_path), "--name", "decod",
                         "--snapshot", str(recorded_snapshot))
    assert code == 2 and out == ""
    assert err.startswith("error: --name='decod': no entry of any of the 2 files has this name; did you mean 'decode'?")


def test_a_set_pair_with_a_mistyped_field_suggests_the_field(capsys, recorded_snapshot, suite_file):
    code, _, err = run(capsys, "why", str(suite_file), "--set", "seqlen_kw=4", "--snapshot", str(recorded_snapshot))
    assert code == 2
    assert "seqlen_kw=4: unknown field; did you mean 'seqlen_kv'?" in err


def test_a_set_pair_that_is_not_yaml_says_where(capsys, suite_file):
    code, _, err = run(capsys, "why", str(suite_file), "--set", "window_size=[1,")
    assert code == 2
    assert "window_size='[1,': is not a YAML value (line 1, column 4:" in err


def test_why_config_and_hf_config_together_is_an_error(capsys, suite_file):
    code, _, err = run(capsys, "why", str(suite_file), "--hf-config", HF_CONFIG)
    assert code == 2 and "give either CONFIG.yaml files or --hf-config, not both" in err


def test_hf_config_help_states_its_defaults(capsys):
    code = cli.main(["why", "--help"])  # argparse prints the help and exits 0
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0
    assert "by default at batch_size 1, seqlen_q = seqlen_kv = min(max_position_embeddings, 4096)" in out
    assert "the config's torch_dtype (bf16 when it names no fused dtype)" in out


@pytest.mark.skipif(not bundled_snapshot("h100", "configs").exists(), reason="bundled H100 snapshot not installed")
def test_hf_config_is_answered_without_importing_torch_or_transformers(tmp_path):
    # Reading a config.json is JSON work: with both installed, neither may be imported (each
    # costs seconds), and without them the answer is the same.
    script = (
        "import sys\n"
        "from fusedattn_select.cli.main import main\n"
        f"code = main(['why', '--target', 'h100', '--hf-config', {HF_CONFIG!r}])\n"
        "print('imported:', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
        "sys.exit(code)\n"
    )
    env = dict(os.environ, FUSEDATTN_SELECT_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=120)
    assert "full_attention (layers 0-3)" in result.stdout, result.stderr
    assert "imported: []" in result.stdout
    assert "Traceback" not in result.stderr


def test_transformers_still_says_it_without_the_quiet_import(tmp_path):
    # The noise is real (so the test above can fail): importing transformers bare prints it.
    pytest.importorskip("transformers")
    script = "import sys; sys.modules['torch'] = None\nimport transformers\n"
    env = dict(os.environ)
    env.pop("TRANSFORMERS_NO_ADVISORY_WARNINGS", None)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert "PyTorch was not found" in result.stderr
