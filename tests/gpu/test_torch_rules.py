"""PyTorch's own SDPA answer, recorded beside cuDNN's verdicts on the device.

Records a few problems with the live cuDNN engine and torch on the same GPU, then checks what
torch said: bf16 head-dim-512 inference is built by cuDNN 9.19 on Hopper while torch's rule for
its cuDNN backend refuses head dims above its limit; a plain head-dim-128 causal problem is
accepted by both; FP8 cannot be stated to SDPA. `matrix --compare torch` lists the disagreement.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from fusedattn_select import cli
from fusedattn_select.probing import torch_rules
from fusedattn_select.selection.recorder import record_snapshot, write_snapshot

pytestmark = pytest.mark.gpu

BASE = {"batch_size": 2, "num_heads_q": 16, "num_heads_kv": 16, "seqlen_q": 512, "seqlen_kv": 512,
        "qkv_dtype": "bf16", "mask": "causal"}
SUITE = {
    "name": "torch-rules",
    "configs": [
        {"name": "bf16-d512-infer", **BASE, "head_dim_qk": 512, "is_training": False},
        {"name": "bf16-d128-train", **BASE, "head_dim_qk": 128, "is_training": True},
        {"name": "bf16-d128-gqa4-infer", **BASE, "num_heads_kv": 4, "head_dim_qk": 128, "is_training": False},
        {"name": "fp8-d128-infer", **BASE, "qkv_dtype": "fp8_e4m3", "head_dim_qk": 128, "is_training": False},
    ],
}


@pytest.fixture(scope="module")
def recorded(cudnn_engine, tmp_path_factory):
    platform, reason = torch_rules.torch_platform()
    if platform is None:
        pytest.skip(f"torch cannot be asked on this machine: {reason}")
    directory = tmp_path_factory.mktemp("torch-rules")
    suite = directory / "torch-rules.yaml"
    suite.write_text(yaml.safe_dump(SUITE, sort_keys=False))
    snapshot = record_snapshot([suite], cudnn_engine, depth="fast")
    path = write_snapshot(snapshot, directory / "snapshot.json")
    print(json.dumps({"torch": snapshot["torch"], "answers": {e["name"]: e["torch"] for e in snapshot["entries"]}},
                     indent=1))
    return suite, path, snapshot


def _entry(snapshot, name):
    return next(e for e in snapshot["entries"] if e["name"] == name)


def test_header_names_torch_and_its_cudnn(recorded):
    header = recorded[2]["torch"]
    assert header["version"] and header["cudnn_version"] > 0 and header["device_name"]


def test_torch_refuses_head_dim_512_inference_that_cudnn_builds(recorded):
    entry = _entry(recorded[2], "bf16-d512-infer")
    assert {v["outcome"] for v in entry["verdicts"]} == {"supported"}
    answer = entry["torch"]
    assert answer["status"] == "evaluated", answer
    assert answer["cudnn"] is False
    assert any("head_dim" in reason for reason in answer["cudnn_reasons"]), answer
    assert answer["sdpa_choice"] != "CUDNN_ATTENTION"


def test_torch_accepts_head_dim_128_causal_training(recorded):
    entry = _entry(recorded[2], "bf16-d128-train")
    assert {v["outcome"] for v in entry["verdicts"]} == {"supported"}
    assert entry["torch"]["status"] == "evaluated"
    assert entry["torch"]["cudnn"] is True, entry["torch"]
    assert "requires_grad=True" in entry["torch"]["expressed_as"]


def test_torch_answers_gqa_with_enable_gqa(recorded):
    answer = _entry(recorded[2], "bf16-d128-gqa4-infer")["torch"]
    assert answer["status"] == "evaluated" and "enable_gqa=True" in answer["expressed_as"]


def test_fp8_is_not_expressible_in_sdpa(recorded):
    answer = _entry(recorded[2], "fp8-d128-infer")["torch"]
    assert answer == {"status": "not_expressible", "reason": answer["reason"]}
    assert "fp8_e4m3" in answer["reason"]


def test_matrix_compare_torch_lists_the_head_dim_512_disagreement(recorded, capsys):
    suite, path, _ = recorded
    code = cli.main(["matrix", str(suite), "--snapshot", str(path), "--compare", "torch"])
    out = capsys.readouterr().out
    assert code == 1, out
    line = next(line for line in out.splitlines() if "bf16-d512-infer" in line)
    assert "refuses cuDNN" in line and "head_dim" in line
    disagreements = int(re.search(r"disagree: (\d+),", out).group(1))
    assert disagreements >= 1
