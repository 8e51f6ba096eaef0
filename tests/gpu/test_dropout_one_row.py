"""A steady decode-shaped call with dropout at one query row, head dim 64 and 512 keys: on cuDNN 9.19
Hopper its dense graph makes an illegal memory access (rule cudnn-9.19-hopper-dropout-one-query-row,
docs/rules.md). attention() runs it on its bucket plans and never promotes it to the dense plan, on
every device; the rule decides it where it holds. In a child process: a crash would poison this
session's CUDA context."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = r"""
import json
import torch
from fusedattn_select import attention, dispatch_info
from fusedattn_select.config import AttnConfig
from fusedattn_select.selection.selector import default_selector

q = torch.randn(4, 1, 8, 64, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(4, 512, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
for _ in range(20):
    out = attention(q, k, v, dropout=0.1)
torch.cuda.synchronize()
dense = default_selector().select_dense(AttnConfig(batch_size=4, num_heads_q=8, num_heads_kv=8, seqlen_q=1, seqlen_kv=512, head_dim_qk=64,
                          dropout=0.1, is_training=False))
info = dispatch_info()
print(json.dumps({"finite": bool(out.isfinite().all()), "fused": info["fused_calls"], "calls": info["calls"],
                  "promotions": info["promotions"], "dense_message": dense.message}))
"""


def test_a_one_row_dropout_call_runs_without_its_dense_plan(tmp_path, cudnn_engine):
    env = dict(os.environ, FUSEDATTN_SELECT_CACHE_DIR=str(tmp_path / "cache"), FUSEDATTN_SELECT_FIRST_CALLS="wait",
               FUSEDATTN_SELECT_DENSE_AFTER="1", FUSEDATTN_SELECT_DENSE_BUILDS="inline")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["finite"] and found["calls"] == 20 and found["fused"] == 20, found
    fp = cudnn_engine.fingerprint()
    if fp.compute_capability == "9.0" and 91900 <= fp.cudnn_backend_version <= 91999:  # where the rule holds
        assert "cudnn-9.19-hopper-dropout-one-query-row" in found["dense_message"], found
        assert found["promotions"] == 0, found
