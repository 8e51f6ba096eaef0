"""Sample fingerprints and verdicts shared by the store tests, and helpers to inspect a store."""

import dataclasses
import logging
import sqlite3

from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, ProbeDepth, Verdict

H100 = Fingerprint(
    platform="cuda", device_name="NVIDIA H100 80GB HBM3", compute_capability="9.0", sm_count=132,
    cudnn_backend_version=91900, cudnn_frontend_version="1.32.0", driver_version="580.95.05",
    library_version="0.1.0",
)
H200 = dataclasses.replace(H100, device_name="NVIDIA H200", sm_count=132)
KEY = "0123456789abcdef0123456789abcdef"


def verdicts(outcome=Outcome.SUPPORTED, depth=ProbeDepth.FULL, message=""):
    stage = "build_plans" if outcome is Outcome.SUPPORTED else "check_support"
    return tuple(
        Verdict(Backend.F16, phase, outcome, stage, message, detail=message, depth=depth,
                timings_ms=(("check_support", 3.5), ("build_plans", 250.25)))
        for phase in (Phase.FORWARD, Phase.BACKWARD)
    )


SUPPORTED_FULL = verdicts()
REJECTED_FAST = verdicts(Outcome.UNSUPPORTED, ProbeDepth.FAST, "hidden_dim should be multiple of 8")


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == "fusedattn_select" and r.levelno == logging.WARNING]


def raw(store):
    """A second, plain SQLite connection to a persistent store's file (to damage rows)."""
    store.close()
    return sqlite3.connect(store.path, isolation_level=None)
