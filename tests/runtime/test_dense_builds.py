"""runtime/dense_builds.py on CPU: the FUSEDATTN_SELECT_DENSE_BUILDS setting, the plans a selected
problem needs, where a process can hand plans over to a worker, and how count_call treats a bucketed
entry whose dense plans a worker is building (the worker itself runs on the GPU: tests/gpu/test_hot_path.py)."""

from __future__ import annotations

import contextlib
from concurrent.futures import Future

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select import settings
from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.runtime import dense_builds, dense_worker, entries
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.options import CallOptions
from fusedattn_select.runtime.run_settings import run_settings
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store import MemoryStore, PersistentStore
from fusedattn_select.types import Backend, Phase

CFG = AttnConfig(batch_size=2, num_heads_q=8, num_heads_kv=2, seqlen_q=300, seqlen_kv=300, head_dim_qk=64,
                 qkv_dtype="bf16", mask="causal", is_training=True)


@pytest.mark.parametrize("value,expected", [("", "process"), ("process", "process"), ("inline", "inline")])
def test_the_mode_reads_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv(settings.DENSE_BUILDS, value)
    assert run_settings.get().dense_builds == expected


@pytest.mark.parametrize("value", ["thread", "processes", "0"])
def test_another_mode_is_refused_naming_the_variable_and_the_choices(monkeypatch, value):
    monkeypatch.setenv(settings.DENSE_BUILDS, value)
    with pytest.raises(ConfigError, match="'process', 'inline'") as err:
        run_settings.get()
    assert err.value.field == settings.DENSE_BUILDS


def test_training_needs_a_forward_and_a_backward_plan():
    assert dense_builds.plan_phases(CFG, Backend.F16, False) == [(CFG, Backend.F16, Phase.FORWARD),
                                                                  (CFG, Backend.F16, Phase.BACKWARD)]


def test_inference_wanting_the_lse_runs_the_training_forward_only():
    infer = CFG.replace(is_training=False)
    assert dense_builds.plan_phases(infer, Backend.F16, False) == [(infer, Backend.F16, Phase.FORWARD)]
    assert dense_builds.plan_phases(infer, Backend.F16, True) == [(CFG, Backend.F16, Phase.FORWARD)]


def test_an_fp8_training_routed_to_an_f16_backward_builds_that_backward():
    fp8 = CFG.replace(qkv_dtype="fp8_e4m3")
    got = dense_builds.plan_phases(fp8, Backend.FP8, False, backward_cfg=CFG)
    assert got == [(fp8, Backend.FP8, Phase.FORWARD), (CFG, Backend.F16, Phase.BACKWARD)]


def test_no_worker_without_a_live_engine_a_persistent_store_or_with_inline(monkeypatch, tmp_path, recording_engine,
                                                                          use_settings):
    use_settings(dense_builds="process")
    # The test double is not live cuDNN on a CUDA device: nothing a worker could build for.
    assert dense_builds.in_background(Selector(recording_engine, store=PersistentStore(tmp_path))) is None
    assert dense_builds.in_background(Selector(recording_engine, store=MemoryStore())) is None
    use_settings(dense_builds="inline")
    assert dense_builds.in_background(Selector(recording_engine, store=PersistentStore(tmp_path))) is None


def _options() -> CallOptions:
    return CallOptions("bshd", "no_mask", (-1, -1), None, 0.0, "vanilla", False, False, "", False, False,
                       False, False)


def test_an_entry_whose_worker_is_busy_runs_its_bucket_plans_and_waits():
    q = k = v = torch.empty(1, 4, 1, 8)
    busy: Future = Future()
    found = entries.Entry(_options(), ragged_forward={}, promotion="pending", pending=busy)
    for _ in range(5):
        assert entries.count_call(found, q, k, v) is found
    assert found.calls == 5 and found.promotion == "pending" and found.pending is busy


# ----- the worker process: its protocol, on a machine where it cannot build ----------------------------
def _job(tmp_path) -> dict:
    return {"config": CFG.to_dict(), "return_lse": False, "store_dir": str(tmp_path), "device": 0}


