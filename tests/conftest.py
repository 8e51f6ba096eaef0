"""Shared test setup.

Isolation: every test gets its own cache directory, no snapshot from the environment, a fresh
process-wide selector and the runtime's settings read again at its first use, so no test sees
another test's (or the user's) decisions or settings.
Snapshot fixtures: a small suite file and a snapshot of it recorded with a test double.
"""

from __future__ import annotations

import contextlib

import pytest

from fusedattn_select.runtime.run_settings import run_settings
from fusedattn_select.selection.selector import set_default_selector
from recording_engine import RecordingTestEngine


@pytest.fixture(autouse=True)
def isolated_selector(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FUSEDATTN_SELECT_SNAPSHOT", raising=False)
    set_default_selector(None)
    run_settings.reread()  # the runtime's settings as this test's environment has them
    yield
    set_default_selector(None)
    run_settings.reread()


@pytest.fixture
def use_settings():
    """use_settings(**changes): the runtime's settings changed (run_settings.use) until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda **changes: stack.enter_context(run_settings.use(**changes))


# ----- a recorded test snapshot ---------------------------------------------------------------
SUITE_YAML = """
name: test-suite
description: problems for the snapshot and CLI tests
defaults: {batch_size: 2, num_heads_q: 16, num_heads_kv: 4, seqlen_q: 1024, seqlen_kv: 1024, head_dim_qk: 128}
configs:
  - {name: train-causal, mask: causal}
  - {name: infer, is_training: false}
  - {name: head-dim-512, head_dim_qk: 512, is_training: false}
  - {name: pre-scale-bias, bias: pre_scale_bias}
  - {name: out-of-memory, seqlen_q: 999, is_training: false}
  - {name: fp8, qkv_dtype: fp8_e4m3, mask: causal, num_heads_kv: 16}  # MHA: rule cudnn-9.19-hopper-fp8-gqa-backward refuses GQA
  - {name: train}
"""


@pytest.fixture
def recording_engine():
    return RecordingTestEngine()


@pytest.fixture
def suite_file(tmp_path):
    path = tmp_path / "test-suite.yaml"
    path.write_text(SUITE_YAML)
    return path


@pytest.fixture
def recorded_snapshot(tmp_path, suite_file):
    """A snapshot of `suite_file` recorded with RecordingTestEngine (a test double)."""
    from fusedattn_select.selection.recorder import record_snapshot, write_snapshot

    return write_snapshot(record_snapshot([suite_file], RecordingTestEngine()), tmp_path / "test-gpu.json")
