"""Probe depth verify on a real device: graphs built as dispatch builds them run twice on seeded data
and are compared with the float32 reference; a planted wrong result turns into NONE at stage numerics.

The planted errors go through numerics.planted, a seam of the check itself (a graph built with a wrong
attention scale, or an output changed after cuDNN wrote it): cuDNN builds and runs every graph here.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from fusedattn_select.config import AttnConfig
from fusedattn_select.planning.forms import PlanKind
from fusedattn_select.probing.cudnn import numerics
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store.memory import MemoryStore
from fusedattn_select.types import Backend, Outcome, Phase, ProbeDepth

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device")]

COUNTER = itertools.count()
BASE = {"batch_size": 2, "num_heads_q": 8, "num_heads_kv": 8, "seqlen_q": 256, "seqlen_kv": 256, "head_dim_qk": 128}

SUPPORTED = {
    "inference": {"is_training": False},
    "training": {},
    "gqa-causal": {"num_heads_q": 16, "num_heads_kv": 4, "mask": "causal"},
    "window": {"mask": "causal", "window_size": (63, 0), "seqlen_q": 512, "seqlen_kv": 512},
    "cross-bottom-right-fp16": {"qkv_dtype": "fp16", "mask": "causal_bottom_right", "seqlen_q": 128, "seqlen_kv": 384},
    "padding": {"mask": "padding_causal", "head_dim_qk": 64},
    "ragged": {"qkv_layout": "thd_thd_thd", "mask": "padding_causal", "batch_size": 3},
    "long-causal": {"batch_size": 1, "num_heads_kv": 2, "mask": "causal", "seqlen_q": 4096, "seqlen_kv": 4096},
    # Paged KV caches, read through seeded page tables: a decode step and a chunk of a prefill.
    "paged-decode": {"qkv_layout": "paged_kv_bshd_bshd_bshd", "page_size": 64, "num_pages": 16, "seqlen_q": 1,
                     "seqlen_kv": 512, "mask": "padding_causal_bottom_right", "is_training": False},
    "paged-sbhd-prefill": {"qkv_layout": "paged_kv_sbhd_sbhd_sbhd", "page_size": 64, "num_pages": 8,
                           "mask": "padding_causal", "is_training": False},
}


def fresh(**changes) -> AttnConfig:
    """A config no other test asked about: a distinct head count keeps it out of every cache."""
    heads = changes.pop("num_heads_kv", BASE["num_heads_kv"])
    group = changes.pop("num_heads_q", BASE["num_heads_q"]) // heads
    heads_kv = heads + next(COUNTER) % 3  # 8, 9, 10 ...: new keys, the same kind of problem
    return AttnConfig(**{**BASE, **changes, "num_heads_kv": heads_kv, "num_heads_q": heads_kv * group})


@pytest.fixture
def selector(cudnn_engine):
    return Selector(cudnn_engine, store=MemoryStore())


def _skip_unless_built(selection) -> None:
    """Skip where cuDNN on this device does not build the problem (not what this test checks)."""
    rejected = [v for v in selection.verdicts if not v.supported and v.stage != numerics.NUMERICS_STAGE]
    if rejected:
        pytest.skip(f"not built on this device: {rejected[0].reason()}")


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_verify_answers_supported_problems_as_verified(selector, name):
    cfg = fresh(**SUPPORTED[name])
    answer = selector.select(cfg, "verify")
    _skip_unless_built(answer)
    assert answer.selected, answer.message
    assert [v.phase for v in answer.verdicts] == list(cfg.phases)
    for verdict in answer.verdicts:
        assert verdict.depth is ProbeDepth.VERIFY and verdict.verified, verdict
        assert "max error" in verdict.detail and "numerics" in dict(verdict.timings_ms)
    # A verified answer answers every depth from the cache.
    for depth in ("fast", "full", "verify"):
        assert selector.select(cfg, depth).from_cache


def test_verify_checks_dropout_by_what_every_mask_gives(selector):
    # The forward and the backward (dK too, once the row term its O shows is removed) by dropout's expected
    # distance and scale.
    answer = selector.select(fresh(dropout=0.1), "verify")
    _skip_unless_built(answer)
    assert answer.selected, answer.message
    forward, backward = answer.verdicts
    assert forward.verified and "distance over dropout's expected" in forward.detail, forward.detail
    assert backward.verified and "dK distance over dropout's expected" in backward.detail, backward.detail


DROPOUT_TRAINING = {"seqlen_q": 512, "seqlen_kv": 512, "head_dim_qk": 64, "mask": "causal", "dropout": 0.1}


@pytest.mark.parametrize("changes", [{}, {"num_heads_q": 16, "num_heads_kv": 4}, {"attn_scale": 1.0}],
                         ids=["mha", "gqa", "peaked"])
def test_verify_checks_a_dropout_backward_s_dk_by_moments(selector, changes):
    # A real bf16 dropout training kernel: dK (rows' terms dO_i . O_i from the O it wrote) verifies by moments.
    answer = selector.select(fresh(**{**DROPOUT_TRAINING, **changes}), "verify")
    _skip_unless_built(answer)
    assert answer.selected, answer.message
    backward = answer.verdicts[1]
    assert backward.verified and "dK distance over dropout's expected" in backward.detail, backward.detail


@pytest.mark.parametrize("attn_scale", [1.0, 0.5, None], ids=["peaked", "half", "default"])
def test_real_dropout_training_kernels_verify_by_moments_with_the_exact_variance(selector, attn_scale):
    # O, dQ, dK and dV of a real bf16 dropout training kernel, each by its distance's exact variance
    # (DropoutMoments.gram), at a peaked, a half and the default softmax scale.
    answer = selector.select(fresh(**{**DROPOUT_TRAINING, "attn_scale": attn_scale}), "verify")
    _skip_unless_built(answer)
    assert answer.selected, answer.message
    forward, backward = answer.verdicts
    assert forward.verified and "O distance over dropout's expected" in forward.detail, forward.detail
    for name in ("dQ", "dK", "dV"):
        assert backward.verified and f"{name} distance over dropout's expected" in backward.detail, backward.detail


def test_verify_refuses_a_dk_from_another_mask_than_its_o(cudnn_engine, monkeypatch):
    # A right kernel's whole backward under another dropout seed gives the dK; O, dQ and dV stay this mask's.
    # At attn_scale 1.0 the row term's shift (from this O) is far from that dK's own (CPU: statistic 6-9).
    from fusedattn_select.probing.cudnn import verify_run

    cfg = fresh(**{**DROPOUT_TRAINING, "attn_scale": 1.0})
    other = {}

    def keep_dk(phase, outputs):
        if phase is Phase.BACKWARD:
            other.setdefault("dK", outputs["dK"].clone())

    with monkeypatch.context() as patch:
        patch.setattr(verify_run, "DROPOUT_SEED", verify_run.DROPOUT_SEED + 17)
        with numerics.planted(after_execute=keep_dk):
            first = Selector(cudnn_engine, store=MemoryStore()).select(cfg, "verify")
    _skip_unless_built(first)
    assert "dK" in other, first.message

    def swap_dk(phase, outputs):
        if phase is Phase.BACKWARD:
            outputs["dK"].copy_(other["dK"])

    with numerics.planted(after_execute=swap_dk):
        answer = Selector(cudnn_engine, store=MemoryStore()).select(cfg, "verify")
    verdict = answer.verdicts[-1]
    assert verdict.phase is Phase.BACKWARD and verdict.outcome is Outcome.UNSUPPORTED, verdict
    assert verdict.stage == numerics.NUMERICS_STAGE and "dK distance" in verdict.message, verdict


def test_verify_refuses_a_dropout_dk_scaled_by_1_minus_p(selector):
    # A dK as if kept values were not rescaled by 1/(1-p): the simulated-dropout band (0.5x-2x) accepted it.
    def corrupt(phase, outputs):
        if phase is Phase.BACKWARD:
            outputs["dK"].mul_(0.9)

    with numerics.planted(after_execute=corrupt):
        answer = selector.select(fresh(**DROPOUT_TRAINING), "verify")
    _skip_unless_built(answer)
    verdict = answer.verdicts[-1]
    assert verdict.phase is Phase.BACKWARD and verdict.outcome is Outcome.UNSUPPORTED, verdict
    assert verdict.stage == numerics.NUMERICS_STAGE and "dK distance" in verdict.message, verdict


DROPOUT_INFERENCE = {"batch_size": 2, "num_heads_q": 8, "num_heads_kv": 8, "seqlen_q": 512, "seqlen_kv": 512,
                     "head_dim_qk": 64, "dropout": 0.1, "is_training": False}


@pytest.mark.parametrize("wrong", ["probability", "rescale"])
def test_verify_refuses_a_dropout_kernel_that_computes_something_else(selector, wrong):
    # A graph built at p=0.25 for a requested 0.1 (unbiased, too spread), or an O whose kept values were
    # not rescaled by 1/(1-p): the simulated-dropout band (0.5x-2x) verified both on an H200.
    cfg = fresh(**DROPOUT_INFERENCE)
    if wrong == "probability":
        seam = numerics.planted(graph_config=lambda c: dataclasses.replace(c, dropout=0.25))
    else:
        seam = numerics.planted(after_execute=lambda phase, out: out["o"].mul_(0.9))
    with seam:
        answer = selector.select(cfg, "verify")
    _skip_unless_built(answer)
    verdict = answer.verdicts[0]
    assert verdict.outcome is Outcome.UNSUPPORTED and verdict.stage == numerics.NUMERICS_STAGE, verdict
    assert selector.select(fresh(**DROPOUT_INFERENCE), "verify").selected  # unplanted, the same problem verifies


@pytest.mark.parametrize("shape", [(1, 1, 1, 64), (1, 2, 16, 16), (1, 1, 8, 64), (1, 1, 2, 128)])
def test_verify_accepts_dropout_where_a_row_has_few_decisions(selector, shape):
    # Few dropout decisions per row: the band refused right kernels here (errors 0.4-0.5x a simulated one).
    b, h, sq, skv = shape
    cfg = AttnConfig(batch_size=b, num_heads_q=h, num_heads_kv=h, seqlen_q=sq, seqlen_kv=skv, head_dim_qk=64,
                     dropout=0.1, is_training=False)
    answer = selector.select(cfg, "verify")
    _skip_unless_built(answer)
    assert answer.selected, answer.message


def test_verify_runs_a_dense_problem_through_its_bucket_form(selector):
    answer = selector.select(fresh(is_training=False), "verify")
    _skip_unless_built(answer)
    if answer.plan.kind is not PlanKind.BUCKET:
        pytest.skip(f"answered by {answer.plan_form!r} graphs, not a bucket's")
    assert answer.selected and all(v.verified for v in answer.verdicts)
    assert "ragged as a bucket plan runs" in answer.verdicts[0].detail


def _assert_not_stored_as_supported(selector, cfg) -> None:
    stored = selector.store.get(selector.fingerprint, cfg.cache_key())
    assert stored is not None, "a rejection is an answer: it is stored"
    verdicts, depth = stored
    assert depth is ProbeDepth.VERIFY and not all(v.supported for v in verdicts)
    assert selector.select_dense(cfg, "fast").backend.value == "NONE"  # dispatch's question falls back


def test_a_corrupted_output_is_unsupported_at_numerics(selector):
    cfg = fresh(is_training=False)

    def corrupt(phase, outputs):
        if phase is Phase.FORWARD:
            outputs["o"].mul_(1.25)

    with numerics.planted(after_execute=corrupt):
        answer = selector.select_dense(cfg, "verify")
    _skip_unless_built(answer)
    [verdict] = answer.verdicts
    assert verdict.outcome is Outcome.UNSUPPORTED and verdict.stage == numerics.NUMERICS_STAGE
    assert verdict.message.startswith("results differ from the float32 reference: O max error")
    assert "at numerics" in answer.message
    _assert_not_stored_as_supported(selector, cfg)


@pytest.mark.parametrize("phase", [Phase.FORWARD, Phase.BACKWARD])
def test_a_result_wrong_only_on_the_second_execution_is_unsupported_at_numerics(selector, phase):
    # A racing kernel: the first execution of the graph matches the reference, the second does not.
    cfg = fresh(mask="causal", is_training=phase is Phase.BACKWARD)
    executions = []

    def corrupt_second(ran, outputs):
        if ran is phase:
            executions.append(ran)
            if len(executions) == 2:
                outputs["dK" if phase is Phase.BACKWARD else "o"].mul_(1.25)

    with numerics.planted(after_execute=corrupt_second):
        answer = selector.select_dense(cfg, "verify")
    _skip_unless_built(answer)
    assert len(executions) == 2
    checked = {v.phase: v for v in answer.verdicts}
    verdict = checked[phase]
    assert verdict.outcome is Outcome.UNSUPPORTED and verdict.stage == numerics.NUMERICS_STAGE, verdict
    assert f"{'dK' if phase is Phase.BACKWARD else 'O'} (second execution) max error" in verdict.message, verdict
    if phase is Phase.BACKWARD:
        assert checked[Phase.FORWARD].verified, checked[Phase.FORWARD]
    _assert_not_stored_as_supported(selector, cfg)


def test_a_graph_built_with_a_wrong_scale_is_unsupported_at_numerics(selector):
    cfg = fresh(mask="causal")

    def doubled_scale(built: AttnConfig) -> AttnConfig:
        return dataclasses.replace(built, attn_scale=2.0 * built.resolved_attn_scale)

    with numerics.planted(graph_config=doubled_scale):
        answer = selector.select_dense(cfg, "verify")
    _skip_unless_built(answer)
    assert answer.backend.value == "NONE"
    for verdict in answer.verdicts:  # the forward's O, and the backward's gradients
        assert verdict.outcome is Outcome.UNSUPPORTED and verdict.stage == numerics.NUMERICS_STAGE, verdict
        assert "max error" in verdict.message
    _assert_not_stored_as_supported(selector, cfg)
    # Without the planted error the same problem verifies.
    fixed = Selector(selector.engine, store=MemoryStore()).select_dense(cfg, "verify")
    assert fixed.selected and all(v.verified for v in fixed.verdicts), fixed.message


def test_the_backward_of_a_max_logit_problem_is_verified_apart_from_its_forward(cudnn_engine):
    # The backward graph reads O and the stats only: its verdict does not take the forward's
    # max-logit output, which cuDNN may refuse, and agrees in outcome with depth full.
    cfg = fresh(mask="causal", return_max_logit=True)
    full = cudnn_engine.probe(cfg, Backend.F16, Phase.BACKWARD, "full")
    verified = cudnn_engine.probe(cfg, Backend.F16, Phase.BACKWARD, "verify")
    if not full.supported:
        pytest.skip(f"the backward graph does not build on this device: {full.reason()}")
    assert verified.outcome is Outcome.SUPPORTED and verified.verified, verified
    forward = [cudnn_engine.probe(cfg, Backend.F16, Phase.FORWARD, depth).outcome for depth in ("full", "verify")]
    assert forward[0] is forward[1]


@pytest.mark.parametrize("do_dtype", [None, "fp8_e4m3"])
def test_an_fp8_training_problem_is_checked_against_its_dequantized_inputs(selector, do_dtype):
    # Delayed scaling (the default): O, dQ, dK, dV in e4m3, dO (and so s dS) in e5m2 unless asked in
    # e4m3, whose tolerance is half as wide; the inputs quantized as dispatch quantizes them, dS's scale
    # bound as runtime/fp8.backward_feeds binds it, the gradients' sized from the reference's amax.
    cfg = fresh(qkv_dtype="fp8_e4m3", mask="causal", do_dtype=do_dtype)
    answer = selector.select(cfg, "verify")
    _skip_unless_built(answer)
    assert answer.backend.value == "FP8" and answer.selected, answer.message
    forward, backward = answer.verdicts
    assert forward.verified and "O max error" in forward.detail, forward
    assert backward.verified and all(f"{name} max error" in backward.detail for name in ("dQ", "dK", "dV")), backward


def test_a_corrupted_fp8_gradient_is_unsupported_at_numerics(selector):
    cfg = fresh(qkv_dtype="fp8_e4m3", mask="causal")

    def corrupt(phase, outputs):
        if phase is Phase.BACKWARD:
            dk = outputs["dK"]
            dk.copy_((dk.float() * 2.0).to(dk.dtype))  # exact in FP8: an exponent step

    with numerics.planted(after_execute=corrupt):
        answer = selector.select(cfg, "verify")
    _skip_unless_built(answer)
    forward, backward = answer.verdicts
    assert forward.verified, forward
    assert backward.outcome is Outcome.UNSUPPORTED and backward.stage == numerics.NUMERICS_STAGE, backward
    assert "dK max error" in backward.message, backward
    _assert_not_stored_as_supported(selector, cfg)


def test_a_corrupted_fp8_output_is_unsupported_at_numerics(selector):
    cfg = fresh(qkv_dtype="fp8_e4m3", is_training=False)

    def corrupt(phase, outputs):
        o = outputs["o"]
        # Doubled: exact in FP8 (an exponent step); FP8 tensors take no arithmetic of their own.
        o.copy_((o.float() * 2.0).to(o.dtype))

    with numerics.planted(after_execute=corrupt):
        answer = selector.select_dense(cfg, "verify")
    _skip_unless_built(answer)
    [verdict] = answer.verdicts
    assert verdict.outcome is Outcome.UNSUPPORTED and verdict.stage == numerics.NUMERICS_STAGE, verdict
    assert verdict.message.startswith("results differ from the float32 reference: O max error")
    _assert_not_stored_as_supported(selector, cfg)
