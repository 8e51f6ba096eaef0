"""warmup(): every distinct problem probed once, across threads and across processes, and reported.

The engine here is CountingTestEngine, a test double standing in for cuDNN so that warmup's
scheduling can be checked on CPU. It is not probing and says nothing about real support.
"""

import collections
import json
import multiprocessing
import re
import threading
import time

import pytest

from fusedattn_select.buckets import bucket_form
from fusedattn_select.cli.warmup_command import format_report
from fusedattn_select.config import AttnConfig
from fusedattn_select.config_files import NamedConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.probing.engine_protocol import ProbeEngine
from fusedattn_select.selection.local_warmup import WarmupOutcome, WarmupReport, warmup
from fusedattn_select.selection.selector import Selector, set_default_selector
from fusedattn_select.store import PersistentStore
from fusedattn_select.types import Backend, Fingerprint, Outcome, ProbeDepth, Provenance, Verdict


class CountingTestEngine:
    """Test double of a ProbeEngine: SUPPORTED unless head_dim_qk % 8 != 0, after a short sleep.

    Counts calls per (cache key, phase), the most probes in flight at once, and (with `log_path`)
    appends one line per call to a file so that calls from several processes can be counted.
    `failing_head_dims` answer FAILED (an incident); `raising_head_dims` raise.
    """

    name = "counting-test-engine"
    provenance = Provenance.LIVE_PROBE

    def __init__(self, delay_s=0.005, failing_head_dims=(), raising_head_dims=(), log_path=None):
        self.delay_s = delay_s
        self.failing_head_dims = tuple(failing_head_dims)
        self.raising_head_dims = tuple(raising_head_dims)
        self.log_path = log_path
        self.calls = collections.Counter()
        self.depths = set()
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    def fingerprint(self):
        return Fingerprint(platform="test", device_name="CountingTestEngine", library_version="test")

    def probe(self, cfg, backend, phase, depth):
        with self._lock:
            self.calls[cfg.cache_key(), phase.value] += 1
            self.depths.add(depth)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.log_path is not None:
            with open(self.log_path, "a") as log:
                log.write(f"{cfg.cache_key()} {phase.value}\n")
        try:
            time.sleep(self.delay_s)
        finally:
            with self._lock:
                self.in_flight -= 1
        if cfg.head_dim_qk in self.raising_head_dims:
            raise RuntimeError("test double raised")
        if cfg.head_dim_qk in self.failing_head_dims:
            return Verdict(backend, phase, Outcome.FAILED, "build_plans", "out of memory (test double)", depth=depth)
        if cfg.head_dim_qk % 8:
            return Verdict(backend, phase, Outcome.UNSUPPORTED, "check_support",
                           "hidden_dim should be multiple of 8 (test double)", depth=depth)
        stage = "build_plans" if depth is ProbeDepth.FULL else "check_support"
        return Verdict(backend, phase, Outcome.SUPPORTED, stage, depth=depth)


BASE = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024,
                  head_dim_qk=128, mask="causal")
PROBLEMS = [
    (f"d{head_dim}-s{seqlen}", BASE.replace(head_dim_qk=head_dim, seqlen_q=seqlen, seqlen_kv=seqlen))
    for head_dim in (64, 96, 128, 192) for seqlen in (512, 2048, 4096)
]


def probed_once_each(engine, problems):
    # A live engine is asked for the graphs attention() runs: each problem's shape-bucket form.
    graphs = [bucket_form(cfg) or cfg for _, cfg in problems]
    expected = {(graph.cache_key(), phase) for graph in graphs for phase in ("forward", "backward")}
    return set(engine.calls) == expected and set(engine.calls.values()) == {1}


def test_the_engine_double_implements_the_probe_engine_protocol():
    assert isinstance(CountingTestEngine(), ProbeEngine)


