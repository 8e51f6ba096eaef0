"""Bundled snapshots agree with live probes on the device and versions they were recorded with.

The probe-suite sample (probes/hopper-suite-sample.yaml) and the llama-3-8b model file are probed
live and compared, graph by graph, with the bundled snapshot of this GPU. Where the device, cuDNN
or cudnn-frontend version differs from the snapshot's fingerprint, the comparison does not apply
and the test skips, saying which value differs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fusedattn_select.config_files import load_config_file
from fusedattn_select.probing import bundled_snapshot
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.selector import Selector

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200"}


def _snapshot_for(live, suite: str) -> SnapshotEngine:
    fingerprint = live.fingerprint()
    target = TARGETS.get(fingerprint.device_name)
    if target is None:
        pytest.skip(f"no bundled snapshot for {fingerprint.device_name}")
    path = bundled_snapshot(target, suite)
    if not path.exists():
        pytest.skip(f"{path.name} is not installed")
    snapshot = SnapshotEngine.load(path)
    recorded = snapshot.fingerprint()
    for field in ("device_name", "cudnn_backend_version", "cudnn_frontend_version"):
        if getattr(recorded, field) != getattr(fingerprint, field):
            pytest.skip(f"{path.name} was recorded with {field}={getattr(recorded, field)!r}, "
                        f"this device has {getattr(fingerprint, field)!r}")
    return snapshot


def _disagreements(live_engine, snapshot: SnapshotEngine, config_file: Path) -> tuple[int, list[str]]:
    """Graphs compared, and one line per graph whose live verdict differs from the recorded one.

    A rejection must agree in stage and cuDNN's message too. An acceptance agrees on the outcome
    alone: a snapshot recorded at depth "full" names build_plans where a fast live probe stops at
    check_support. A recorded numerics rejection (depth verify found results that miss the
    reference) is compared with a live probe at depth verify, the only depth that can find it.
    """
    live, recorded = Selector(live_engine), Selector(snapshot)
    compared, differences = 0, []
    for entry in load_config_file(config_file).entries:
        want = recorded.select(entry.config)
        numerics = any(w.stage == "numerics" and not w.supported for w in want.verdicts)
        got = live.select(entry.config, "verify" if numerics else "fast")
        for g, w in zip(got.verdicts, want.verdicts, strict=True):
            compared += 1
            same = (g.phase, g.outcome) == (w.phase, w.outcome) and (
                g.supported or (g.stage, g.message) == (w.stage, w.message)
            )
            if not same:
                differences.append(
                    f"{entry.name} {g.phase.value}: live {g.outcome.value} at {g.stage} ({g.message}) "
                    f"!= snapshot {w.outcome.value} at {w.stage} ({w.message})"
                )
    return compared, differences


def test_live_probes_of_the_suite_sample_agree_with_the_bundled_suite_snapshot(cudnn_engine):
    snapshot = _snapshot_for(cudnn_engine, "hopper-suite")
    compared, differences = _disagreements(cudnn_engine, snapshot, ROOT / "probes" / "hopper-suite-sample.yaml")
    assert compared >= 55
    assert differences == []


def test_live_probes_of_a_model_file_agree_with_the_bundled_configs_snapshot(cudnn_engine):
    snapshot = _snapshot_for(cudnn_engine, "configs")
    compared, differences = _disagreements(cudnn_engine, snapshot, ROOT / "configs" / "llama-3-8b.yaml")
    assert compared >= 10
    assert differences == []
