"""The selector: rules, then the decision cache, then the engine; single-flight; depth semantics.

These tests drive the selector with ScriptedTestEngine, a TEST DOUBLE defined here: it probes
nothing, it returns verdicts scripted by each test and counts how often it was asked. Whether
cuDNN really supports a problem is tested on the GPU (tests marked `gpu`) and through snapshots
recorded on real devices. They are about the cache mechanics of one set of graphs, so the
selector answers each problem by its own graphs (bucket_forms=False); test_selector_buckets.py
covers answers through a problem's shape bucket.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable

import pytest
from concurrent_calls import call_at_once

import fusedattn_select
from fusedattn_select import AttnConfig, Backend, get_backend, select
from fusedattn_select.errors import ConfigError
from fusedattn_select.probing.engine_protocol import ProbeEngine
from fusedattn_select.selection.selector import Selector, set_default_selector
from fusedattn_select.types import Fingerprint, Outcome, Phase, ProbeDepth, Provenance, Verdict

BASE = dict(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128)
Script = Callable[[AttnConfig, Backend, Phase, ProbeDepth], Verdict]


def answer(outcome: Outcome, stage: str = "check_support", message: str = "") -> Script:
    def script(cfg, backend, phase, probe_depth):
        return Verdict(backend, phase, outcome, stage, message, message, Provenance.LIVE_PROBE, probe_depth,
                       (("check_support", 1.5),))
    return script


SUPPORTED = answer(Outcome.SUPPORTED)


class ScriptedTestEngine:
    """TEST DOUBLE, not a probe: returns what `script` says and records every call."""

    name = "scripted-test-engine"
    provenance = Provenance.LIVE_PROBE

    def __init__(self, script: Script = SUPPORTED, delay_s: float = 0.0,
                 fingerprint: Fingerprint | None = None) -> None:
        self.script = script
        self.delay_s = delay_s
        self.calls: list[tuple[str, Phase, ProbeDepth]] = []
        self._lock = threading.Lock()
        self._fingerprint = fingerprint or Fingerprint(
            "test-double", "Scripted GPU", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")

    def fingerprint(self) -> Fingerprint:
        return self._fingerprint

    def probe(self, cfg, backend, phase, depth) -> Verdict:
        with self._lock:
            self.calls.append((cfg.cache_key(), phase, depth))
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.script(cfg, backend, phase, depth)


def config(**changes) -> AttnConfig:
    return AttnConfig(**{**BASE, **changes})


def test_scripted_engine_satisfies_the_engine_protocol():
    assert isinstance(ScriptedTestEngine(), ProbeEngine)


# ----- cache counting --------------------------------------------------------------------------
def test_training_probes_forward_and_backward_once_then_hits():
    engine = ScriptedTestEngine()
    selector = Selector(engine, bucket_forms=False)
    first = selector.select(config())
    second = selector.select(config())
    assert [phase for _, phase, _ in engine.calls] == [Phase.FORWARD, Phase.BACKWARD]
    assert first.backend is Backend.F16 and not first.from_cache
    assert second.backend is Backend.F16 and second.from_cache
    assert {v.provenance for v in second.verdicts} == {Provenance.MEMORY_CACHE}
    info = selector.cache_info()
    assert (info["hits"], info["misses"], info["probes"], info["entries"]) == (1, 1, 2, 1)


def test_an_engine_that_warms_up_is_warmed_before_the_first_probe_is_timed():
    """A live engine made without its warm-up graph builds it before its first probe; the selector
    asks for it before starting the probe's clock, so probe_ms is the probe's own time."""
    class WarmingTestEngine(ScriptedTestEngine):
        def __init__(self) -> None:
            super().__init__()
            self.warm_ups = 0

        def warm_up(self) -> None:
            with self._lock:
                self.calls.append(("warm_up", None, None))
            self.warm_ups += 1
            time.sleep(0.3)  # stands for cuDNN loading its engine libraries

    engine = WarmingTestEngine()
    selector = Selector(engine)
    first = selector.select(AttnConfig(**BASE, is_training=False))
    assert engine.calls[0][0] == "warm_up" and first.probe_ms < 250
    selector.select(AttnConfig(**dict(BASE, batch_size=3), is_training=False))
    assert engine.calls[2][0] == "warm_up"  # asked again: the engine warms up once (CudnnEngine.warm_up)


def test_inference_probes_the_forward_graph_only():
    engine = ScriptedTestEngine()
    Selector(engine, bucket_forms=False).select(config(is_training=False))
    assert [phase for _, phase, _ in engine.calls] == [Phase.FORWARD]


def test_a_new_batch_size_is_a_new_problem():
    engine = ScriptedTestEngine()
    selector = Selector(engine, bucket_forms=False)
    selector.select(config(is_training=False))
    selector.select(config(is_training=False, batch_size=3))
    assert selector.cache_info()["probes"] == 2 and selector.cache_info()["entries"] == 2


def test_fp8_problem_probes_the_fp8_backend():
    engine = ScriptedTestEngine()
    # MHA: with grouped KV heads the FP8 backward is refused by a rule on this (Hopper, 9.19) platform
    selection = Selector(engine, bucket_forms=False).select(config(qkv_dtype="fp8_e4m3", num_heads_kv=16))
    assert selection.backend is Backend.FP8 and selection.candidate is Backend.FP8
    assert {v.backend for v in selection.verdicts} == {Backend.FP8}


# ----- single flight ---------------------------------------------------------------------------
def test_sixteen_threads_asking_one_new_problem_share_one_probe_per_graph():
    engine = ScriptedTestEngine(delay_s=0.05)
    selector = Selector(engine, bucket_forms=False)
    results = call_at_once(lambda: selector.select(config()), 16)
    assert len(engine.calls) == 2
    assert len(results) == 16
    assert {(s.backend, s.message, s.cache_key) for s in results} == {(Backend.F16, "", config().cache_key())}
    assert selector.cache_info()["misses"] == 1


# ----- failures, depth, build failures ---------------------------------------------------------
def test_failed_probe_is_reported_counted_and_not_cached():
    engine = ScriptedTestEngine(answer(Outcome.FAILED, "build_plans", "CUDA out of memory"))
    selector = Selector(engine, bucket_forms=False)
    first = selector.select(config(is_training=False))
    assert first.backend is Backend.NONE
    assert first.message == "F16 forward probe failed at build_plans: CUDA out of memory"
    assert selector.cache_info()["probe_failures"] == 1 and selector.cache_info()["entries"] == 0
    engine.script = SUPPORTED
    second = selector.select(config(is_training=False))
    assert second.backend is Backend.F16 and not second.from_cache
    assert len(engine.calls) == 2


def test_full_answer_serves_a_fast_question():
    engine = ScriptedTestEngine()
    selector = Selector(engine, bucket_forms=False)
    selector.select(config(), probe_depth="full")
    assert selector.select(config(), probe_depth="fast").from_cache
    assert len(engine.calls) == 2


def test_fast_yes_does_not_answer_a_full_question():
    engine = ScriptedTestEngine()
    selector = Selector(engine, bucket_forms=False)
    selector.select(config(), probe_depth="fast")
    full = selector.select(config(), probe_depth="full")
    assert not full.from_cache
    assert [depth for _, _, depth in engine.calls] == [ProbeDepth.FAST] * 2 + [ProbeDepth.FULL] * 2
    # ... and the full answer now serves both depths.
    assert selector.select(config(), probe_depth="fast").from_cache
    assert selector.select(config(), probe_depth="full").from_cache


def test_fast_no_answers_a_full_question():
    engine = ScriptedTestEngine(answer(Outcome.UNSUPPORTED, "check_support", "hidden_dim should be multiple of 8"))
    selector = Selector(engine, bucket_forms=False)
    selector.select(config(head_dim_qk=60), probe_depth="fast")
    full = selector.select(config(head_dim_qk=60), probe_depth="full")
    assert full.from_cache and full.backend is Backend.NONE
    assert len(engine.calls) == 2


def test_unknown_probe_depth_is_a_config_error():
    with pytest.raises(ConfigError, match="probe_depth='deep'"):
        Selector(ScriptedTestEngine(), bucket_forms=False).select(config(), probe_depth="deep")


def test_select_rejects_a_non_config():
    with pytest.raises(ConfigError, match="must be an AttnConfig"):
        Selector(ScriptedTestEngine(), bucket_forms=False).select(dict(BASE))  # type: ignore[arg-type]


def test_build_failure_after_a_fast_yes_flips_the_cached_answer_to_none():
    engine = ScriptedTestEngine()
    selector = Selector(engine, bucket_forms=False)
    cfg = config()
    assert selector.select(cfg).backend is Backend.F16
    failed = Verdict(Backend.F16, Phase.BACKWARD, Outcome.UNSUPPORTED, "build_plans",
                     "no kernel for this configuration", depth=ProbeDepth.FULL)
    selector.record_build_failure(cfg, failed)
    for depth in ("fast", "full"):
        flipped = selector.select(cfg, probe_depth=depth)
        assert flipped.backend is Backend.NONE and flipped.from_cache
        assert flipped.message == "F16 backward not supported at build_plans: no kernel for this configuration"
    assert len(engine.calls) == 2


def test_a_build_incident_flips_this_process_only_and_a_rejection_is_stored(tmp_path):
    from fusedattn_select.store import PersistentStore

    cfg = config()
    selector = Selector(ScriptedTestEngine(), store=PersistentStore(tmp_path), bucket_forms=False)
    assert selector.select(cfg).backend is Backend.F16
    incident = Verdict(Backend.F16, Phase.BACKWARD, Outcome.FAILED, "build_plans", "CUDA out of memory",
                       depth=ProbeDepth.FULL)
    selector.record_build_failure(cfg, incident)  # the store refuses incidents: not offered to it
    assert selector.select(cfg).backend is Backend.NONE
    again = Selector(ScriptedTestEngine(), store=PersistentStore(tmp_path), bucket_forms=False)
    assert again.select(cfg).backend is Backend.F16  # another process asks again
    rejected = dataclasses.replace(incident, outcome=Outcome.UNSUPPORTED, message="no kernel")
    again.record_build_failure(cfg, rejected)
    third = Selector(ScriptedTestEngine(), store=PersistentStore(tmp_path), bucket_forms=False)
    assert third.select(cfg).backend is Backend.NONE


def test_a_build_failure_after_a_verified_yes_says_none_after_a_restart(tmp_path):
    from fusedattn_select.store import PersistentStore

    cfg = config()
    selector = Selector(ScriptedTestEngine(), store=PersistentStore(tmp_path), bucket_forms=False)
    assert selector.select(cfg, probe_depth="verify").backend is Backend.F16
    selector.record_build_failure(cfg, Verdict(Backend.F16, Phase.BACKWARD, Outcome.UNSUPPORTED, "build_plans",
                                               "no kernel", depth=ProbeDepth.FULL))
    engine = ScriptedTestEngine()
    restarted = Selector(engine, store=PersistentStore(tmp_path), bucket_forms=False)
    for depth in ("fast", "verify"):
        assert restarted.select(cfg, probe_depth=depth).backend is Backend.NONE
    assert engine.calls == []


def test_a_build_failure_the_store_cannot_save_says_so_in_its_warning(tmp_path, caplog):
    from fusedattn_select.store import PersistentStore

    cfg = config()
    PersistentStore(tmp_path).close()
    selector = Selector(ScriptedTestEngine(), store=PersistentStore(tmp_path, read_only=True), bucket_forms=False)
    selector.select(cfg)
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        selector.record_build_failure(cfg, Verdict(Backend.F16, Phase.BACKWARD, Outcome.UNSUPPORTED, "build_plans",
                                                   "no kernel", depth=ProbeDepth.FULL))
    said = [r.getMessage() for r in caplog.records if r.name == "fusedattn_select"]
    assert said == ["fusedattn_select: F16 backward not supported at build_plans: no kernel; cached answer flipped "
                    "to NONE in this process only: the decision cache did not save it"]


# ----- rules and messages ----------------------------------------------------------------------
def test_rule_rejection_answers_without_a_probe():
    engine = ScriptedTestEngine()
    selector = Selector(engine, bucket_forms=False)
    selection = selector.select(config(bias="pre_scale_bias"))
    assert selection.backend is Backend.NONE
    assert engine.calls == []
    assert {v.provenance for v in selection.verdicts} == {Provenance.RULE}
    assert selector.cache_info()["rule_rejections"] == 1


def test_none_message_names_backend_phase_stage_and_joins_every_reason():
    def script(cfg, backend, phase, depth):
        if phase is Phase.FORWARD:
            return Verdict(backend, phase, Outcome.UNSUPPORTED, "check_support", "forward says no")
        return Verdict(backend, phase, Outcome.UNSUPPORTED, "validate", "backward says no")

    selection = Selector(ScriptedTestEngine(script), bucket_forms=False).select(config())
    assert selection.reasons == (
        "F16 forward not supported at check_support: forward says no",
        "F16 backward not supported at validate: backward says no",
    )
    assert selection.message == "; ".join(selection.reasons)


def test_selected_answer_has_empty_message_and_no_reasons():
    selection = Selector(ScriptedTestEngine(), bucket_forms=False).select(config())
    assert selection.selected and selection.message == "" and selection.reasons == ()
    assert selection.probe_ms >= 0 and selection.engine == "scripted-test-engine"


def test_selection_is_immutable():
    selection = Selector(ScriptedTestEngine(), bucket_forms=False).select(config())
    with pytest.raises(dataclasses.FrozenInstanceError):
        selection.backend = Backend.NONE  # type: ignore[misc]
    assert isinstance(selection.reasons, tuple) and isinstance(selection.verdicts, tuple)


def test_earlier_message_is_not_changed_by_a_later_answer():
    engine = ScriptedTestEngine(answer(Outcome.UNSUPPORTED, message="first reason"))
    selector = Selector(engine, bucket_forms=False)
    first = selector.select(config(is_training=False))
    engine.script = answer(Outcome.UNSUPPORTED, message="second reason")
    selector.select(config(is_training=False, batch_size=5))
    assert first.message == "F16 forward not supported at check_support: first reason"


def test_no_engine_answers_none_with_the_platform_rule():
    selection = Selector(None, unavailable_reason="no NVIDIA driver").select(config())
    assert selection.backend is Backend.NONE
    assert {v.stage for v in selection.verdicts} == {"rule:platform"}
    assert "no NVIDIA driver" in selection.message and "--snapshot" in selection.message


# ----- the process-wide API --------------------------------------------------------------------
def test_get_backend_returns_empty_message_when_selected():
    set_default_selector(Selector(ScriptedTestEngine(), bucket_forms=False))
    assert get_backend(config()) == (Backend.F16, "")


def test_get_backend_returns_none_and_the_reasons():
    set_default_selector(Selector(ScriptedTestEngine(answer(Outcome.UNSUPPORTED, message="nope")), bucket_forms=False))
    backend, message = get_backend(config(is_training=False))
    assert backend is Backend.NONE
    assert message == "F16 forward not supported at check_support: nope"


def test_clear_cache_forgets_decisions_and_counters():
    engine = ScriptedTestEngine()
    set_default_selector(Selector(engine, bucket_forms=False))
    select(config())
    select(config())
    assert fusedattn_select.cache_info()["hits"] == 1
    fusedattn_select.clear_cache()
    assert fusedattn_select.cache_info()["entries"] == 0 and fusedattn_select.cache_info()["hits"] == 0
    select(config())
    assert len(engine.calls) == 4


def test_set_default_selector_returns_the_previous_one():
    mine = Selector(ScriptedTestEngine(), bucket_forms=False)
    set_default_selector(mine)
    assert set_default_selector(None) is mine


def test_a_cache_hit_returns_the_same_immutable_selection_without_rebuilding_it():
    selector = Selector(ScriptedTestEngine(), bucket_forms=False)
    cfg = AttnConfig(**BASE)
    first = selector.select(cfg)
    hit = selector.select(cfg)
    assert selector.select(AttnConfig(**BASE)) is hit  # an equal config, a new object: same answer
    assert hit.from_cache and not first.from_cache
    assert {v.provenance for v in hit.verdicts} == {Provenance.MEMORY_CACHE}


def test_a_rule_answer_is_remembered_and_keeps_its_rule_provenance():
    selector = Selector(ScriptedTestEngine(), bucket_forms=False)
    cfg = AttnConfig(**{**BASE, "bias": "pre_scale_bias"})
    first, again = selector.select(cfg), selector.select(cfg)
    assert selector.cache_info()["rule_rejections"] == 1 and selector.cache_info()["probes"] == 0
    assert again.from_cache and again.message == first.message
    assert {v.provenance for v in again.verdicts} == {Provenance.RULE}
