"""The live cuDNN probe, on a real device: verdicts, graphs built from the caller's values, cost.

Every test here builds real cuDNN frontend graphs (no device memory, no kernel launch). Tests that
inspect a graph use `CudnnEngine.build` -- the code path a probe runs -- or, where cuDNN's answer
is not the point, `describe_graph`, which stops after the graph description.
"""

from __future__ import annotations

import gc
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from concurrent_calls import call_at_once

from fusedattn_select.config import AttnConfig
from fusedattn_select.layouts import format_strides
from fusedattn_select.probing.cudnn import (
    STAGES,
    CudnnEngine,
    CudnnUnsupported,
    build_graph,
    describe_graph,
    frontend_features,
    handle_for,
)
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Backend, Outcome, Phase, ProbeDepth

pytestmark = pytest.mark.gpu

cudnn = pytest.importorskip("cudnn")

FWD, BWD = Phase.FORWARD, Phase.BACKWARD
FAST, FULL = ProbeDepth.FAST, ProbeDepth.FULL
B, H, S, D = 2, 16, 256, 128
BASE = dict(batch_size=B, num_heads_q=H, num_heads_kv=H, seqlen_q=S, seqlen_kv=S, head_dim_qk=D)
COUNTER = iter(range(10_000))


def config(**changes) -> AttnConfig:
    return AttnConfig(**{**BASE, **changes})


def fresh(**changes) -> AttnConfig:
    """A config no other test probed (distinct sequence length), so nothing is cached for it."""
    length = 8 * (100 + next(COUNTER))
    return config(**{"seqlen_q": length, "seqlen_kv": length, **changes})


def built(engine: CudnnEngine, cfg: AttnConfig, phase: Phase = FWD, depth: ProbeDepth = FAST):
    return engine.build(cfg, cfg.candidate, phase, depth, dynamic_shapes=False)


def bound(options: dict, side: str):
    """The diagonal band bound the graph was given (argument names differ between operations)."""
    for name in (f"diagonal_band_{side}_bound", f"{side}_bound"):
        if name in options:
            return options[name]
    return None


@pytest.fixture(scope="module")
def engine(cudnn_engine) -> CudnnEngine:
    return cudnn_engine


@pytest.fixture(scope="module")
def hopper(engine) -> None:
    if engine.fingerprint().compute_capability != "9.0":
        pytest.skip(f"needs Hopper (sm_90); device is {engine.fingerprint().describe()}")


# ----- verdicts ----------------------------------------------------------------------------------
def test_an_engine_made_without_warm_up_builds_its_graph_at_its_first_probe_once(engine):
    """An engine made with warm_up=False (what selectors get: a process that only loads stored plans
    never probes) builds no graph until its first probe, which warms it up first, once; the default
    engine warmed up when made."""
    assert engine.warm_up_ms > 0.0
    fresh = CudnnEngine(warm_up=False)
    assert fresh.warm_up_ms == 0.0
    verdict = fresh.probe(AttnConfig(**BASE), Backend.F16, FWD)
    assert verdict.outcome is Outcome.SUPPORTED and fresh.warm_up_ms > 0.0
    warmed = fresh.warm_up_ms
    fresh.probe(AttnConfig(**BASE), Backend.F16, BWD)
    fresh.warm_up()
    assert fresh.warm_up_ms == warmed


def test_head_dim_60_is_rejected_naming_the_multiple_of_8_requirement(engine):
    verdict = engine.probe(config(head_dim_qk=60, is_training=False), Backend.F16, FWD, FAST)
    assert verdict.outcome is Outcome.UNSUPPORTED
    assert verdict.stage in STAGES
    assert "multiple of 8" in verdict.message
    assert "\n" not in verdict.message and verdict.detail
    assert verdict.reason().startswith("F16 forward not supported at ")


def test_bf16_inference_head_dim_512_is_supported_on_hopper(engine, hopper):
    verdict = engine.probe(config(head_dim_qk=512, is_training=False), Backend.F16, FWD, FAST)
    assert verdict.outcome is Outcome.SUPPORTED, verdict.reason()