@pytest.fixture
def fresh_worker(monkeypatch):
    try:
        import cudnn  # noqa: F401
        pytest.skip("cuDNN frontend installed: the worker would build (tests/gpu/test_hot_path.py)")
    except ImportError:
        pass
    monkeypatch.setattr(dispatcher, "worker", None)
    monkeypatch.setattr(dispatcher, "worker_deaths", 0)
    yield
    if dispatcher.worker is not None:
        dispatcher.worker.close()
        dispatcher.worker.process.wait(timeout=60)


def test_a_job_the_worker_cannot_do_fails_its_future_with_the_workers_error(fresh_worker, tmp_path):
    future = dense_builds._submit(_job(tmp_path))
    err = future.exception(timeout=120)
    assert isinstance(err, RuntimeError) and "cudnn-frontend is not installed" in err.args[0]
    again = dense_builds._submit(_job(tmp_path))  # the same worker answers the next job
    assert isinstance(again.exception(timeout=120), RuntimeError)
    assert dispatcher.worker.process.poll() is None and dispatcher.worker_deaths == 0
    assert not dense_builds.report(again, CFG.cache_key())  # logged: the caller builds the plans itself


def test_a_worker_that_dies_before_answering_fails_its_jobs_counts_a_death_and_the_next_job_starts_another(
        fresh_worker, tmp_path):
    future = dense_builds._submit(_job(tmp_path))
    first = dispatcher.worker
    first.process.kill()  # long before it has imported what it needs to answer
    assert "exited with code" in str(future.exception(timeout=120))
    first.process.wait(timeout=60)
    dense_builds._submit(_job(tmp_path)).exception(timeout=120)
    assert dispatcher.worker is not first and dispatcher.worker_deaths == 1


def test_after_two_workers_died_before_answering_the_process_builds_inline(monkeypatch, tmp_path):
    monkeypatch.setattr(dense_builds, "in_background", lambda selector: (str(tmp_path), 0))
    monkeypatch.setattr(dispatcher, "worker_deaths", dense_builds.MAX_DEATHS)
    assert dense_builds.ask(None, CFG, False) is None


