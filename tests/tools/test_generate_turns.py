"""tools/generate_turns.py on the CPU (FIRST_CONTACT_DEVICE=cpu: the code paths, no figure means
anything): one process switches a tiny model between the two attention implementations in turns."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tools.first_contact import options
from torch_abilities import need_cpu_flash_with_grouped_kv

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256}


def test_turns_alternate_the_sides_and_pair_their_speeds(monkeypatch, tmp_path, capsys):
    need_cpu_flash_with_grouped_kv()
    from tools import generate_turns

    monkeypatch.setenv("FIRST_CONTACT_DEVICE", "cpu")
    monkeypatch.setitem(options.GENERATE, "tiny", (TINY, 1, 8, 3, 9))
    out = tmp_path / "turns.json"
    assert generate_turns.main(["--model", "tiny", "--turns", "3", "-o", str(out)]) == 0
    whole = json.loads(out.read_text())
    assert whole == json.loads(capsys.readouterr().out)
    assert whole["schema"] == generate_turns.SCHEMA and len(whole["runs"]) == 1
    document = whole["runs"][0]
    assert document["model"] == "tiny"
    rounds = document["rounds"]
    assert [r["order"] for r in rounds] == [["ours", "flash"], ["flash", "ours"], ["ours", "flash"]]
    for r in rounds:
        assert r["ratio"] == pytest.approx(r["tokens_per_s"]["ours"] / r["tokens_per_s"]["flash"])
        calls = r["ours_calls"]
        # Every layer of every forward of our generate() went through attention(): 2 layers, 3 forwards.
        assert calls["torch_calls"] + calls["fused_calls"] + calls["fallback_calls"] == 2 * 3
    assert document["ratio_range"][0] <= document["ratio_median"] <= document["ratio_range"][1]


def test_turns_must_be_at_least_one(capsys):
    from tools import generate_turns

    with pytest.raises(SystemExit) as exited:
        generate_turns.main(["--turns", "0"])
    assert exited.value.code == 2 and "--turns=0: must be at least 1" in capsys.readouterr().err


def test_profile_names_each_sides_host_ops(monkeypatch, tmp_path):
    need_cpu_flash_with_grouped_kv()
    from tools import generate_turns

    monkeypatch.setenv("FIRST_CONTACT_DEVICE", "cpu")
    monkeypatch.setitem(options.GENERATE, "tiny", (TINY, 1, 8, 3, 9))
    out = tmp_path / "turns.json"
    assert generate_turns.main(["--model", "tiny", "--turns", "1", "--profile", "-o", str(out)]) == 0
    profiles = json.loads(out.read_text())["runs"][0]["profiles"]
    assert sorted(profiles) == ["flash", "ours"]
    for profile in profiles.values():
        assert profile["tokens_per_s"] > 0 and profile["host_self_us"] > 0
        assert profile["top_host_ops"] and all(row["count"] >= 1 for row in profile["top_host_ops"])
        # On the CPU nothing is a device kernel.
        assert profile["kernel_launches"] == 0 and profile["top_kernels"] == []
        spent = [row["us"] for row in profile["top_host_ops"]]
        assert spent == sorted(spent, reverse=True)
