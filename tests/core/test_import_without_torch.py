"""The package works on a machine with neither torch nor cuDNN: it answers NONE and says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# sys.modules[name] = None makes `import name` raise ImportError, as on a machine without it.
SCRIPT = textwrap.dedent("""
    import json, sys
    for name in ("torch", "cudnn", "cuda", "cuda.bindings"):
        sys.modules[name] = None

    import fusedattn_select
    from fusedattn_select import AttnConfig, Backend, select
    from fusedattn_select.cli import main

    cfg = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128)
    selection = select(cfg)
    code = main(["info"])
    print(json.dumps({
        "backend": selection.backend.value,
        "message": selection.message,
        "stages": sorted({v.stage for v in selection.verdicts}),
        "info_exit": code,
    }))
""")


def test_package_answers_and_info_runs_without_torch_or_cudnn(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FUSEDATTN_SELECT_SNAPSHOT"}
    env["FUSEDATTN_SELECT_CACHE_DIR"] = str(tmp_path / "cache")
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    facts = json.loads(lines[-1])
    info = "\n".join(lines[:-1])
    assert facts["backend"] == "NONE"
    # No GPU here: the bundled H100 snapshots answer, and they do not hold this problem.
    assert facts["stages"] == ["snapshot"]
    assert facts["message"].startswith(
        "F16 forward and backward no data at snapshot: not recorded in h100-configs.json+h100-hopper-suite.json")
    assert "only a live probe" in facts["message"]
    assert facts["info_exit"] == 0
    assert "torch                      not installed" in info
    assert "Traceback" not in result.stderr