def test_a_worker_that_cannot_start_means_building_inline(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(dense_builds, "in_background", lambda selector: (str(tmp_path), 0))
    monkeypatch.setattr(dispatcher, "worker", None)
    monkeypatch.setattr(dense_builds.sys, "executable", str(tmp_path / "no-python-here"))
    with caplog.at_level("WARNING", logger="fusedattn_select"):
        assert dense_builds.ask(None, CFG, False) is None
    assert "no worker process for dense plans" in caplog.text and dispatcher.worker is None


def test_what_the_workers_libraries_print_does_not_corrupt_its_answers(fresh_worker, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('a library says hello', flush=True)\n")
    monkeypatch.syspath_prepend(str(site))  # the worker imports what this process imports
    future = dense_builds._submit(_job(tmp_path))
    assert "cudnn-frontend is not installed" in str(future.exception(timeout=120))
    assert dispatcher.worker_deaths == 0


def test_a_worker_whose_caller_is_gone_exits_quietly_when_it_answers():
    # The calling process exited (its end of the answer pipe closed) while the worker ran a job.
    import os
    import subprocess
    import sys

    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    worker = subprocess.run(
        [sys.executable, "-m", "fusedattn_select.runtime.dense_worker", str(write_fd)], pass_fds=(write_fd,),
        input='{"id": 0}\n', capture_output=True, text=True, env=env, timeout=120)
    os.close(write_fd)
    assert worker.returncode == 0 and "Traceback" not in worker.stderr, worker.stderr


def test_a_worker_started_ahead_is_the_one_jobs_go_to_and_answers_them_when_its_warm_up_failed(fresh_worker,
                                                                                               tmp_path, capfd,
                                                                                               caplog):
    dense_builds.prestart((str(tmp_path), 0))  # its warm-up fails here: no CUDA, no cuDNN frontend
    started = dispatcher.worker
    assert started is not None and started.process.poll() is None and started.ahead_for == (str(tmp_path), 0)
    dense_builds.prestart((str(tmp_path), 0))
    assert dispatcher.worker is started  # one worker per process
    err = dense_builds._submit(_job(tmp_path)).exception(timeout=120)
    assert isinstance(err, RuntimeError) and "cudnn-frontend is not installed" in err.args[0]
    assert dispatcher.worker is started and started.process.poll() is None and dispatcher.worker_deaths == 0
    # It warmed up first and said why it could not: once, through this process's logger, not on its stderr.
    said = [r for r in caplog.records if "the worker's warm-up failed" in r.getMessage()]
    assert len(said) == 1 and said[0].name == "fusedattn_select" and said[0].levelname == "WARNING"
    assert "warm-up failed" not in capfd.readouterr().err


def test_the_warm_up_loads_the_engine_on_the_device_and_opens_no_store(monkeypatch):
    from fusedattn_select.probing import choice
    from fusedattn_select.store import sqlite

    warmed, devices = [], []

    class WarmingTestEngine:  # TEST DOUBLE: only the warm-up is asked of it here
        def warm_up(self):
            warmed.append(True)

    @contextlib.contextmanager
    def device(index):
        devices.append(index)
        yield

    def no_store(*args, **kwargs):
        raise AssertionError("the warm-up opened a store")

    monkeypatch.setattr(choice, "live_engine_on", lambda index: devices.append(("engine", index)) or WarmingTestEngine())
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: None)  # the CUDA context, on a CPU machine
    monkeypatch.setattr(sqlite.PersistentStore, "__init__", no_store)
    dense_worker.warm(3)
    assert warmed == [True] and devices == [3, ("engine", 3)]


def test_a_worker_started_ahead_keeps_deciding_first_after_its_jobs_filled_the_store(fresh_worker, tmp_path,
                                                                                      monkeypatch):
    # register(model=...) queues build-ahead jobs in it, which create the store's file before the first call.
    from fusedattn_select.store.sqlite import DATABASE_NAME

    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(tmp_path))
    where = (str(tmp_path), 0)
    assert dense_builds.fresh_store_target(0) == where  # no file yet
    (tmp_path / DATABASE_NAME).touch()
    assert dense_builds.fresh_store_target(0) is None  # a store with files: the caller reads it first
    dense_builds.prestart(where)
    assert dense_builds.fresh_store_target(0) == where
    assert dense_builds.fresh_store_target(1) is None  # started ahead for another device


def test_no_worker_is_started_ahead_after_two_died_before_answering(monkeypatch):
    monkeypatch.setattr(dispatcher, "worker", None)
    monkeypatch.setattr(dispatcher, "worker_deaths", dense_builds.MAX_DEATHS)
    dense_builds.prestart(("unused", 0))
    assert dispatcher.worker is None


@pytest.mark.skipif(not hasattr(__import__("os"), "getpriority"), reason="no process priorities on this platform")
def test_the_worker_runs_at_the_lowest_cpu_priority_and_the_caller_keeps_its_own(fresh_worker, tmp_path):
    import os

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    future = dense_builds._submit(_job(tmp_path))
    future.exception(timeout=120)  # it answered: it is past its start
    assert os.getpriority(os.PRIO_PROCESS, dispatcher.worker.process.pid) == 19
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine


def test_a_failed_build_ahead_nobody_waits_for_is_a_warning_for_the_caller_to_log(tmp_path, capfd):
    from fusedattn_select.buckets import Bucket
    from fusedattn_select.config import AttnConfig
    from fusedattn_select.runtime import dense_worker

    cfg = AttnConfig(batch_size=1, num_heads_q=8, num_heads_kv=8, seqlen_q=300, seqlen_kv=300, head_dim_qk=64)
    job = {"kind": "ahead", "config": cfg, "bucket": Bucket(1, 512, 512), "return_lse": False,
           "store_dir": str(tmp_path), "device": 0}  # fails here: no CUDA, no cuDNN frontend
    said = dense_worker._run_ahead(job)
    assert set(said) == {"warning"} and said["warning"].startswith("building ahead failed ("), said
    assert capfd.readouterr().err == ""  # nothing on the worker's stderr: the caller logs it
    assert dense_worker._run_ahead(dict(job, id=7))["id"] == 7  # a job asked for is answered, not warned
