"""Fields a declared table's check did not read are no data for that table, naming the field, never a declared "yes":
ragged (THD) inputs and padding masks for CK (its group mode is not in the table), softmax variants for hipDNN,
gradient dtypes for CK and PyTorch SDPA, ragged inputs for PyTorch SDPA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fusedattn_select.config import AttnConfig
from fusedattn_select.probing.rocm import DeclaredRocmEngine, load_table
from fusedattn_select.types import Outcome, Phase, ProbeDepth

ROOT = Path(__file__).resolve().parents[3]
FWD, BWD = Phase.FORWARD, Phase.BACKWARD
BASE = dict(batch_size=2, num_heads_q=16, num_heads_kv=16, seqlen_q=4096, seqlen_kv=4096, head_dim_qk=128)
THD = dict(qkv_layout="thd_thd_thd", mask="padding_causal")


def problem(**changes) -> AttnConfig:
    return AttnConfig(**{**BASE, **changes})


def probe(cfg: AttnConfig, phase: Phase = FWD, arch: str = "gfx942", tables=None):
    engine = DeclaredRocmEngine(arch, tables) if tables else DeclaredRocmEngine(arch)
    return engine.probe(cfg, cfg.candidate, phase, ProbeDepth.FAST)


# (table, problem, phase, the same problem without the field, text naming the field); the problem without the
# field is declared by that table, so only the field makes it no data.
CASES = {
    "ck-thd-forward": ("ck_fmha", problem(**THD), FWD, dict(qkv_layout="bshd_bshd_bshd", mask="causal"),
                       "qkv_layout='thd_thd_thd' (ragged, THD)"),
    "ck-thd-backward": ("ck_fmha", problem(**THD), BWD, dict(qkv_layout="bshd_bshd_bshd", mask="causal"),
                        "qkv_layout='thd_thd_thd' (ragged, THD)"),
    "ck-thd-q-only": ("ck_fmha", problem(qkv_layout="thd_bshd_bshd", mask="padding"), FWD,
                      dict(qkv_layout="bshd_bshd_bshd", mask="no_mask"), "qkv_layout='thd_bshd_bshd' (ragged, THD)"),
    "ck-padding": ("ck_fmha", problem(mask="padding"), FWD, dict(mask="no_mask"), "mask='padding' (padding)"),
    "ck-do-dtype": ("ck_fmha", problem(do_dtype="fp16"), BWD, dict(do_dtype=None), "do_dtype='fp16'"),
    "ck-dqkv-dtype": ("ck_fmha", problem(dqkv_dtype="fp16"), BWD, dict(dqkv_dtype=None), "dqkv_dtype='fp16'"),
    "hipdnn-softmax": ("hipdnn_sdpa", problem(mask="causal_bottom_right", is_training=False, softmax="off_by_one"),
                       FWD, dict(softmax="vanilla"), "softmax='off_by_one'"),
    "sdpa-thd": ("pytorch_sdpa", problem(**THD, is_training=False), FWD, dict(qkv_layout="bshd_bshd_bshd"),
                 "qkv_layout='thd_thd_thd'"),
    "sdpa-do-dtype": ("pytorch_sdpa", problem(do_dtype="fp16"), BWD, dict(do_dtype=None), "do_dtype='fp16'"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_field_the_check_does_not_read_is_no_data_naming_it(case):
    table, cfg, phase, without, named = CASES[case]
    assert probe(cfg.replace(**without), phase, tables=(table,)).outcome is Outcome.SUPPORTED
    v = probe(cfg, phase, tables=(table,))
    assert v.outcome is Outcome.NO_DATA, v.message
    assert named in v.message and "not declared" in v.message


def test_the_ck_table_records_no_group_mode_and_its_pinned_specs_name_it_only_in_a_rule():
    ck = load_table("ck_fmha")
    assert "group" not in json.dumps(dict(ck.facts), default=list).lower()
    (specs,) = [s for s in ck.sources if s.path.endswith("fmha_arch_specs.json")]
    pinned = json.loads((ROOT / specs.pinned).read_text(encoding="utf-8"))
    assert pinned["global_rules"]["group_mode_requires_padding"] is True
    v = probe(problem(**THD), tables=("ck_fmha",))
    assert "CK's group mode" in v.message and specs.commit[:12] in v.message


@pytest.mark.parametrize("phase", [FWD, BWD])
def test_packed_thd_training_is_never_declared_by_any_table(phase):
    cfg = problem(**THD, batch_size=8, num_heads_q=32, num_heads_kv=8, seqlen_q=2048, seqlen_kv=2048)
    for arch in ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201"):
        v = probe(cfg, phase, arch)
        assert v.outcome is Outcome.NO_DATA, (arch, v.message)
        assert "ck_fmha: qkv_layout='thd_thd_thd'" in v.message
    mha = probe(cfg.replace(num_heads_q=8, is_training=False))  # SDPA's efficient kernel would take it, but THD
    assert mha.outcome is Outcome.NO_DATA and "pytorch_sdpa: qkv_layout='thd_thd_thd'" in mha.message


def test_why_answers_no_data_for_the_packed_thd_example():
    out = subprocess.run(
        [sys.executable, "-m", "fusedattn_select.cli", "why", str(ROOT / "configs/llama-3-8b.yaml"), "--platform",
         "rocm", "--arch", "gfx942", "--name", "train-bf16-packed-thd"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert "-> F16" not in out.stdout and "ck_fmha declares it" not in out.stdout
    assert "qkv_layout='thd_thd_thd' (ragged, THD)" in out.stdout
