"""A nearest recorded problem whose probe failed when it was recorded (out of memory) is shown as no
answer, never as NONE (a refusal): in `why`'s text and in its JSON (`recorded_answer`).

The snapshot is recorded with RecordingTestEngine (tests/conftest.py), a test double whose
seqlen_q == 999 probe fails; which neighbour is listed is the library's ranking."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

from fusedattn_select.cli.main import main

# The suite's out-of-memory entry asked in fp16: its nearest recorded problem is that entry (bf16).
ASKED = ["--set", "batch_size=2", "--set", "num_heads_q=16", "--set", "num_heads_kv=4", "--set", "seqlen_q=999",
         "--set", "seqlen_kv=1024", "--set", "head_dim_qk=128", "--set", "is_training=false",
         "--set", "qkv_dtype=fp16"]


def why(snapshot, *extra: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["why", "--snapshot", str(snapshot), *ASKED, *extra])
    return code, out.getvalue()


def test_a_failed_neighbour_is_no_answer_in_the_text(recorded_snapshot):
    code, text = why(recorded_snapshot)
    assert code == 3
    first = next(line for line in text.splitlines() if line.strip().startswith("1. "))
    assert "out-of-memory" in first, text
    assert "recorded NONE" not in first and "recorded no answer (its probe failed)" in first, first
    # A real refusal among the neighbours is still NONE.
    assert any("head-dim-512" in line and "recorded NONE: " in line for line in text.splitlines()), text


def test_a_failed_neighbour_is_failed_in_the_json(recorded_snapshot):
    code, text = why(recorded_snapshot, "--json")
    assert code == 3
    nearest = json.loads(text)["results"][0]["nearest"]
    by_name = {near["name"]: near for near in nearest}
    assert by_name["out-of-memory"]["recorded_answer"] == "failed"
    assert by_name["head-dim-512"]["recorded_answer"] == "NONE"
    assert by_name["infer"]["recorded_answer"] == "F16"