def test_every_distinct_problem_is_probed_once_on_four_threads():
    engine = CountingTestEngine(delay_s=0.02)
    report = warmup(PROBLEMS, jobs=4, selector=Selector(engine))
    assert probed_once_each(engine, PROBLEMS)
    assert 2 <= engine.max_in_flight <= 4
    assert [row.name for row in report.rows] == [name for name, _ in PROBLEMS]
    assert report.totals["accepted"] == len(PROBLEMS)


def test_warmup_probes_full_depth_unless_asked_for_fast():
    full, fast = CountingTestEngine(), CountingTestEngine()
    warmup(PROBLEMS[:2], selector=Selector(full))
    warmup(PROBLEMS[:2], depth="fast", selector=Selector(fast))
    assert full.depths == {ProbeDepth.FULL} and fast.depths == {ProbeDepth.FAST}


def test_duplicate_problems_are_probed_once():
    engine = CountingTestEngine()
    same = [("first", BASE), ("again", BASE), ("spelled-out", BASE.replace(head_dim_v=BASE.head_dim_qk))]
    report = warmup(same, jobs=4, selector=Selector(engine))
    assert sum(engine.calls.values()) == 2  # forward and backward of one problem
    assert len(report.rows) == 1 and report.duplicates == 2
    assert report.rows[0].name == "first" and report.rows[0].also_named == ("again", "spelled-out")


def test_report_tells_accepted_rejected_and_failed_apart():
    engine = CountingTestEngine(failing_head_dims=(256,))
    problems = [("ok", BASE), ("odd-head-dim", BASE.replace(head_dim_qk=60)), ("oom", BASE.replace(head_dim_qk=256))]
    report = warmup(problems, jobs=2, selector=Selector(engine))
    rows = {row.name: row for row in report.rows}
    assert (rows["ok"].outcome, rows["ok"].backend, rows["ok"].reason) == (WarmupOutcome.ACCEPTED, Backend.F16, "")
    assert rows["odd-head-dim"].outcome is WarmupOutcome.REJECTED
    assert rows["odd-head-dim"].backend is Backend.NONE
    assert "multiple of 8" in rows["odd-head-dim"].reason
    assert rows["oom"].outcome is WarmupOutcome.FAILED and "out of memory" in rows["oom"].reason
    assert [report.totals[k] for k in ("accepted", "rejected", "failed")] == [1, 1, 1]
    table = format_report(report).splitlines()
    assert re.fullmatch(r"1 accepted, 1 rejected, 1 failed in \d+\.\d\d s", table[-1])
    assert table[0].split()[:3] == ["name", "backend", "outcome"]
    assert any(line.startswith("odd-head-dim") and "multiple of 8" in line for line in table)
    assert json.loads(json.dumps(report.to_dict()))["totals"]["failed"] == 1


def test_second_warmup_answers_from_cache_and_retries_only_failures():
    engine = CountingTestEngine(failing_head_dims=(256,))
    selector = Selector(engine)
    problems = [("ok", BASE), ("odd-head-dim", BASE.replace(head_dim_qk=60)), ("oom", BASE.replace(head_dim_qk=256))]
    warmup(problems, selector=selector)
    engine.calls.clear()
    again = warmup(problems, selector=selector)
    assert {row.name: row.from_cache for row in again.rows} == {"ok": True, "odd-head-dim": True, "oom": False}
    # Only the failed problem's graphs (its shape-bucket form) are asked for again.
    assert {key for key, _ in engine.calls} == {bucket_form(BASE.replace(head_dim_qk=256)).cache_key()}


def test_progress_is_reported_once_per_problem():
    seen = []
    warmup(PROBLEMS, jobs=3, selector=Selector(CountingTestEngine()),
           progress=lambda done, total, name: seen.append((done, total, name, threading.current_thread())))
    assert [done for done, _, _, _ in seen] == list(range(1, len(PROBLEMS) + 1))
    assert {total for _, total, _, _ in seen} == {len(PROBLEMS)}
    assert sorted(name for _, _, name, _ in seen) == sorted(name for name, _ in PROBLEMS)
    assert {thread for *_, thread in seen} == {threading.current_thread()}


