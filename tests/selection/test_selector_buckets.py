"""select() answers a problem through its shape bucket's graphs, the ones attention() runs.

ScriptedTestEngine (tests/selection/test_selector.py) is a TEST DOUBLE that records which graphs
it is asked about; real cuDNN answers for bucket forms are tested on the GPU.
"""

from __future__ import annotations

from test_selector import SUPPORTED, ScriptedTestEngine, answer

from fusedattn_select import AttnConfig
from fusedattn_select.buckets import Bucket, bucket_form, heads_as_batch
from fusedattn_select.planning.forms import PlanForm, PlanKind
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Backend, Outcome

BASE = dict(batch_size=3, num_heads_q=16, num_heads_kv=4, seqlen_q=1000, seqlen_kv=1000, head_dim_qk=128,
            mask="causal")


def config(**changes) -> AttnConfig:
    return AttnConfig(**{**BASE, **changes})


def reject_dense(cfg, backend, phase, depth):
    """Accept only ragged (bucket-form) graphs."""
    return SUPPORTED(cfg, backend, phase, depth) if cfg.qkv_layout == "thd_thd_thd" else answer(
        Outcome.UNSUPPORTED, "check_support", "dense rejected (test double)")(cfg, backend, phase, depth)


def reject_ragged(cfg, backend, phase, depth):
    if cfg.qkv_layout == "thd_thd_thd":
        return answer(Outcome.UNSUPPORTED, "check_support", "ragged rejected (test double)")(cfg, backend, phase, depth)
    return SUPPORTED(cfg, backend, phase, depth)


def test_a_bucketable_problem_is_answered_by_its_bucket_graphs():
    engine = ScriptedTestEngine(reject_dense)
    selection = Selector(engine).select(config())
    form = bucket_form(config())
    assert selection.backend is Backend.F16
    assert {key for key, _, _ in engine.calls} == {form.cache_key()}
    assert selection.plan == PlanForm(PlanKind.BUCKET, form, Bucket(4, 1024, 1024))
    assert selection.plan_form.startswith("bucket B=4 S_q=1024 S_kv=1024")
    assert selection.config == config() and selection.cache_key == config().cache_key()


def test_a_new_batch_size_or_length_inside_a_known_bucket_costs_no_probe():
    engine = ScriptedTestEngine()
    selector = Selector(engine)
    selector.select(config())
    for changes in (dict(batch_size=4), dict(batch_size=1), dict(seqlen_q=777, seqlen_kv=777), dict(batch_size=2)):
        assert selector.select(config(**changes)).from_cache
    assert len(engine.calls) == 2  # forward and backward of one bucket form
    selector.select(config(seqlen_q=1025, seqlen_kv=1025))  # the next bucket
    assert len(engine.calls) == 4


def test_where_the_bucket_form_is_rejected_the_problem_is_answered_by_its_own_graphs():
    engine = ScriptedTestEngine(reject_ragged)
    selector = Selector(engine)
    selection = selector.select(config())
    assert selection.backend is Backend.F16 and selection.plan.kind is PlanKind.DENSE and selection.plan_form == "dense"
    assert {key for key, _, _ in engine.calls} == {bucket_form(config()).cache_key(), config().cache_key()}
    again = selector.select(config())
    assert again.from_cache and again.plan_form == "dense" and len(engine.calls) == 4


def test_an_incident_on_the_bucket_form_is_reported_without_probing_the_dense_graphs():
    engine = ScriptedTestEngine(answer(Outcome.FAILED, "build_plans", "CUDA out of memory"))
    selection = Selector(engine).select(config())
    assert selection.backend is Backend.NONE and "probe failed" in selection.message
    assert {key for key, _, _ in engine.calls} == {bucket_form(config()).cache_key()}


def test_problems_without_a_bucket_form_and_recorders_use_the_problems_own_graphs():
    engine = ScriptedTestEngine()
    Selector(engine).select(config(qkv_dtype="fp8_e4m3", num_heads_kv=16))  # MHA: not refused by a rule
    Selector(engine, bucket_forms=False).select(config())
    assert {key for key, _, _ in engine.calls} == {config(qkv_dtype="fp8_e4m3", num_heads_kv=16).cache_key(), config().cache_key()}


def test_a_pinned_answer_wins_over_the_bucket_form_at_every_depth():
    engine = ScriptedTestEngine()
    selector = Selector(engine)
    assert selector.select(config()).backend is Backend.F16
    refusal = answer(Outcome.UNSUPPORTED, "agreement", "ranks disagree (test)")
    verdicts = tuple(refusal(config(), Backend.F16, phase, None) for phase in config().phases)
    selector.pin(config(), verdicts)
    for depth in ("fast", "full"):
        pinned = selector.select(config(), depth)
        assert pinned.backend is Backend.NONE and "ranks disagree" in pinned.message


def test_a_fresh_process_runs_a_shape_in_a_larger_bucket_another_process_stored(tmp_path):
    from fusedattn_select.store import PersistentStore

    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    warmed = Selector(ScriptedTestEngine(), store=PersistentStore(directory))
    warmed.select(config(batch_size=8, seqlen_q=4096, seqlen_kv=4096))  # what warmup of the model answers
    engine = ScriptedTestEngine()
    fresh = Selector(engine, store=PersistentStore(directory))
    selection = fresh.select(config(batch_size=3, seqlen_q=700, seqlen_kv=700))
    assert selection.selected and selection.plan_form.startswith("bucket B=8 S_q=4096 S_kv=4096")
    assert engine.calls == []  # nothing probed: the stored bucket answers
    assert fresh.bucket_for(config(batch_size=1, seqlen_q=100, seqlen_kv=100)).batch_size == 8


