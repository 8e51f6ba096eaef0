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

# A process (python -c SALVAGER DIR N) that forces the swap a damaged store file gets N times on a
# sound one, then prints "salvaged": the salvage that concurrent writers must survive.
SALVAGER = """
import sys, time
from pathlib import Path
from fusedattn_select.store import database
db = database.Database(Path(sys.argv[1]) / "decisions.sqlite3")
for _ in range(int(sys.argv[2])):
    with db._exclusive():  # the swap a damaged file gets, forced on a sound one
        db._swap.make("forced by the test")
    time.sleep(0.02)
print("salvaged", flush=True)
"""


def race_writers_with_salvage(cache_dir, writer: str, salvages: int, writers: int = 4, puts: int = 150) -> set:
    """Run `writers` processes of the script `writer` (argv: DIR NAME PUTS; prints each key whose write
    was acknowledged) while a SALVAGER process swaps the store `salvages` times; the acknowledged keys."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    running = [subprocess.Popen([sys.executable, "-c", writer, str(cache_dir), f"w{w}", str(puts)],
                                stdout=subprocess.PIPE, text=True, env=env) for w in range(writers)]
    salvager = subprocess.Popen([sys.executable, "-c", SALVAGER, str(cache_dir), str(salvages)],
                                stdout=subprocess.PIPE, text=True, env=env)
    acknowledged = set()
    for process in running:
        out, _ = process.communicate(timeout=120)
        acknowledged.update(out.split())
    assert salvager.communicate(timeout=120)[0].strip() == "salvaged"
    return acknowledged


def verdicts(outcome=Outcome.SUPPORTED, depth=ProbeDepth.FULL, message=""):
    stage = "build_plans" if outcome is Outcome.SUPPORTED else "check_support"
    return tuple(
        Verdict(Backend.F16, phase, outcome, stage, message, detail=message, depth=depth,
                timings_ms=(("check_support", 3.5), ("build_plans", 250.25)))
        for phase in (Phase.FORWARD, Phase.BACKWARD)
    )


SUPPORTED_FULL = verdicts()
SUPPORTED_FAST = verdicts(depth=ProbeDepth.FAST)
REJECTED_FAST = verdicts(Outcome.UNSUPPORTED, ProbeDepth.FAST, "hidden_dim should be multiple of 8")


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == "fusedattn_select" and r.levelno == logging.WARNING]


def raw(store):
    """A second, plain SQLite connection to a persistent store's file (to damage rows)."""
    store.close()
    return sqlite3.connect(store.path, isolation_level=None)
