"""attention(fp8=True) with dropout: on cuDNN 9.19 Hopper the FP8 graphs with dropout make an illegal
memory access (rule cudnn-9.19-hopper-fp8-dropout, docs/rules.md), so such a call must not reach them:
inference and training run to the end with finite results, on every device. In a child process: a
crash would poison this session's CUDA context."""

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

q, k, v = (torch.randn(2, 512, 8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
with torch.no_grad():
    inference = attention(q, k, v, mask="causal", dropout=0.1, fp8=True)
out = attention(q, k, v, mask="causal", dropout=0.1, fp8=True)
out.float().sum().backward()
torch.cuda.synchronize()
cfg = AttnConfig(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=512, seqlen_kv=512, head_dim_qk=64,
                 qkv_dtype="fp8_e4m3", dropout=0.1, mask="causal", is_training=False, scaling_mode="current")
answer = default_selector().select(cfg)
print(json.dumps({"finite": all(bool(t.isfinite().all()) for t in (inference, out, q.grad, k.grad, v.grad)),
                  "calls": dispatch_info()["calls"], "fp8_message": answer.message}))
"""


def test_fp8_calls_with_dropout_run_to_the_end(tmp_path, cudnn_engine):
    env = dict(os.environ, FUSEDATTN_SELECT_CACHE_DIR=str(tmp_path / "cache"), FUSEDATTN_SELECT_FIRST_CALLS="wait")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["finite"] and found["calls"] == 2, found
    fp = cudnn_engine.fingerprint()
    if fp.compute_capability == "9.0" and 91900 <= fp.cudnn_backend_version <= 91999:  # where the rule holds
        assert "cudnn-9.19-hopper-fp8-dropout" in found["fp8_message"], found
