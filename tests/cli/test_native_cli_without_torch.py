"""`native build` and `native status` on a machine without torch: one line saying torch is missing
and exit 1 (not built), never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# sys.modules["torch"] = None makes `import torch` raise ImportError, as on a machine without it.
SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None
    from fusedattn_select.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("action", ["build", "status"])
def test_native_without_torch_says_so_in_one_line_and_exits_1(tmp_path, action):
    env = dict(os.environ, FUSEDATTN_SELECT_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", SCRIPT, "native", action], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "torch" in lines[0], result.stderr
    if action == "build":
        assert lines[0].startswith("error: native build: ") and "pip install" in lines[0]
