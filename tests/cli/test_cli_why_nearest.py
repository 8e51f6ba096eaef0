"""`why` on a problem a snapshot has no data for: still no data (exit 3), plus the nearest recorded
problems, marked as other problems, in text and in JSON (issue 36, item 2).

Snapshots are recorded with RecordingTestEngine (a test double, tests/conftest.py), or the bundled
H100 ones.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from fusedattn_select import AttnConfig, Backend, cli
from fusedattn_select.cli.why import NEAREST_HEADER
from fusedattn_select.probing.choice import bundled_engine
from fusedattn_select.types import Outcome, ProbeDepth

# The conftest suite's defaults at batch 3: train-causal's class at a batch it did not record.
UNRECORDED = ["--set", "batch_size=3", "--set", "num_heads_q=16", "--set", "num_heads_kv=4",
              "--set", "seqlen_q=1024", "--set", "seqlen_kv=1024", "--set", "head_dim_qk=128", "--set", "mask=causal"]
LLAMA_AT_BATCH_7 = ["--set", "batch_size=7", "--set", "num_heads_q=32", "--set", "num_heads_kv=8",
                    "--set", "seqlen_q=1000", "--set", "seqlen_kv=1000", "--set", "head_dim_qk=128", "--set", "mask=causal"]
# Llama 3's class in fp16: no bundled snapshot records it at any shape (they record it in bf16).
LLAMA_FP16_AT_BATCH_7 = [*LLAMA_AT_BATCH_7, "--set", "qkv_dtype=fp16"]


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_no_data_stays_no_data_and_lists_the_nearest_recorded_problems_after_it(capsys, recorded_snapshot):
    code, out, err = run(capsys, "why", "--snapshot", str(recorded_snapshot), *UNRECORDED)
    assert code == 3, err
    lines = out.splitlines()
    no_data = next(i for i, line in enumerate(lines) if line.startswith("  -> "))
    assert lines[no_data].startswith("  -> no data (only a live probe can answer): F16 forward and backward no data")
    assert lines[no_data + 1] == f"  {NEAREST_HEADER}:"
    assert "OTHER problems, not an answer for this one" in NEAREST_HEADER
    assert lines[no_data + 2] == "    1. test-suite.yaml/train-causal [test-gpu.json]: recorded F16 (depth fast)"
    assert lines[no_data + 3] == "       differs: batch_size=2 (asked 3)"
    assert lines[no_data + 4].startswith("    2. ") and len([l for l in lines if l.startswith("       differs: ")]) == 3


def test_a_recorded_none_is_listed_as_that_problem_s_verdict_with_its_reason(capsys, recorded_snapshot):
    code, out, _ = run(capsys, "why", "--snapshot", str(recorded_snapshot), *UNRECORDED[:-2],
                       "--set", "head_dim_qk=384", "--set", "is_training=false")
    assert code == 3
    assert ("    1. test-suite.yaml/head-dim-512 [test-gpu.json]: recorded NONE: F16 forward not supported at "
            "check_support: head dim above 256 (depth fast)") in out
    assert "differs: batch_size=2 (asked 3), head_dim_qk=512 (asked 384)" in out


def test_json_keeps_the_no_data_answer_and_adds_the_nearest_problems(capsys, recorded_snapshot):
    code, out, _ = run(capsys, "why", "--snapshot", str(recorded_snapshot), *UNRECORDED, "--json")
    assert code == 3
    result = json.loads(out)["results"][0]
    assert result["selection"]["no_data"] is True and result["selection"]["backend"] == "NONE"
    nearest = result["nearest"]
    assert nearest[0]["name"] == "train-causal" and len(nearest) == 3
    first = nearest[0]
    assert first["differs"] == [{"field": "batch_size", "asked": 3, "recorded": 2}]
    assert first["recorded_backend"] == "F16" and first["recorded_reasons"] == []
    assert first["snapshot"] == "test-gpu.json" and first["suite"] == "test-suite.yaml"
    assert first["config"]["batch_size"] == 2 and {v["phase"] for v in first["recorded_verdicts"]} == {"forward", "backward"}


def test_an_answered_problem_lists_no_nearest_problems(capsys, recorded_snapshot):
    code, out, _ = run(capsys, "why", "--snapshot", str(recorded_snapshot), *UNRECORDED[2:], "--set", "batch_size=2")
    assert code == 0 and NEAREST_HEADER not in out
    code, out, _ = run(capsys, "why", "--snapshot", str(recorded_snapshot), *UNRECORDED[2:], "--set", "batch_size=2",
                       "--json")
    assert code == 0 and json.loads(out)["results"][0]["nearest"] == []


def test_a_refusal_lists_no_nearest_problems(capsys, recorded_snapshot):
    code, out, _ = run(capsys, "why", "--snapshot", str(recorded_snapshot), *UNRECORDED[2:], "--set", "batch_size=2",
                       "--set", "head_dim_qk=512", "--set", "is_training=false", "--set", "mask=no_mask")
    assert code == 1 and NEAREST_HEADER not in out


def test_bundled_snapshots_answer_an_unrecorded_llama_shape_from_its_bucket_with_no_nearest(capsys):
    # Llama 3's bf16 training class is recorded over a bucket ladder: batch 7, length 1000 runs in B=8, S=1024.
    engine = bundled_engine("h100")
    asked = AttnConfig(batch_size=7, num_heads_q=32, num_heads_kv=8, seqlen_q=1000, seqlen_kv=1000,
                       head_dim_qk=128, mask="causal")
    form = engine.bucket_for(asked)
    assert (form.batch_size, form.seqlen_q, form.seqlen_kv) == (8, 1024, 1024)
    recorded = {engine.probe(form, Backend.F16, phase, ProbeDepth.FAST).outcome for phase in form.phases}
    code, out, err = run(capsys, "why", "--target", "h100", *LLAMA_AT_BATCH_7)
    assert code == (0 if recorded == {Outcome.SUPPORTED} else 1), err
    assert "  answered from: snapshot, bucket B=8 S_q=1024 S_kv=1024 " in out
    assert "no data" not in out and NEAREST_HEADER not in out


def test_bundled_snapshots_answer_an_unrecorded_llama_class_no_data_with_llama_nearest(capsys):
    code, out, err = run(capsys, "why", "--target", "h100", *LLAMA_FP16_AT_BATCH_7)
    assert code == 3, err
    assert "  -> no data (only a live probe can answer)" in out
    # Llama 3 8B's class in bf16 at other shapes comes first: the model suite's (batch 1, length 4096) is
    # closer in size than configs/llama-3-8b.yaml's (batch 2, length 8192), which comes later (an fp16
    # problem of another head count, Pythia's, may sit between them: one field more, closer lengths).
    assert ("    1. hf-models.yaml/llama-3.1-8b/full_attention/train [h100-models.json]: recorded F16 (depth verify)\n"
            "       differs: batch_size=1 (asked 7), seqlen_q=4096 (asked 1000), seqlen_kv=4096 (asked 1000), "
            "qkv_dtype=bf16 (asked fp16)\n") in out
    later = re.search(r"^    ([2-9])\. llama-3-8b\.yaml/train-bf16 \[h100-configs\.json\]: recorded F16 \(depth verify\)\n"
                      r"       differs: batch_size=2 \(asked 7\), seqlen_q=8192 \(asked 1000\), seqlen_kv=8192 "
                      r"\(asked 1000\), qkv_dtype=bf16 \(asked fp16\)$", out, re.MULTILINE)
    assert later is not None, out


def test_the_nearest_list_imports_neither_torch_nor_transformers():
    # In a fresh process: this one may have imported torch for other tests.
    code = (
        "import sys\n"
        "from fusedattn_select import cli\n"
        f"rc = cli.main(['why', '--target', 'h100', *{LLAMA_FP16_AT_BATCH_7!r}])\n"
        "assert rc == 3, rc\n"
        "loaded = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "print('LOADED', loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "nearest recorded problems" in done.stdout
    assert done.stdout.rstrip().endswith("LOADED []")
