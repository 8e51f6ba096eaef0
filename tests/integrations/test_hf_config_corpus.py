"""The config.json reader against real model configs (tests/data/hf_configs, sources in SOURCES.md)
and their problems written by hand (expected.yaml): without transformers, in a process that cannot
import it or torch, and with transformers, from the config object it builds from the same file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fusedattn_select.integrations.transformers import configs_from_hf
from fusedattn_select.integrations.transformers.report import layer_ranges

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
EXPECTED = yaml.safe_load((CORPUS / "expected.yaml").read_text())
MODELS = sorted(EXPECTED)
# Fields expected.yaml leaves out hold their AttnConfig defaults.
DEFAULTS = {"qkv_dtype": "bf16", "mask": "no_mask", "softmax": "vanilla", "window_size": [-1, -1], "dropout": 0.0,
            "attn_scale": None, "bias": "no_bias", "bias_shape": None, "batch_size": 1, "is_training": True}


def described(problems) -> list[dict]:
    """(name, layers, every field the expectations name) of each problem, as expected.yaml writes them."""
    rows = []
    for name, config, layers in problems:
        fields = config.to_dict(include_defaults=True)
        if fields["attn_scale"] is not None:
            fields["attn_scale"] = round(fields["attn_scale"], 6)
        rows.append({"name": name, "layers": layer_ranges(layers), **fields})
    return rows


def expected(model: str) -> list[dict]:
    return [{**DEFAULTS, **{k: str(v) if k == "layers" else v for k, v in row.items()}} for row in EXPECTED[model]]


def matches(model: str, rows: list[dict]) -> None:
    want = expected(model)
    assert [row["name"] for row in rows] == [row["name"] for row in want]
    for got, row in zip(rows, want):
        assert {key: got[key] for key in row} == row, row["name"]


def test_the_corpus_has_a_file_and_a_source_for_every_expectation():
    files = {path.stem for path in CORPUS.glob("*.json")}
    assert files == set(MODELS) and len(files) >= 25
    sources = (CORPUS / "SOURCES.md").read_text()
    assert all(f"| {name}.json | github.com/" in sources for name in files)


@pytest.fixture(scope="module")
def read_without_transformers() -> dict:
    # A process where importing transformers or torch fails, as on a machine without them.
    script = (
        "import json, sys\n"
        "sys.modules['transformers'] = None; sys.modules['torch'] = None\n"
        "from pathlib import Path\n"
        "from fusedattn_select.integrations.transformers import configs_from_hf\n"
        "from fusedattn_select.integrations.transformers.report import layer_ranges\n"
        "out = {}\n"
        f"for path in sorted(Path({str(CORPUS)!r}).glob('*.json')):\n"
        "    out[path.stem] = [(n, c.to_dict(include_defaults=True), l) for n, c, l in configs_from_hf(str(path))]\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("model", MODELS)
def test_reader_without_transformers_gives_the_expected_problems(model, read_without_transformers):
    from fusedattn_select.config import AttnConfig

    problems = [(name, AttnConfig.from_dict(fields), layers) for name, fields, layers in read_without_transformers[model]]
    matches(model, described(problems))


@pytest.mark.parametrize("model", MODELS)
def test_reader_of_the_config_transformers_builds_gives_the_same_problems(model, tmp_path):
    transformers = pytest.importorskip("transformers")
    (tmp_path / "config.json").write_bytes((CORPUS / f"{model}.json").read_bytes())
    try:
        config = transformers.AutoConfig.from_pretrained(tmp_path)
    except (ValueError, KeyError) as err:  # a model type this transformers version does not know
        pytest.skip(f"transformers {transformers.__version__} cannot build {model}: {err}")
    matches(model, described(configs_from_hf(config)))
