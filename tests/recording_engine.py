"""RecordingTestEngine, the test double of the snapshot and CLI tests (the `recording_engine` fixture of
tests/conftest.py). A module of its own so that a test subclassing it imports it by a name no other
folder's conftest.py shadows. Importable because pytest puts tests/ on sys.path."""

from __future__ import annotations

from fusedattn_select.types import Fingerprint, Outcome, Provenance, Verdict


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