def test_fp8_training_head_dim_256_runs_forward_but_not_backward_on_hopper(engine, hopper):
    cfg = config(head_dim_qk=256, qkv_dtype="fp8_e4m3")
    forward = engine.probe(cfg, Backend.FP8, FWD, FAST)
    backward = engine.probe(cfg, Backend.FP8, BWD, FAST)
    assert forward.outcome is Outcome.SUPPORTED, forward.reason()
    assert backward.outcome is Outcome.UNSUPPORTED
    assert backward.phase is Phase.BACKWARD
    assert backward.reason().startswith("FP8 backward not supported at ")


def test_pre_scale_bias_is_unsupported_at_graph_api_naming_the_field(engine):
    verdict = engine.probe(config(bias="pre_scale_bias"), Backend.F16, FWD, FAST)
    assert verdict.outcome is Outcome.UNSUPPORTED
    assert verdict.stage == "graph_api"
    assert "bias='pre_scale_bias'" in verdict.message
    assert engine.fingerprint().cudnn_frontend_version in verdict.message


def test_an_incident_is_a_failed_verdict_that_the_selector_does_not_cache(engine, monkeypatch):
    def out_of_memory(self):
        raise MemoryError("CUDA out of memory")

    monkeypatch.setattr(cudnn.pygraph, "check_support", out_of_memory)
    cfg = fresh(is_training=False)
    verdict = engine.probe(cfg, Backend.F16, FWD, FAST)
    assert verdict.outcome is Outcome.FAILED
    assert verdict.stage == "check_support"
    selector = Selector(engine)
    selector.select(cfg)
    selector.select(cfg)
    assert selector.cache_info()["probes"] == 2
    assert selector.cache_info()["entries"] == 0


def test_feature_detection_reads_the_compiled_sdpa_arguments():
    features = frontend_features()
    assert features.version == cudnn.__version__
    assert {"diagonal_alignment", "diagonal_band_left_bound", "diagonal_band_right_bound", "sink_token",
            "generate_stats", "dropout", "paged_attention_k_table", "score_max"} <= features.operations["sdpa"]
    assert {"use_deterministic_algorithm", "dBias", "dSink_token"} <= features.operations["sdpa_backward"]
    assert {"left_bound", "right_bound", "descale_s", "scale_o"} <= features.operations["sdpa_fp8"]
    assert "bias" not in features.operations["sdpa_fp8_backward"]
    assert features.dynamic_shapes


def test_fingerprint_names_device_versions_and_library(engine):
    fingerprint = engine.fingerprint()
    assert fingerprint.platform == "cuda"
    assert fingerprint.device_name
    assert re.fullmatch(r"\d+\.\d+", fingerprint.compute_capability)
    assert fingerprint.sm_count > 0
    assert fingerprint.cudnn_backend_version == cudnn.backend_version()
    assert fingerprint.cudnn_frontend_version == cudnn.__version__
    assert fingerprint.driver_version and fingerprint.library_version


# ----- the caller's values reach the graph (design.md section 7) ----------------------------------
@pytest.mark.parametrize("batch", [1, 3])
def test_batch_size_reaches_every_tensor_of_both_graphs(engine, batch):
    cfg = config(batch_size=batch, mask="padding_causal")
    forward, backward = built(engine, cfg, FWD), built(engine, cfg, BWD)
    for name in ("q", "k", "v", "o", "stats"):
        assert forward.dims_strides[name][0][0] == batch
    for name in ("q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV"):
        assert backward.dims_strides[name][0][0] == batch
    assert forward.dims_strides["seq_len_q"][0] == (batch, 1, 1, 1)


def test_sequence_lengths_and_heads_reach_the_graph(engine):
    build = built(engine, config(seqlen_q=128, seqlen_kv=384, num_heads_q=16, num_heads_kv=4, mask="causal_bottom_right"))
    assert build.dims_strides["q"][0] == (B, 16, 128, D)
    assert build.dims_strides["k"][0] == (B, 4, 384, D)
    assert build.dims_strides["o"][0] == (B, 16, 128, D)


def test_causal_aligns_top_left_and_bottom_right_causal_aligns_bottom_right(engine):
    top = built(engine, config(mask="causal", seqlen_q=128, seqlen_kv=384))
    bottom = built(engine, config(mask="causal_bottom_right", seqlen_q=128, seqlen_kv=384))
    assert top.options["diagonal_alignment"] == cudnn.diagonal_alignment.TOP_LEFT
    assert bottom.options["diagonal_alignment"] == cudnn.diagonal_alignment.BOTTOM_RIGHT
    assert bound(top.options, "right") == 0 and bound(bottom.options, "right") == 0


