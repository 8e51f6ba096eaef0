"""tools/verify_sweep.py without a GPU: the result file's name and the summary of its rows."""

from __future__ import annotations

from tools import verify_sweep


def test_device_tag_is_the_gpu_model_as_result_names_write_it():
    assert verify_sweep.device_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert verify_sweep.device_tag("NVIDIA H200") == "h200"
    assert verify_sweep.device_tag("Something else") == "gpu"


def _row(name, full, verify, ms=(100.0, 250.0), verified=False, rejected=False):
    return {"suite": "s", "name": name, "key": name,
            "full": {"answer": full, "ms": ms[0], "message": ""},
            "verify": {"answer": verify, "ms": ms[1], "verified": verified, "numerics_rejected": rejected,
                       "message": "results differ" if rejected else ""}}


def test_summary_counts_supported_answers_that_miss_the_reference():
    rows = [_row("a", "F16", "F16", verified=True), _row("b", "F16", "NONE", rejected=True),
            _row("c", "NONE", "NONE"), _row("d", "FP8", "FP8", ms=(100.0, 150.0))]
    summary = verify_sweep._summary(rows)
    assert summary["supported_at_full"] == 3 and summary["verified"] == 1
    assert summary["supported_missing_the_reference"] == 1 and summary["missing"] == ["s:b: results differ"]
    assert summary["supported_not_checked"] == 1
    assert summary["median_verify_over_full"] == 2.5
