"""Build ahead per model (integrations/transformers/build_ahead.py): which buckets a model queues and
in which order, when nothing is queued, that queueing never blocks the caller, what dispatch_info()
and the log say, and the worker protocol of a queued bucket. No GPU: the worker process runs here
only where it cannot build (it answers each job with its error); the builds themselves are
tests/gpu/test_build_ahead.py."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.buckets import Bucket, bucket_form
from fusedattn_select.integrations.transformers import build_ahead
from fusedattn_select.runtime import dense_builds
from fusedattn_select.runtime.api import dispatch_info
from fusedattn_select.runtime.dispatcher import dispatcher

LLAMA = {"model_type": "llama", "hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 4,
         "num_hidden_layers": 6, "max_position_embeddings": 1024, "torch_dtype": "bfloat16"}
GEMMA2 = {"model_type": "gemma2", "hidden_size": 2304, "num_attention_heads": 8, "num_key_value_heads": 4,
          "head_dim": 256, "num_hidden_layers": 4, "max_position_embeddings": 8192, "sliding_window": 4096,
          "query_pre_attn_scalar": 256, "torch_dtype": "bfloat16"}


LLAMA_CALL = None  # set below: one call config of LLAMA


def _bucket(cfg):
    return Bucket.of(cfg.batch_size, cfg.seqlen_q, cfg.seqlen_kv)


# ----- which buckets, in which order ---------------------------------------------------------------
def test_a_language_model_queues_prefill_then_decode_per_length_batch_1_first_up_to_its_positions():
    calls = build_ahead.model_calls(LLAMA, max_batch=2)
    prefill = [c for c in calls if c.seqlen_q > 1 and c.num_heads_q == 12]
    decode = [c for c in calls if c not in prefill]
    assert [(c.batch_size, c.seqlen_kv) for c in prefill] == [(b, s) for b in (1, 2) for s in (64, 128, 256, 512, 1024)]
    assert calls[:2] == [prefill[0], decode[0]]  # at each (batch, length): the prefill, then its decode step
    assert all(c.mask == "causal" and c.qkv_layout == "bhsd_bhsd_bhsd" for c in prefill)
    # A decode step over a DynamicCache runs with its KV heads as batch: one head, the query group as rows.
    assert {(c.num_heads_q, c.num_heads_kv, c.seqlen_q, c.mask) for c in decode} == {(1, 1, 3, "no_mask")}
    assert [c.seqlen_kv for c in decode[:5]] == [64, 128, 256, 512, 1024]
    assert len({bucket_form(c).cache_key() for c in calls}) == len(calls)  # one call per bucket form


def test_the_scale_is_the_one_transformers_modules_pass():
    # 128 ** -0.5 and 1 / sqrt(128) differ in the last bit: the prebuilt plans must have the call's key.
    calls = build_ahead.model_calls(dict(LLAMA, hidden_size=1536))
    assert {c.attn_scale for c in calls} == {128 ** -0.5}


def test_max_length_and_training_bound_the_ladder():
    calls = build_ahead.model_calls(LLAMA, max_length=200, training=True)
    assert [(c.seqlen_q, c.seqlen_kv) for c in calls] == [(64, 64), (128, 128), (256, 256)]  # no decode steps
    assert all(c.is_training for c in calls)


def test_sliding_layers_get_their_window_where_it_cuts_and_soft_capped_layers_are_left_out():
    mistral = dict(LLAMA, model_type="mistral", sliding_window=4096, max_position_embeddings=16384)
    calls = build_ahead.model_calls(mistral)
    windows = {(c.seqlen_kv, tuple(c.window_size)) for c in calls if c.seqlen_q > 1}
    assert {(16384, (4095, 0)), (8192, (4095, 0)), (4096, (-1, -1))} <= windows
    assert build_ahead.model_calls(GEMMA2) == []  # soft-capped (Gemma 2's default): the float32 reference runs them


def test_the_ladder_ends_at_the_length_the_model_reader_reads():
    # RoBERTa's positions start after its padding id: 514 positions take 512 tokens, one bucket of 512.
    roberta = {"model_type": "roberta", "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12,
               "max_position_embeddings": 514, "pad_token_id": 1}
    assert max(c.seqlen_kv for c in build_ahead.model_calls(roberta)) == 512
    # The nested text model's length, as the reader reads it, for a multimodal config.
    nested = {"model_type": "llava", "text_config": dict(LLAMA, max_position_embeddings=2048)}
    assert max(c.seqlen_kv for c in build_ahead.model_calls(nested)) == 2048


def test_each_stack_climbs_to_its_own_length():
    # Whisper small: the encoder takes 1500 frames (its ladder ends at 2048), the decoder 448 tokens (512).
    whisper = json.loads((Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "whisper-small.json").read_text())
    calls = build_ahead.model_calls(whisper)
    assert max(c.seqlen_kv for c in calls if c.mask == "no_mask" and c.seqlen_q > 1) == 2048
    assert max(c.seqlen_kv for c in calls if c.mask == "causal") == 512
    assert max(c.seqlen_kv for c in calls if c.seqlen_q == 1) == 512  # decode steps: the decoder's


LLAMA_CALL = build_ahead.model_calls(LLAMA)[0]


def test_a_bad_bound_is_refused_naming_it():
    with pytest.raises(ValueError, match="max_batch=0"):
        build_ahead.model_calls(LLAMA, max_batch=0)


# ----- queueing -----------------------------------------------------------------------------------------
@pytest.fixture
def queued(monkeypatch):
    """The worker's jobs as dense_builds submits them, answered at once ("" : built); no selector."""
    jobs = []

    def submit(job):
        jobs.append(job)
        future = Future()
        future.set_result("")
        return future

    def no_selector():
        raise AssertionError("queueing made this process's selector")

    monkeypatch.setattr(dense_builds, "_submit", submit)
    monkeypatch.setattr(dense_builds, "ahead_target", lambda device: (("store-dir", device), ""))
    monkeypatch.setattr("fusedattn_select.selection.selector.default_selector", no_selector)
    monkeypatch.setattr(dispatcher, "ahead", set())
    monkeypatch.setattr(dispatcher, "worker_deaths", 0)
    for name in ("ahead_queued", "ahead_built", "ahead_skipped", "ahead_failed"):
        monkeypatch.setitem(dispatcher.counters, name, 0)
    return jobs