def test_cudnn_sees_the_bottom_right_alignment(engine):
    # cuDNN accepts dropout with a top-left causal mask but not with a bottom-right one: the
    # verdicts differ only if the alignment reaches cuDNN.
    top_left = engine.probe(config(mask="causal", dropout=0.1), Backend.F16, FWD, FAST)
    bottom_right = engine.probe(config(mask="causal_bottom_right", dropout=0.1), Backend.F16, FWD, FAST)
    assert top_left.outcome is Outcome.SUPPORTED, top_left.reason()
    assert bottom_right.outcome is Outcome.UNSUPPORTED
    assert "bottom right" in bottom_right.message.lower()


def test_bottom_right_diagonal_field_reaches_the_backward_graph(engine):
    cfg = config(mask="causal", bottom_right_diagonal=True, window_size=(64, 0), seqlen_q=128, seqlen_kv=384)
    build = built(engine, cfg, BWD)
    assert build.options["diagonal_alignment"] == cudnn.diagonal_alignment.BOTTOM_RIGHT


@pytest.mark.parametrize("window, left, right", [((128, 0), 129, 0), ((64, 32), 65, 32), ((-1, 16), None, 16)])
def test_window_size_maps_to_the_diagonal_band_as_transformer_engine_does(engine, window, left, right):
    build = built(engine, config(window_size=window), BWD)
    assert bound(build.options, "left") == left
    assert bound(build.options, "right") == right


def test_o_format_sets_the_output_strides(engine):
    build = built(engine, config(qkv_layout="bshd_bshd_bshd", o_format="sbhd", is_training=False))
    assert build.dims_strides["q"][1] == (S * H * D, D, H * D, 1)
    assert build.dims_strides["o"][1] == (H * D, D, B * H * D, 1)


def test_backward_takes_o_format_do_format_and_dqkv_layout_separately(engine):
    cfg = config(qkv_layout="bshd_bshd_bshd", o_format="bshd", do_format="sbhd", dqkv_layout="bhsd_bhsd_bhsd")
    build = describe_graph(cfg, Backend.F16, BWD)
    assert build.dims_strides["o"][1] == (S * H * D, D, H * D, 1)
    assert build.dims_strides["dO"][1] == (H * D, D, B * H * D, 1)
    for name in ("dQ", "dK", "dV"):
        assert build.dims_strides[name][1] == (H * S * D, S * D, D, 1)
    for name in ("q", "k", "v"):
        assert build.dims_strides[name][1] == (S * H * D, D, H * D, 1)


def test_interleaved_layouts_give_packed_strides(engine):
    three = built(engine, config(qkv_layout="bs3hd"))
    assert three.dims_strides["q"][1] == three.dims_strides["k"][1] == (S * 3 * H * D, D, 3 * H * D, 1)
    head_three = built(engine, config(qkv_layout="sbh3d"))
    assert head_three.dims_strides["v"][1] == (H * 3 * D, 3 * D, B * H * 3 * D, 1)
    kv = built(engine, config(qkv_layout="bshd_bs2hd", num_heads_kv=4))
    assert kv.dims_strides["q"][1] == (S * H * D, D, H * D, 1)
    assert kv.dims_strides["k"][1] == (S * 2 * 4 * D, D, 2 * 4 * D, 1)


def test_mixed_q_and_kv_formats_reach_the_graph(engine):
    build = built(engine, config(qkv_layout="sbhd_bshd_bshd", o_format="sbhd"))
    assert build.dims_strides["q"][1] == format_strides("sbhd", B, H, S, D)
    assert build.dims_strides["k"][1] == format_strides("bshd", B, H, S, D)


def test_deterministic_reaches_sdpa_backward(engine):
    deterministic = built(engine, config(deterministic=True), BWD)
    default = built(engine, config(deterministic=False), BWD)
    assert deterministic.options["use_deterministic_algorithm"] is True
    assert default.options["use_deterministic_algorithm"] is False
    assert deterministic.operation == "sdpa_backward"


