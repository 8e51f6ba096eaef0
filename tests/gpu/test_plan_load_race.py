"""Loading stored plans on one thread while another launches kernels on the legacy default stream
(what first contact does: the preparer loads plans while the caller runs on torch). cudnn-frontend's
deserialize() captures a warm-up run into a CUDA graph; on a blocking stream that capture breaks
every legacy-stream launch of the process (runtime/streams.py). Run in a child process: a broken
capture would poison this session's CUDA context."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = r"""
import json, threading
import torch
from fusedattn_select import attention
from fusedattn_select.runtime import plans
from fusedattn_select.runtime.dispatcher import dispatcher

wanted, real = [], plans._load_or_build

def recording(cfg, backend, phase, device, plan_key, selector):
    wanted.append((cfg, backend, phase, selector))
    return real(cfg, backend, phase, device, plan_key, selector)

plans._load_or_build = recording
q, k, v = (torch.randn(2, 512, 8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
attention(q, k, v, mask="causal").sum().backward()  # builds and stores its plans
torch.cuda.synchronize()
plans._load_or_build = real
errors = []

def load_again():
    try:
        for _ in range(30):
            dispatcher.forget_plans()
            for cfg, backend, phase, selector in wanted:
                plans.obtain_plan(cfg, backend, phase, q.device, selector=selector)
    except Exception as err:
        errors.append(repr(err))

loader = threading.Thread(target=load_again)
before = plans.plan_stats()
loader.start()
x, launches = torch.randn(4096, device="cuda", requires_grad=True), 0
while loader.is_alive():
    # The caller's kernels on the legacy default stream; a backward launches from autograd's
    # engine thread, which needs no GIL, so it runs while the loader is inside the frontend.
    torch.where(x > 0, x, -x).mul(2).sum().backward()
    launches += 1
loader.join()
torch.cuda.synchronize()
after = plans.plan_stats()
print("RESULT " + json.dumps({"errors": errors, "loads": after["loads"] - before["loads"],
      "load_failures": after["load_failures"] - before["load_failures"], "launches": launches,
      "plans": len(wanted)}), flush=True)
"""


def test_plans_load_beside_the_callers_kernels(tmp_path):
    env = dict(os.environ, FUSEDATTN_SELECT_CACHE_DIR=str(tmp_path / "cache"), FUSEDATTN_SELECT_FIRST_CALLS="wait",
               FUSEDATTN_SELECT_NATIVE="0")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["plans"] >= 2 and result["launches"] > 10, result
    assert result["errors"] == [] and result["load_failures"] == 0, result
    assert result["loads"] == 30 * result["plans"], result
