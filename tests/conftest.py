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
from fusedattn_select.types import Fingerprint, Outcome, Provenance, Verdict


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
class RecordingTestEngine:
    """TEST DOUBLE standing in for a live device when recording snapshots in CPU tests.

    It probes nothing: head dims above 256 are "unsupported at check_support", seqlen_q == 999
    "fails" (out of memory), everything else is "supported". Real snapshots are recorded on GPUs.
    """

    name = "recording-test-engine"
    provenance = Provenance.LIVE_PROBE
    FINGERPRINT = Fingerprint("test-double", "Test GPU H100", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")

    def __init__(self) -> None:
        self.calls = 0

    def fingerprint(self) -> Fingerprint:
        return self.FINGERPRINT

    def probe(self, cfg, backend, phase, depth) -> Verdict:
        self.calls += 1
        timings = (("validate", 0.25), ("check_support", 2.5))
        if cfg.seqlen_q == 999:
            return Verdict(backend, phase, Outcome.FAILED, "build_plans", "CUDA out of memory",
                           "cudaErrorMemoryAllocation: out of memory", Provenance.LIVE_PROBE, depth, timings)
        if max(cfg.head_dim_qk, cfg.resolved_head_dim_v) > 256:
            return Verdict(backend, phase, Outcome.UNSUPPORTED, "check_support", "head dim above 256",
                           "[cudnn_frontend] Error: No valid engine configs for SDPA (scripted raw text)",
                           Provenance.LIVE_PROBE, depth, timings)
        return Verdict(backend, phase, Outcome.SUPPORTED, "check_support", "", "", Provenance.LIVE_PROBE,
                       depth, timings)


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