def test_o_dtype_and_dqkv_dtype_reach_the_outputs(engine):
    forward = describe_graph(config(o_dtype="fp16"), Backend.F16, FWD)
    assert forward.data_types["q"] == cudnn.data_type.BFLOAT16
    assert forward.data_types["o"] == cudnn.data_type.HALF
    backward = describe_graph(config(dqkv_dtype="fp16"), Backend.F16, BWD)
    assert {backward.data_types[n] for n in ("dQ", "dK", "dV")} == {cudnn.data_type.HALF}
    fp8 = describe_graph(config(qkv_dtype="fp8_e4m3", scaling_mode="current"), Backend.FP8, FWD)
    assert fp8.data_types["q"] == cudnn.data_type.FP8_E4M3
    assert fp8.data_types["o"] == cudnn.data_type.BFLOAT16


def test_training_forward_returns_float32_stats_and_inference_none(engine):
    training = built(engine, config(is_training=True))
    assert training.dims_strides["stats"] == ((B, H, S, 1), (H * S, S, 1, 1))
    assert training.data_types["stats"] == cudnn.data_type.FLOAT
    assert "stats" not in built(engine, config(is_training=False)).tensors


def test_thd_graph_has_int32_ragged_offsets_and_sequence_lengths(engine):
    build = built(engine, config(qkv_layout="thd_thd_thd", mask="padding_causal", batch_size=3), BWD)
    for name in ("ragged_offset_q", "ragged_offset_kv", "ragged_offset_o"):
        assert build.dims_strides[name][0] == (4, 1, 1, 1)
        assert build.data_types[name] == cudnn.data_type.INT32
    assert build.dims_strides["seq_len_kv"][0] == (3, 1, 1, 1)


def test_paged_kv_graph_has_page_tables_and_page_containers(engine):
    cfg = config(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding", is_training=False,
                 seqlen_kv=500, page_size=64, num_pages=24, num_heads_kv=4)
    build = built(engine, cfg)
    assert build.dims_strides["page_table_k"][0] == (B, 1, 8, 1)
    assert build.data_types["page_table_v"] == cudnn.data_type.INT32
    assert build.dims_strides["k"] == ((24, 4, 64, D), (64 * 4 * D, D, 4 * D, 1))
    assert build.options["paged_attention_max_seq_len_kv"] == 500


def test_dropout_learnable_softmax_and_bias_add_their_tensors(engine):
    cfg = config(dropout=0.1, softmax="learnable", bias="post_scale_bias", bias_shape="1hss")
    build = describe_graph(cfg, Backend.F16, BWD)
    assert build.options["dropout"] == pytest.approx(0.1)
    assert build.dims_strides["seed"][0] == (1, 1, 1, 1) and build.data_types["seed"] == cudnn.data_type.INT64
    assert build.dims_strides["sink_token"][0] == (1, H, 1, 1)
    assert build.dims_strides["dSink_token"][0] == (1, H, 1, 1)
    assert build.dims_strides["bias"][0] == (1, H, S, S)
    assert "dBias" in build.tensors


def test_attn_scale_is_taken_as_given(engine):
    assert built(engine, config(attn_scale=0.5)).options["attn_scale"] == 0.5
    assert built(engine, config()).options["attn_scale"] == pytest.approx(D ** -0.5)


# ----- depth, threads, memory, cost -------------------------------------------------------------
def test_fast_probe_stops_after_check_support(engine):
    verdict = engine.probe(fresh(), Backend.F16, FWD, FAST)
    assert verdict.supported and verdict.depth is FAST
    assert [name for name, _ in verdict.timings_ms] == list(STAGES[:-1])
    assert verdict.stage == "check_support"
    assert built(engine, config()).workspace_size == 0


@pytest.mark.parametrize("phase", [FWD, BWD])
def test_full_probe_builds_the_plans(engine, phase):
    verdict = engine.probe(fresh(), Backend.F16, phase, FULL)
    assert verdict.supported and verdict.depth is FULL, verdict.reason()
    assert [name for name, _ in verdict.timings_ms][-1] == "build_plans"
    build = engine.build(fresh(), Backend.F16, phase, FULL)
    assert build.workspace_size >= 0 and "build_plans" in build.timings_ms
    assert build.dynamic_shapes or build.note  # a static build says why