def test_accepts_configs_pairs_and_named_configs():
    report = warmup([BASE, ("pair", BASE.replace(head_dim_qk=64)), NamedConfig("named", BASE.replace(head_dim_qk=96))],
                    selector=Selector(CountingTestEngine()))
    assert [row.name for row in report.rows][1:] == ["pair", "named"]
    assert "b2 h16/4 s1024/1024 d128" in report.rows[0].name


@pytest.mark.parametrize("bad", [
    {"configs": ["not a config"]},
    {"configs": [BASE], "jobs": 0},
    {"configs": [BASE], "depth": "deep"},
])
def test_bad_arguments_raise_config_error(bad):
    with pytest.raises(ConfigError):
        warmup(selector=Selector(CountingTestEngine()), **bad)


def test_a_raising_probe_fails_its_row_only():
    engine = CountingTestEngine(raising_head_dims=(64,))
    report = warmup([("raises", BASE.replace(head_dim_qk=64)), ("ok", BASE)], selector=Selector(engine))
    rows = {row.name: row for row in report.rows}
    assert rows["raises"].outcome is WarmupOutcome.FAILED and "RuntimeError" in rows["raises"].reason
    assert rows["ok"].outcome is WarmupOutcome.ACCEPTED


def test_uses_the_default_selector_when_none_is_given():
    engine = CountingTestEngine()
    previous = set_default_selector(Selector(engine))
    try:
        report = warmup(PROBLEMS[:3])
    finally:
        set_default_selector(previous)
    assert isinstance(report, WarmupReport) and report.totals["accepted"] == 3
    assert probed_once_each(engine, PROBLEMS[:3])


# ----- many processes ---------------------------------------------------------------------------
RANKS = 4


def _warm_as_rank(directory, log_path, barrier):
    engine = CountingTestEngine(delay_s=0.02, log_path=log_path)
    selector = Selector(engine, store=PersistentStore(directory))
    barrier.wait()
    report = warmup(PROBLEMS, jobs=3, selector=selector)
    if report.totals["accepted"] != len(PROBLEMS):
        raise SystemExit(1)


def test_processes_warming_the_same_problems_probe_each_once_in_total(tmp_path):
    directory, log_path = tmp_path / "cache", tmp_path / "probes.log"
    directory.mkdir(mode=0o700)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(RANKS)
    ranks = [context.Process(target=_warm_as_rank, args=(str(directory), str(log_path), barrier))
             for _ in range(RANKS)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(60)
    assert [p.exitcode for p in ranks] == [0] * RANKS
    calls = collections.Counter(tuple(line.split()) for line in log_path.read_text().splitlines())
    graphs = [bucket_form(cfg) or cfg for _, cfg in PROBLEMS]  # what a live engine is asked for
    expected = {(graph.cache_key(), phase) for graph in graphs for phase in ("forward", "backward")}
    assert set(calls) == expected
    assert max(calls.values()) == 1


def test_unknown_workers_kind_is_a_config_error_naming_the_field(tmp_path):
    selector = Selector(CountingTestEngine())
    with pytest.raises(ConfigError, match=r"workers='fibers'.*'threads', 'processes'"):
        warmup([BASE], workers="fibers", selector=selector)


def test_worker_processes_need_a_live_engine_and_a_persistent_store(tmp_path):
    selector = Selector(CountingTestEngine(), store=PersistentStore(tmp_path))
    with pytest.raises(ConfigError, match=r"workers='processes'.*persistent store"):
        warmup([BASE], workers="processes", selector=selector)


def test_a_decode_step_warms_the_bucket_of_its_heads_as_batch_problem():
    from fusedattn_select.buckets import heads_as_batch
    from fusedattn_select.planning.planner import plan_forms

    selector = Selector(CountingTestEngine())
    decode = BASE.replace(seqlen_q=1, seqlen_kv=700, qkv_layout="bhsd_bhsd_bhsd", mask="no_mask", is_training=False)
    forms, note = plan_forms(selector, decode, selector.select(decode))
    assert forms == [bucket_form(heads_as_batch(decode))] and note == ""
