"""A snapshot file must say where its answers were recorded: a fingerprint without the device, its
compute capability, SM count, cuDNN, cudnn-frontend, driver or library version, or a file without
its recording time, is refused naming the field, never replayed as "recorded on cuda, cuDNN unknown"
(and a malformed compute capability is an error line, not a traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusedattn_select.errors import SnapshotError
from fusedattn_select.probing.snapshot import SnapshotEngine, read_header

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "fusedattn_select" / "snapshots" / "h100-configs.json"
GPT2 = str(ROOT / "configs" / "gpt2.yaml")

BROKEN = [
    ("device_name", None, "fingerprint.device_name"),
    ("device_name", "", "fingerprint.device_name"),
    ("compute_capability", None, "fingerprint.compute_capability"),
    ("compute_capability", "nine", "fingerprint.compute_capability"),
    ("sm_count", None, "fingerprint.sm_count"),
    ("sm_count", -5, "fingerprint.sm_count"),
    ("sm_count", True, "fingerprint.sm_count"),
    ("cudnn_backend_version", None, "fingerprint.cudnn_backend_version"),
    ("cudnn_backend_version", 0, "fingerprint.cudnn_backend_version"),
    ("cudnn_frontend_version", None, "fingerprint.cudnn_frontend_version"),
    ("driver_version", None, "fingerprint.driver_version"),
    ("library_version", None, "fingerprint.library_version"),
    ("platform", {"a": 1}, "fingerprint.platform"),
]


@pytest.fixture(scope="module")
def bundled() -> dict:
    return json.loads(BUNDLED.read_text())


def written(tmp_path: Path, data: dict, name: str = "edited.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("field", "value", "named"), BROKEN)
def test_a_fingerprint_missing_or_malformed_field_is_refused_naming_it(tmp_path, bundled, field, value, named):
    fingerprint = dict(bundled["fingerprint"])
    if value is None:
        del fingerprint[field]
    else:
        fingerprint[field] = value
    path = written(tmp_path, {**bundled, "fingerprint": fingerprint})
    with pytest.raises(SnapshotError, match=named):
        SnapshotEngine.load(path)
    with pytest.raises(SnapshotError, match=named):
        read_header(path)


@pytest.mark.parametrize("recorded_at", [None, "", "yesterday", 20261127])
def test_a_file_without_its_recording_time_is_refused(tmp_path, bundled, recorded_at):
    data = dict(bundled)
    if recorded_at is None:
        del data["recorded_at"]
    else:
        data["recorded_at"] = recorded_at
    with pytest.raises(SnapshotError, match="recorded_at"):
        SnapshotEngine.load(written(tmp_path, data))


def test_the_bundled_snapshots_still_load():
    for path in sorted(BUNDLED.parent.glob("h[12]00-*.json")):
        if "fp8-speed" not in path.name:
            assert SnapshotEngine.load(path).files[0].fingerprint.device_name.startswith("NVIDIA H")


def why(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEDATTN_SELECT_")}
    return subprocess.run([sys.executable, "-m", "fusedattn_select.cli", "why", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("change", "named"), [
    ({"fingerprint": {"platform": "cuda"}}, "fingerprint.device_name"),
    ("compute_capability", "fingerprint.compute_capability"),
])
def test_why_refuses_such_a_file_with_one_error_line_and_exit_2(tmp_path, bundled, change, named):
    if change == "compute_capability":
        change = {"fingerprint": {**bundled["fingerprint"], "compute_capability": "nine"}}
    result = why(GPT2, "--snapshot", str(written(tmp_path, {**bundled, **change})))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: snapshot ") and named in result.stderr, result.stderr