def test_build_graph_works_with_a_handle_of_this_thread(engine):
    from fusedattn_select.probing.cudnn import device_context

    with device_context(engine.device):
        build = build_graph(config(), Backend.F16, FWD, handle=handle_for(engine.device), depth=FAST)
    assert build.operation == "sdpa" and "o" in build.tensors


def test_16_threads_selecting_one_new_training_config_probe_each_graph_once(engine):
    selector = Selector(engine)
    cfg = fresh(mask="causal")
    selections = call_at_once(lambda: selector.select(cfg), 16)
    assert len(selections) == 16
    assert {selection.backend for selection in selections} == {Backend.F16}
    assert selector.cache_info()["probes"] == 2


def test_probes_of_distinct_configs_run_on_4_threads(engine):
    configs = [fresh(mask="causal") for _ in range(8)]
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda cfg: engine.probe(cfg, Backend.F16, BWD, FAST), configs))
    assert all(verdict.supported for verdict in verdicts), [v.reason() for v in verdicts]


def test_each_thread_gets_its_own_cudnn_handle(engine):
    def take():
        first = handle_for(engine.device)
        assert handle_for(engine.device) is first
        return first

    handles = call_at_once(take, 4)
    assert len({id(handle) for handle in handles}) == 4


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status")


def test_probing_300_distinct_configs_keeps_memory_flat(engine, capsys):
    configs = [config(is_training=False, seqlen_q=64 + 8 * i, seqlen_kv=64 + 8 * i, num_heads_q=8, num_heads_kv=8)
               for i in range(350)]
    for cfg in configs[:50]:  # warm-up: allocator pools, first-use caches
        engine.probe(cfg, Backend.F16, FWD, FAST)
    gc.collect()
    before = _rss_mb()
    for cfg in configs[50:]:
        assert engine.probe(cfg, Backend.F16, FWD, FAST).supported
    gc.collect()
    growth = _rss_mb() - before
    with capsys.disabled():
        print(f"\n[memory] RSS growth over 300 distinct FAST probes: {growth:.1f} MB")
    assert growth < 32  # measured: 1-3 MB on H200 (cudnn-frontend 1.28 and 1.32)


def test_a_new_batch_size_builds_from_the_kernel_cache(engine, capsys):
    cfg = fresh(mask="causal", num_heads_q=32, num_heads_kv=8, head_dim_qk=128)
    cold = engine.probe(cfg, Backend.F16, FWD, FULL)
    new_batches = [engine.probe(cfg.replace(batch_size=b), Backend.F16, FWD, FULL) for b in (3, 4, 5)]
    started = time.perf_counter()
    engine.build(cfg.replace(batch_size=6), Backend.F16, FWD, FULL, dynamic_shapes=False)
    static_ms = (time.perf_counter() - started) * 1e3
    cold_backward = engine.probe(cfg, Backend.F16, BWD, FULL)
    new_backward = engine.probe(cfg.replace(batch_size=3), Backend.F16, BWD, FULL)
    assert cold.supported and all(v.supported for v in new_batches), [v.reason() for v in new_batches]
    assert cold_backward.supported and new_backward.supported, new_backward.reason()
    assert "\n" not in new_backward.detail and "{" not in new_backward.detail  # cleaned cuDNN text
    with capsys.disabled():
        print(
            f"\n[kernel cache] forward: cold FULL {cold.total_ms:.1f} ms; new batch size with kernel cache "
            f"{statistics.median(v.total_ms for v in new_batches):.1f} ms (median of 3); "
            f"same kernel rebuilt without dynamic shapes {static_ms:.1f} ms. backward: cold FULL "
            f"{cold_backward.total_ms:.1f} ms, new batch size {new_backward.total_ms:.1f} ms"
            + (f" ({new_backward.detail})" if new_backward.detail else "")
        )


def test_unsupported_build_raises_cudnn_unsupported_with_stage_and_timings(engine):
    with pytest.raises(CudnnUnsupported) as raised:
        built(engine, config(head_dim_qk=60))
    assert raised.value.stage in STAGES
    assert "multiple of 8" in raised.value.message
    assert "graph_api" in raised.value.timings_ms
    assert raised.value.__context__ is None  # no traceback keeps the graph alive