# ----- a decode step with BHSD keys and values: answered with its heads as batch ---------------------
DECODE = dict(batch_size=2, num_heads_q=32, num_heads_kv=8, seqlen_q=1, seqlen_kv=233, head_dim_qk=128,
              qkv_layout="bhsd_bhsd_bhsd", mask="no_mask", is_training=False)


def test_a_decode_step_is_answered_by_the_bucket_graphs_of_its_heads_as_batch_problem():
    engine = ScriptedTestEngine()
    selection = Selector(engine).select(config(**DECODE))
    form = bucket_form(heads_as_batch(config(**DECODE)))
    assert {key for key, _, _ in engine.calls} == {form.cache_key()}
    assert selection.plan == PlanForm(PlanKind.HEADS_AS_BATCH, form, Bucket(16, 64, 256), heads_as_batch(config(**DECODE)))
    assert selection.plan_form.startswith("heads as batch (B=16 H=1 S_q=4") and "bucket B=16 S_q=64 S_kv=256" in \
        selection.plan_form
    assert selection.config == config(**DECODE) and selection.cache_key == config(**DECODE).cache_key()


def test_the_next_decode_steps_inside_the_bucket_cost_no_probe():
    engine = ScriptedTestEngine()
    selector = Selector(engine)
    selector.select(config(**DECODE))
    for seqlen_kv in (234, 240, 256, 200):
        again = selector.select(config(**dict(DECODE, seqlen_kv=seqlen_kv)))
        assert again.from_cache and again.plan_form.startswith("heads as batch")
    assert len(engine.calls) == 1  # the forward graph of one bucket form


def test_where_the_heads_as_batch_graphs_are_rejected_the_step_keeps_its_heads():
    def reject_one_head(cfg, backend, phase, depth):
        if cfg.num_heads_q == 1:
            return answer(Outcome.UNSUPPORTED, "check_support", "one head rejected (test double)")(
                cfg, backend, phase, depth)
        return SUPPORTED(cfg, backend, phase, depth)

    selection = Selector(ScriptedTestEngine(reject_one_head)).select(config(**DECODE))
    assert selection.backend is Backend.F16 and selection.plan_form.startswith("bucket B=2 S_q=1 S_kv=256")


def test_where_the_heads_as_batch_problem_would_run_dense_plans_the_step_keeps_its_heads():
    def one_head_dense_only(cfg, backend, phase, depth):  # a plan per step would be built otherwise
        if cfg.num_heads_q == 1 and cfg.qkv_layout == "thd_thd_thd":
            return answer(Outcome.UNSUPPORTED, "check_support", "one-head ragged rejected (test double)")(
                cfg, backend, phase, depth)
        return SUPPORTED(cfg, backend, phase, depth)

    selection = Selector(ScriptedTestEngine(one_head_dense_only)).select(config(**DECODE))
    assert selection.selected and selection.plan_form.startswith("bucket B=2 S_q=1 S_kv=256")


def test_select_own_answers_a_decode_step_by_its_own_forms_beside_its_heads_as_batch_answer():
    selector = Selector(ScriptedTestEngine())
    own = selector.select_own(config(**DECODE))
    heads = selector.select(config(**DECODE))
    assert own.plan_form.startswith("bucket B=2 S_q=1 S_kv=256") and heads.plan_form.startswith("heads as batch")
    assert selector.select_own(config(**DECODE)).plan_form == own.plan_form  # each remembered apart
    assert selector.select(config(**DECODE)).plan_form == heads.plan_form


def test_a_pinned_answer_wins_over_the_heads_as_batch_answer():
    selector = Selector(ScriptedTestEngine())
    pinned = selector.pin(config(**DECODE), selector.select_own(config(**DECODE)).verdicts)
    assert selector.select(config(**DECODE)) == pinned and selector.select(config(**DECODE), "full") == pinned


def test_an_answer_computed_across_a_build_failure_is_not_remembered():
    # A build failure clears the answers given through other problems' graphs. One computed while it
    # happened (another thread) must not be filed after the clear, where it would outlive it.
    selector = None

    def fail_meanwhile(cfg, backend, phase, depth):
        selector.record_build_failure(config(batch_size=64), answer(Outcome.UNSUPPORTED, "build_plans", "x")(
            cfg, backend, phase, depth))
        return SUPPORTED(cfg, backend, phase, depth)

    selector = Selector(ScriptedTestEngine(fail_meanwhile))
    assert selector.select(config(**DECODE)).plan_form.startswith("heads as batch")
    assert selector.select_own(config(seqlen_q=900, seqlen_kv=900)).plan_form.startswith("bucket")
    assert not selector.planner._by_problem  # noqa: SLF001 - the memo of answers through other graphs
    selector = Selector(ScriptedTestEngine())
    selector.select(config(**DECODE))
    assert selector.planner._by_problem  # noqa: SLF001 - without a failure, both are remembered
