"""cuDNN's answers as outcomes: which exceptions are verdicts, which are incidents, and their Verdict.

cudnn-frontend is not needed: `classify_exception` takes the frontend module, here a stand-in
that has only the exception type it looks up.
"""

from __future__ import annotations

from types import SimpleNamespace

from fusedattn_select.probing.cudnn.messages import (
    CudnnUnsupported,
    ProbeFailure,
    classify_exception,
    clean_message,
    verdict_from_exception,
)
from fusedattn_select.types import Backend, Outcome, Phase, ProbeDepth, Provenance


class GraphNotSupportedForTests(Exception):
    pass


FRONTEND = SimpleNamespace(cudnnGraphNotSupportedError=GraphNotSupportedForTests)
TIMINGS = {"graph_api": 0.5, "validate": 1.0}


def test_clean_message_keeps_the_sentence_and_drops_prefix_and_source_location():
    text = "[cudnn_frontend] Error: hidden_dim should be multiple of 8 at /src/sdpa_node.h:123"
    assert clean_message(text) == "hidden_dim should be multiple of 8"


def test_frontend_validation_error_is_a_verdict_with_the_cleaned_message():
    err = classify_exception("validate", RuntimeError("[cudnn_frontend] Error: hidden_dim should be multiple of 8"),
                             TIMINGS, FRONTEND)
    assert isinstance(err, CudnnUnsupported)
    assert (err.stage, err.message, err.timings_ms) == ("validate", "hidden_dim should be multiple of 8", TIMINGS)
    assert err.detail.startswith("RuntimeError: ")


def test_out_of_memory_text_is_an_incident_even_in_a_runtime_error():
    err = classify_exception("build_plans", RuntimeError("CUDNN_STATUS_ALLOC_FAILED: out of memory"), {}, FRONTEND)
    assert isinstance(err, ProbeFailure)
    assert err.message.startswith("RuntimeError: ")


def test_not_supported_wrapping_a_failed_lowering_is_an_incident():
    wrapped = GraphNotSupportedForTests("no engine proposed a plan (the backend declined: CUDA_ERROR_ILLEGAL_ADDRESS)")
    assert isinstance(classify_exception("check_support", wrapped, {}, FRONTEND), ProbeFailure)


def test_not_supported_naming_a_support_answer_is_a_verdict():
    declined = GraphNotSupportedForTests("no engine proposed a plan (the backend declined: CUDNN_STATUS_NOT_SUPPORTED)")
    assert isinstance(classify_exception("check_support", declined, {}, FRONTEND), CudnnUnsupported)


def test_unexpected_exception_types_are_incidents():
    assert isinstance(classify_exception("graph_api", TypeError("tensor() got an unexpected keyword"), {}, FRONTEND),
                      ProbeFailure)


def test_verdict_from_unsupported_keeps_stage_message_detail_and_timings():
    err = CudnnUnsupported("validate", "hidden_dim should be multiple of 8", "RuntimeError: full text", TIMINGS)
    verdict = verdict_from_exception(err, Backend.F16, Phase.BACKWARD, ProbeDepth.FULL)
    assert verdict.outcome is Outcome.UNSUPPORTED
    assert (verdict.backend, verdict.phase, verdict.depth) == (Backend.F16, Phase.BACKWARD, ProbeDepth.FULL)
    assert (verdict.stage, verdict.message, verdict.detail) == ("validate", err.message, "RuntimeError: full text")
    assert verdict.timings_ms == (("graph_api", 0.5), ("validate", 1.0))
    assert verdict.provenance is Provenance.LIVE_PROBE


def test_verdict_from_probe_failure_is_failed():
    err = ProbeFailure("build_plans", "RuntimeError: out of memory")
    verdict = verdict_from_exception(err, Backend.FP8, Phase.FORWARD, ProbeDepth.FULL)
    assert (verdict.outcome, verdict.stage, verdict.message) == (Outcome.FAILED, "build_plans", err.message)


def test_verdict_from_any_other_exception_is_failed_at_the_default_stage():
    verdict = verdict_from_exception(KeyError("q"), Backend.F16, Phase.FORWARD, ProbeDepth.FAST, "probe")
    assert (verdict.outcome, verdict.stage) == (Outcome.FAILED, "probe")
    assert verdict.message == verdict.detail == "KeyError: 'q'"
    assert verdict.timings_ms == ()


def test_the_exception_text_names_the_kind_stage_and_message():
    assert str(CudnnUnsupported("validate", "m")) == "not supported at validate: m"
    assert str(ProbeFailure("build_plans", "m")) == "probe failed at build_plans: m"
