"""cudnn-frontend 1.32's plan walk: an incident inside "no plan in the list could be built" is a failed
probe, never a cached "not supported".

Frontend 1.32 (cudnn/_pygraph.py, pygraph.build_plans) walks the ranked plans and reports, when none
builds, one cudnnGraphNotSupportedError whose text lists every entry's failure:
"no plan in the list could be built:\\n  [i] <plan name>: <error>" (and "the backend declined: ..." when
the backend declined earlier). A python engine turns an ImportError at build time into such a
failure (engines' build_plan: NotImplementedError(f"{name}: {exc}")), so a process whose JIT
dependency cannot load ("No module named 'cutlass'") answered NONE for a graph the same device and
versions build in a working process, and the selector cached it under the shared fingerprint.

The frontend is not needed: as in test_cudnn_messages.py, `classify_exception` takes the frontend
module, here a stand-in with only the exception type it looks up; the texts are the frontend's
formats.
"""

from __future__ import annotations

from types import SimpleNamespace

from fusedattn_select.probing.cudnn.messages import CudnnUnsupported, ProbeFailure, classify_exception


class GraphNotSupportedForTests(Exception):
    pass


FRONTEND = SimpleNamespace(cudnnGraphNotSupportedError=GraphNotSupportedForTests)
ENGINE = "sdpa_fwd_prefill_sm90"


def plan_walk(*failures: str, backend_declined: str = "") -> GraphNotSupportedForTests:
    """The error pygraph.build_plans raises when no entry of the ranked list builds."""
    why = f"\n  the backend declined: {backend_declined}" if backend_declined else ""
    return GraphNotSupportedForTests("no plan in the list could be built:\n  " + "\n  ".join(failures) + why)


def test_a_python_engine_that_could_not_import_its_compiler_is_a_failed_probe():
    err = plan_walk(f"[0] {ENGINE}: {ENGINE}: No module named 'cutlass'",
                    backend_declined="No valid engine configs for SDPA_FWD")
    outcome = classify_exception("build_plans", err, {}, FRONTEND)
    assert isinstance(outcome, ProbeFailure), outcome
    assert outcome.stage == "build_plans"
    assert "No module named 'cutlass'" in outcome.detail


def test_out_of_memory_in_one_entry_of_the_walk_is_a_failed_probe():
    err = plan_walk(f"[0] {ENGINE}: {ENGINE}: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
                    "[1] eng12_k3=2: CUDNN_STATUS_NOT_SUPPORTED")
    assert isinstance(classify_exception("build_plans", err, {}, FRONTEND), ProbeFailure)


def test_a_walk_whose_entries_all_declined_the_problem_stays_a_verdict():
    err = plan_walk(f"[0] {ENGINE}: {ENGINE}: head dim 72 is not supported",
                    "[1] eng12_k3=2: CUDNN_STATUS_NOT_SUPPORTED")
    outcome = classify_exception("build_plans", err, {}, FRONTEND)
    assert isinstance(outcome, CudnnUnsupported), outcome
    assert "head dim 72 is not supported" in outcome.message