def test_a_registered_model_queues_its_buckets_in_order_with_one_log_line(queued, use_settings, caplog):
    use_settings(dense_builds=dense_builds.PROCESS)
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    job = build_ahead.queue_model(LLAMA, max_batch=1)
    assert job.result(timeout=30) == len(queued) == 10 and build_ahead.wait(timeout=30)
    expected = build_ahead.model_calls(LLAMA)
    assert [(j["kind"], j["config"], j["bucket"]) for j in queued] == [
        ("ahead", c.to_dict(), [c.batch_size, c.seqlen_q, c.seqlen_kv]) for c in expected]
    said = [r.getMessage() for r in caplog.records if "build ahead" in r.getMessage()]
    assert len(said) == 1 and "queued 10 buckets" in said[0]
    info = dispatch_info()
    assert (info["ahead_queued"], info["ahead_built"], info["ahead_failed"]) == (10, 10, 0)


def test_first_calls_wait_still_builds_ahead(queued, use_settings):
    # "wait" is about what a call does when its plans are not ready; built ahead, they are.
    use_settings(dense_builds=dense_builds.PROCESS, first_calls="wait")
    assert build_ahead.queue_model(LLAMA).result(timeout=30) == 10


def test_inline_builds_queue_nothing_and_say_so_as_a_warning(queued, use_settings, monkeypatch, caplog):
    # The real ahead_target: the user asked for build ahead explicitly, so "nothing" is a warning.
    monkeypatch.undo()
    use_settings(dense_builds=dense_builds.INLINE)
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    assert build_ahead.queue_model(LLAMA) is None
    said = [r for r in caplog.records if "nothing queued" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and "inline" in said[0].getMessage()


def test_no_worker_target_queues_nothing_and_says_why(queued, use_settings, monkeypatch, caplog):
    use_settings(dense_builds=dense_builds.PROCESS)
    monkeypatch.setattr(dense_builds, "ahead_target", lambda device: (None, "no persistent store"))
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    assert build_ahead.queue_model(LLAMA) is None and queued == []
    assert [r.levelno for r in caplog.records if "no persistent store" in r.getMessage()] == [logging.WARNING]


def test_queueing_never_blocks_the_caller_nor_the_preparing_thread(queued, use_settings, monkeypatch):
    use_settings(dense_builds=dense_builds.PROCESS)
    released = threading.Event()
    threads = []
    real = build_ahead.model_plan

    def slow_plan(*args, **kwargs):  # reading a long model's ladder takes 0.15 s
        threads.append(threading.current_thread())
        released.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(build_ahead, "model_plan", slow_plan)
    started = time.perf_counter()
    job = build_ahead.queue_model(LLAMA)
    assert time.perf_counter() - started < 1.0 and not job.done()
    # A first call's preparation is not queued behind the model's buckets.
    assert dispatcher.preparer.submit(lambda: "prepared").result(timeout=5) == "prepared"
    released.set()
    assert job.result(timeout=30) == 10
    assert threads and threads[0] is not threading.main_thread()


def test_finished_build_ahead_jobs_are_forgotten_and_counted(queued, use_settings):
    use_settings(dense_builds=dense_builds.PROCESS)
    assert build_ahead.queue_model(LLAMA).result(timeout=30) == 10 and build_ahead.wait(timeout=30)
    assert dispatcher.ahead == set() and dispatch_info()["ahead_built"] == 10


def test_wait_has_one_deadline(queued, use_settings, monkeypatch):
    use_settings(dense_builds=dense_builds.PROCESS)
    never = Future()
    monkeypatch.setattr(dense_builds, "_submit", lambda job: never)
    monkeypatch.setattr(build_ahead, "model_plan", lambda *a, **k: (time.sleep(0.4), ([LLAMA_CALL], ""))[1])
    build_ahead.queue_model(LLAMA)
    started = time.perf_counter()
    assert not build_ahead.wait(timeout=0.6)
    assert time.perf_counter() - started < 0.9  # not 0.4 of queueing and then the whole 0.6 again


@pytest.mark.parametrize(("argument", "value"), [("training", "no"), ("training", 1), ("max_batch", 0),
                                                 ("max_length", -5), ("max_batch", None)])
def test_a_bad_argument_is_refused_naming_it_before_anything_is_queued(queued, use_settings, argument, value):
    use_settings(dense_builds=dense_builds.PROCESS)
    with pytest.raises(ValueError, match=f"{argument}="):
        build_ahead.queue_model(LLAMA, **{argument: value})
    assert queued == [] and dispatcher.ahead == set()


def test_left_out_layers_are_counted_and_named_in_the_queued_line(queued, use_settings, caplog):
    use_settings(dense_builds=dense_builds.PROCESS)
    caplog.set_level(logging.INFO, logger="fusedattn_select")
    gemma2 = dict(GEMMA2, max_position_embeddings=128)
    assert build_ahead.queue_model(gemma2).result(timeout=30) == 0
    said = [r.getMessage() for r in caplog.records if "queued 0 buckets" in r.getMessage()]
    assert len(said) == 1 and "left out: " in said[0] and "attn_logit_softcapping" in said[0]


def test_a_failed_or_skipped_bucket_is_counted(queued, use_settings, monkeypatch):
    use_settings(dense_builds=dense_builds.PROCESS)
    answers = iter([RuntimeError("CUDA out of memory"), "runs dense plans, not a bucket's"])

    def submit(job):
        future = Future()
        answer = next(answers, "")
        future.set_exception(answer) if isinstance(answer, Exception) else future.set_result(answer)
        return future

    monkeypatch.setattr(dense_builds, "_submit", submit)
    build_ahead.queue_model(LLAMA, max_length=64).result(timeout=30)
    assert build_ahead.wait(timeout=30)
    info = dispatch_info()
    assert (info["ahead_queued"], info["ahead_failed"], info["ahead_skipped"], info["ahead_built"]) == (2, 1, 1, 0)


# ----- the worker ------------------------------------------------------------------------------------------
def test_the_worker_answers_a_queued_bucket_and_puts_it_after_jobs_asked_for(monkeypatch, tmp_path):
    try:
        import cudnn  # noqa: F401
        pytest.skip("cuDNN frontend installed: the worker would build (tests/gpu/test_build_ahead.py)")
    except ImportError:
        pass
    from fusedattn_select.runtime import dense_worker

    monkeypatch.setattr(dispatcher, "worker", None)
    monkeypatch.setattr(dispatcher, "worker_deaths", 0)
    cfg = build_ahead.model_calls(LLAMA)[0]
    try:
        job = dense_builds._submit({"kind": "ahead", "config": cfg.to_dict(), "bucket": [1, 64, 64],
                                    "return_lse": False, "store_dir": str(tmp_path), "device": 0})
        assert isinstance(job.exception(timeout=120), RuntimeError)  # it cannot build here: its error comes back
        assert dispatcher.worker.process.poll() is None
    finally:
        if dispatcher.worker is not None:
            dispatcher.worker.close()
            dispatcher.worker.process.wait(timeout=60)
    assert dense_worker.AHEAD_PRIORITY > dense_worker.ASKED


def test_register_checks_every_argument_before_registering(queued, use_settings):
    transformers = pytest.importorskip("transformers")
    from fusedattn_select.integrations.transformers import register

    use_settings(dense_builds=dense_builds.PROCESS)
    with pytest.raises(ValueError, match="training='no'"):
        register("fusedattn_half_done", model=LLAMA, training="no")
    assert "fusedattn_half_done" not in transformers.AttentionInterface._global_mapping
