"""Persisted execution plans on CPU: the plan key, the blob format, and the load/build/persist decision.

Nothing here touches cuDNN's build or a GPU. The decision logic (plan_store.persistence.obtain) is exercised
with FakeGraphForTests, a TEST DOUBLE standing in for a built cuDNN graph: it is bytes in and bytes
out, it probes and proves nothing about cuDNN. Real serialization and deserialization are tested
on the device in tests/gpu/test_persistence.py.
"""

from __future__ import annotations

import collections
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fusedattn_select.buckets import bucket_form
from fusedattn_select.config import AttnConfig
from fusedattn_select.config_files import load_config_file
from fusedattn_select.plan_store import blob as plan_blob
from fusedattn_select.plan_store import calls, keys, persistence
from fusedattn_select.plan_store.blob import PlanBlobError, PlanHeader, TensorRecord
from fusedattn_select.plan_store.keys import GraphSignature
from fusedattn_select.probing.cudnn import plan_graphs
from fusedattn_select.selection.plan_warmup import PersistResult, PlanTarget
from fusedattn_select.store import MemoryStore, PersistentStore
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, ProbeDepth, Provenance, Verdict

ROOT = Path(__file__).resolve().parent.parent.parent

FINGERPRINT = Fingerprint("cuda", "Test GPU (plan-store test)", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")
OTHER_FINGERPRINT = Fingerprint("cuda", "Another test GPU", "10.0", 148, 91900, "1.32.0", "580.00", "0.1.0")

BASE = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024,
                  head_dim_qk=128, mask="causal")
SIGNATURE = GraphSignature(
    operation="sdpa",
    tensors={
        "q": ((2, 16, 1024, 128), (2097152, 128, 2048, 1), "BFLOAT16"),
        "k": ((2, 4, 1024, 128), (524288, 128, 512, 1), "BFLOAT16"),
        "v": ((2, 4, 1024, 128), (524288, 128, 512, 1), "BFLOAT16"),
        "o": ((2, 16, 1024, 128), (2097152, 128, 2048, 1), "BFLOAT16"),
        "stats": ((2, 16, 1024, 1), (16384, 1024, 1, 1), "FLOAT"),
    },
    options={"attn_scale": 0.08838834764831843, "diagonal_alignment": "diagonal_alignment.TOP_LEFT",
             "diagonal_band_right_bound": 0, "generate_stats": True},
)


def key_of(cfg=BASE, backend=Backend.F16, phase=Phase.FORWARD, signature=SIGNATURE, **kw):
    return keys.plan_key(cfg, backend, phase, signature, **kw)


# ----- the plan key ------------------------------------------------------------------------------
def test_plan_key_is_a_stable_sha256_hex_digest():
    key = key_of()
    assert len(key) == 64 and int(key, 16) >= 0
    assert key_of() == key
    # Fields given explicitly at their derived value describe the same graph.
    assert key_of(BASE.replace(head_dim_v=128, attn_scale=1 / 128 ** 0.5)) == key


def test_plan_key_is_the_same_in_another_process():
    script = (
        "from fusedattn_select.plan_store import keys\n"
        "from fusedattn_select.types import Backend, Phase\n"
        "from tests.runtime.test_plan_store_cpu import BASE, SIGNATURE\n"
        "print(keys.plan_key(BASE, Backend.F16, Phase.FORWARD, SIGNATURE))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == key_of()


CONFIG_CHANGES = {
    "batch_size": dict(batch_size=3),
    "num_heads_q": dict(num_heads_q=32),
    "num_heads_kv": dict(num_heads_kv=8),
    "seqlen_q": dict(seqlen_q=512),
    "seqlen_kv": dict(seqlen_kv=2048),
    "head_dim_qk": dict(head_dim_qk=64),
    "head_dim_v": dict(head_dim_v=64),
    "qkv_dtype": dict(qkv_dtype="fp16"),
    "qkv_layout": dict(qkv_layout="sbhd_sbhd_sbhd"),
    "o_format": dict(o_format="sbhd"),
    "dqkv_layout": dict(dqkv_layout="sbhd_sbhd_sbhd"),
    "mask": dict(mask="causal_bottom_right"),
    "window_size": dict(window_size=(128, 0)),
    "bottom_right_diagonal": dict(bottom_right_diagonal=True),
    "dropout": dict(dropout=0.1),
    "attn_scale": dict(attn_scale=0.5),
    "is_training": dict(is_training=False),
    "deterministic": dict(deterministic=True),
    "cuda_graph": dict(cuda_graph=True),
    "softmax": dict(softmax="off_by_one"),
    "bias": dict(bias="post_scale_bias", bias_shape="1hss"),
    "bias_shape": dict(bias="post_scale_bias", bias_shape="bhss"),
}


@pytest.mark.parametrize("field", list(CONFIG_CHANGES))
def test_plan_key_changes_with_every_graph_changing_config_field(field):
    changes = CONFIG_CHANGES[field]
    if field == "bias_shape":
        assert key_of(BASE.replace(bias="post_scale_bias", bias_shape="1hss")) != key_of(BASE.replace(**changes))
    else:
        assert key_of(BASE.replace(**changes)) != key_of(), field


def _with_tensor(name, dims=None, strides=None, dtype=None):
    tensors = dict(SIGNATURE.tensors)
    d, s, t = tensors[name]
    tensors[name] = (dims or d, strides or s, dtype or t)
    return GraphSignature(SIGNATURE.operation, tensors, SIGNATURE.options)


SIGNATURE_CHANGES = {
    "q dims": _with_tensor("q", dims=(2, 16, 1024, 64)),
    "q strides (sbhd)": _with_tensor("q", strides=(2048, 128, 4096, 1)),
    "k strides": _with_tensor("k", strides=(524288, 131072, 128, 1)),
    "v dtype": _with_tensor("v", dtype="HALF"),
    "o dtype": _with_tensor("o", dtype="FP8_E4M3"),
    "stats strides": _with_tensor("stats", strides=(16384, 1, 16, 1)),
    "an extra tensor": GraphSignature("sdpa", {**SIGNATURE.tensors, "seed": ((1, 1, 1, 1), (1, 1, 1, 1), "INT64")},
                                      SIGNATURE.options),
    "a missing tensor": GraphSignature("sdpa", {n: t for n, t in SIGNATURE.tensors.items() if n != "stats"},
                                       SIGNATURE.options),
    "an option value": GraphSignature("sdpa", SIGNATURE.tensors, {**SIGNATURE.options, "attn_scale": 0.125}),
    "an extra option": GraphSignature("sdpa", SIGNATURE.tensors, {**SIGNATURE.options, "use_padding_mask": True}),
    "the operation": GraphSignature("sdpa_fp8", SIGNATURE.tensors, SIGNATURE.options),
}


@pytest.mark.parametrize("what", list(SIGNATURE_CHANGES))
def test_plan_key_changes_with_the_graph_call_signature(what):
    assert key_of(signature=SIGNATURE_CHANGES[what]) != key_of()


def test_plan_key_changes_with_backend_phase_and_build_mode():
    keys = {key_of(), key_of(phase=Phase.BACKWARD), key_of(backend=Backend.FP8), key_of(build="kernel_cache")}
    assert len(keys) == 4


def test_graph_signature_reads_the_described_graph():
    """The signature dispatch and warmup key plans by, from cudnn-frontend's graph description (no build)."""
    pytest.importorskip("cudnn")
    forward = plan_graphs.graph_signature(BASE, Backend.F16, Phase.FORWARD)
    backward = plan_graphs.graph_signature(BASE, Backend.F16, Phase.BACKWARD)
    assert forward.operation == "sdpa" and backward.operation == "sdpa_backward"
    assert forward.tensors["q"][0] == (2, 16, 1024, 128) and forward.tensors["q"][2] == "BFLOAT16"
    assert {"dQ", "dK", "dV", "dO"} <= set(backward.tensors)
    assert plan_graphs.graph_signature(BASE.replace(head_dim_v=128), Backend.F16, Phase.FORWARD) == forward
    sbhd = plan_graphs.graph_signature(BASE.replace(qkv_layout="sbhd_sbhd_sbhd"), Backend.F16, Phase.FORWARD)
    assert sbhd.tensors["q"][1] != forward.tensors["q"][1]
    json.dumps(forward.to_dict())  # enum options are canonicalised to text


# ----- which problems attention() runs -----------------------------------------------------------
def test_dispatch_config_matches_what_attention_derives_from_dense_tensors():
    torch = pytest.importorskip("torch")
    from fusedattn_select.runtime.api import config_from_tensors

    perms = {"bshd": (0, 2, 1, 3), "sbhd": (2, 0, 1, 3), "bhsd": (0, 1, 2, 3)}
    entries = load_config_file(ROOT / "configs" / "llama-3-8b.yaml").entries
    warmed = []
    for entry in entries:
        cfg = entry.config
        dispatched = calls.dispatch_config(cfg)
        if dispatched is None:
            assert calls.not_dispatched_reason(cfg)
            continue
        warmed.append(entry.name)
        fmt = cfg.qkv_layout.split("_")[0]

        def tensor(b, h, s, d, fmt=fmt):
            return torch.empty((b, h, s, d), device="meta", dtype=torch.bfloat16).permute(perms[fmt]).contiguous()

        q = tensor(cfg.batch_size, cfg.num_heads_q, cfg.seqlen_q, cfg.head_dim_qk)
        k = tensor(cfg.batch_size, cfg.num_heads_kv, cfg.seqlen_kv, cfg.head_dim_qk)
        v = tensor(cfg.batch_size, cfg.num_heads_kv, cfg.seqlen_kv, cfg.resolved_head_dim_v)
        lens = torch.empty(cfg.batch_size, dtype=torch.int32, device="meta") if cfg.has_padding else None
        derived = config_from_tensors(q, k, v, layout=fmt, mask=cfg.mask, deterministic=cfg.deterministic,
                                      seqlens_q=lens, seqlens_kv=lens, is_training=cfg.is_training)
        assert derived.cache_key() == cfg.cache_key() == dispatched.cache_key(), entry.name
    assert {"train-bf16", "train-bf16-sbhd", "train-bf16-deterministic", "prefill", "decode"} <= set(warmed)
    skipped = {e.name for e in entries} - set(warmed)
    assert {"train-bf16-packed-thd", "decode-paged", "decode-cuda-graph"} <= skipped


def test_problems_attention_cannot_express_get_no_dispatch_config():
    assert "not a layout" in calls.not_dispatched_reason(BASE.replace(qkv_layout="thd_thd_thd", mask="padding_causal"))
    assert "cuda_graph" in calls.not_dispatched_reason(BASE.replace(cuda_graph=True))
    assert calls.dispatch_config(BASE.replace(o_format="sbhd")) is None  # attention() returns Q's format
    assert calls.dispatch_config(BASE.replace(bias="pre_scale_bias")) is None
    assert calls.dispatch_config(BASE).cache_key() == BASE.cache_key()


# ----- the blob ----------------------------------------------------------------------------------
HEADER = PlanHeader("a" * 64, "sdpa", 4096, {
    "q": TensorRecord(1, (2, 16, 1024, 128), (2097152, 128, 2048, 1), "BFLOAT16"),
    "o": TensorRecord(4, (2, 16, 1024, 128), (2097152, 128, 2048, 1), "BFLOAT16"),
}, "1.32.0")


def test_blob_round_trips_header_and_graph_bytes():
    blob = plan_blob.pack(HEADER, b"\x00cudnn bytes\xff")
    header, graph = plan_blob.unpack(blob, "a" * 64)
    assert header == HEADER and graph == b"\x00cudnn bytes\xff"


@pytest.mark.parametrize("damage, message", [
    (lambda b: b"NOTAPLAN" + b[8:], "magic"),
    (lambda b: b[:20], "truncated"),
    (lambda b: b[:len(b) - len(b"graph")], "no serialized graph"),
    (lambda b: b.replace(b'"format":1', b'"format":9'), "format"),
    (lambda b: b.replace(b'"dims":[2,16', b'"dims":["",6'), "does not parse"),
])
def test_damaged_blobs_are_refused(damage, message):
    blob = plan_blob.pack(HEADER, b"graph")
    with pytest.raises(PlanBlobError, match=message):
        plan_blob.unpack(damage(blob), "a" * 64)


def test_a_blob_of_another_plan_key_is_refused():
    with pytest.raises(PlanBlobError, match="built for plan"):
        plan_blob.unpack(plan_blob.pack(HEADER, b"graph"), "b" * 64)


def test_serialize_build_records_uids_dims_and_dtypes_of_every_tensor():
    pytest.importorskip("cudnn")

    class TensorForTests:  # TEST DOUBLE of a graph tensor: only its uid
        def __init__(self, uid):
            self.uid = uid

    class GraphForTests:  # TEST DOUBLE of a built graph: serializes to fixed bytes
        def serialize(self, as_bytes=False):
            return b"serialized by GraphForTests" if as_bytes else list(b"serialized by GraphForTests")

    import cudnn

    build = SimpleNamespace(
        graph=GraphForTests(), operation="sdpa", workspace_size=512,
        tensors={"q": TensorForTests(3), "o": TensorForTests(7)},
        dims_strides={"q": ((1, 2, 8, 64), (1024, 512, 64, 1)), "o": ((1, 2, 8, 64), (1024, 512, 64, 1))},
        data_types={"q": cudnn.data_type.HALF, "o": cudnn.data_type.HALF},
    )
    header, graph = plan_blob.unpack(plan_graphs.serialize_build(build, "c" * 64), "c" * 64)
    assert graph == b"serialized by GraphForTests"
    assert header.tensors["q"] == TensorRecord(3, (1, 2, 8, 64), (1024, 512, 64, 1), "HALF")
    assert header.tensors["o"].uid == 7 and header.workspace_size == 512


# ----- load or build: obtain() -------------------------------------------------------------------
class FakeGraphForTests:
    """TEST DOUBLE of a built cuDNN plan for the load/build/persist logic: it carries a label and
    serializes to bytes that name it. It is not cuDNN and proves nothing about cuDNN."""

    def __init__(self, label: str) -> None:
        self.label = label

    def to_bytes(self) -> bytes:
        return b"FakeGraphForTests:" + self.label.encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "FakeGraphForTests":
        prefix = b"FakeGraphForTests:"
        if not blob.startswith(prefix):
            raise ValueError("not a FakeGraphForTests blob")
        return cls(blob[len(prefix):].decode())


class Recorder:
    """Counts what obtain() asked of build / serialize / load."""

    def __init__(self, label="built", build_delay=0.0, fail_build=False, fail_serialize=False):
        self.label, self.build_delay = label, build_delay
        self.fail_build, self.fail_serialize = fail_build, fail_serialize
        self.calls = collections.Counter()
        self.lock = threading.Lock()

    def build(self):
        with self.lock:
            self.calls["build"] += 1
        time.sleep(self.build_delay)
        if self.fail_build:
            raise RuntimeError("build failed (test double)")
        return FakeGraphForTests(self.label)

    def serialize(self, graph):
        with self.lock:
            self.calls["serialize"] += 1
        if self.fail_serialize:
            raise RuntimeError("serialize failed (test double)")
        return graph.to_bytes()

    def load(self, blob):
        with self.lock:
            self.calls["load"] += 1
        return FakeGraphForTests.from_bytes(blob)

    def obtain(self, store, key="k" * 64, fingerprint=FINGERPRINT):
        return persistence.obtain(key, store=store, fingerprint=fingerprint, build=self.build,
                                 serialize=self.serialize, load=self.load)


@pytest.fixture
def store(tmp_path):
    directory = tmp_path / "plans"
    directory.mkdir(mode=0o700)
    return PersistentStore(directory)


def test_a_miss_builds_once_and_persists_the_serialized_plan(store):
    first = Recorder()
    graph, origin = first.obtain(store)
    assert origin == persistence.BUILT and graph.label == "built"
    assert first.calls == {"build": 1, "serialize": 1}
    assert store.get_plan(FINGERPRINT, "k" * 64) == b"FakeGraphForTests:built"


def test_a_stored_plan_is_loaded_not_built(store):
    Recorder(label="from another process").obtain(store)
    later = Recorder()
    graph, origin = later.obtain(store)
    assert origin == persistence.LOADED and graph.label == "from another process"
    assert later.calls == {"load": 1}


def test_plans_are_filed_under_their_fingerprint(store):
    Recorder().obtain(store)
    other = Recorder()
    _, origin = other.obtain(store, fingerprint=OTHER_FINGERPRINT)
    assert origin == persistence.BUILT and other.calls["build"] == 1


def test_a_plan_that_does_not_load_is_dropped_with_a_warning_and_rebuilt(store, caplog):
    store.put_plan(FINGERPRINT, "k" * 64, b"garbage that no frontend reads")
    rec = Recorder(label="rebuilt")
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        graph, origin = rec.obtain(store)
    assert origin == persistence.REBUILT and graph.label == "rebuilt"
    assert rec.calls == {"load": 1, "build": 1, "serialize": 1}
    assert any("dropped the stored plan" in r.getMessage() and "does not load" in r.getMessage()
               for r in caplog.records)
    assert store.get_plan(FINGERPRINT, "k" * 64) == b"FakeGraphForTests:rebuilt"  # the bad blob is replaced
    _, again = Recorder().obtain(store)
    assert again == persistence.LOADED


def test_a_build_error_propagates_and_stores_nothing(store):
    with pytest.raises(RuntimeError, match="build failed"):
        Recorder(fail_build=True).obtain(store)
    assert store.get_plan(FINGERPRINT, "k" * 64) is None


def test_a_plan_that_cannot_be_serialized_still_runs_unpersisted(store, caplog):
    rec = Recorder(fail_serialize=True)
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        graph, origin = rec.obtain(store)
    assert origin == persistence.BUILT and graph.label == "built"
    assert store.get_plan(FINGERPRINT, "k" * 64) is None
    assert any("cannot be serialized" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kind", ["none", "memory"])
def test_without_a_persistent_store_every_process_builds(kind):
    store = None if kind == "none" else MemoryStore()
    rec = Recorder()
    assert rec.obtain(store)[1] == persistence.BUILT
    assert rec.obtain(store)[1] == persistence.BUILT
    assert rec.calls == {"build": 2}  # nothing serialized: a memory store helps no other process
    assert not persistence.persists_plans(store)


def test_a_directory_others_can_write_is_refused_for_plans(tmp_path, caplog):
    directory = tmp_path / "shared"
    directory.mkdir()
    store = PersistentStore(directory)
    os.chmod(directory, 0o777)
    store.put_plan(FINGERPRINT, "k" * 64, FakeGraphForTests("planted").to_bytes())
    rec = Recorder()
    with caplog.at_level(logging.WARNING, logger="fusedattn_select"):
        graph, origin = rec.obtain(store)
    assert origin == persistence.BUILT and graph.label == "built" and rec.calls["load"] == 0
    assert store.get_plan(FINGERPRINT, "k" * 64) is None
    assert any("not using serialized plans" in r.getMessage() for r in caplog.records)


def test_threads_wanting_one_plan_build_it_once(store):
    rec = Recorder(build_delay=0.2)
    results = []
    threads = [threading.Thread(target=lambda: results.append(rec.obtain(store))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert rec.calls["build"] == 1
    assert sorted(origin for _, origin in results) == [persistence.BUILT] + [persistence.LOADED] * 5


def _obtain_in_process(directory, log_path, barrier):
    class LoggingRecorder(Recorder):
        def build(self):
            with open(log_path, "a") as log:
                log.write(f"{os.getpid()}\n")
            return super().build()

    store = PersistentStore(directory)
    barrier.wait()
    _, origin = LoggingRecorder(build_delay=0.3).obtain(store)
    if origin not in (persistence.BUILT, persistence.LOADED):
        raise SystemExit(1)


def test_processes_wanting_one_plan_build_it_once_in_total(tmp_path):
    directory, log_path = tmp_path / "cache", tmp_path / "builds.log"
    directory.mkdir(mode=0o700)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(4)
    procs = [context.Process(target=_obtain_in_process, args=(str(directory), str(log_path), barrier))
             for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    assert len(log_path.read_text().splitlines()) == 1


# ----- dispatch's persistence policy ------------------------------------------------------------
def test_dispatch_persists_only_with_a_live_cudnn_engine_and_a_persistent_store(store):
    pytest.importorskip("torch")
    from fusedattn_select.runtime import plans
    live = SimpleNamespace(name="cudnn", device=0)  # the attributes the policy reads, nothing more
    assert plans._persistence(SimpleNamespace(store=store, fingerprint=FINGERPRINT, engine=live), 0) \
        == (store, FINGERPRINT)
    snapshot = SimpleNamespace(name="snapshot", device=0)
    assert plans._persistence(SimpleNamespace(store=store, fingerprint=FINGERPRINT, engine=snapshot), 0) \
        == (None, None)
    assert plans._persistence(SimpleNamespace(store=MemoryStore(), fingerprint=FINGERPRINT, engine=live), 0) \
        == (None, None)
    assert plans._persistence(None, 0) == (None, None)


def test_a_loaded_graph_must_bind_the_tensors_of_its_plan_key():
    pytest.importorskip("torch")
    cudnn = pytest.importorskip("cudnn")  # cudnn-frontend (the 'cuda' extra) names the data types

    from fusedattn_select.runtime import plans
    def stored(**overrides):
        tensors = {n: i + 1 for i, n in enumerate(SIGNATURE.tensors)}
        dims_strides = {n: (d, s) for n, (d, s, _) in SIGNATURE.tensors.items()}
        data_types = {n: getattr(cudnn.data_type, t) for n, (_, _, t) in SIGNATURE.tensors.items()}
        for name, value in overrides.items():
            dims_strides[name] = value
        return plan_graphs.StoredGraph(None, tensors, dims_strides, data_types, "sdpa", 0)

    plans._check_signature(stored(), SIGNATURE)
    with pytest.raises(PlanBlobError, match="'q'"):
        plans._check_signature(stored(q=((2, 16, 1024, 128), (1, 1, 1, 1))), SIGNATURE)


# ----- warmup's plan step -----------------------------------------------------------------------
class PlanPersistDoubleForTests:
    """TEST DOUBLE of plan_warmup.persist_plans: records what warmup asked for, builds nothing."""

    def __init__(self, failure=None):
        self.failure = failure
        self.calls = []

    def __call__(self, cfg, backend, target):
        self.calls.append((cfg.cache_key(), backend))
        if self.failure is not None:
            return PersistResult(0, 0, "did not build (test double)", self.failure)
        return PersistResult(len(cfg.phases), 0)


class AcceptingEngineForTests:
    """TEST DOUBLE engine: every graph SUPPORTED at build_plans. Probes nothing."""

    name = "accepting-test-engine"
    provenance = Provenance.LIVE_PROBE

    def fingerprint(self):
        return Fingerprint("test", "AcceptingEngineForTests", library_version="test")

    def probe(self, cfg, backend, phase, depth):
        return Verdict(backend, phase, Outcome.SUPPORTED, "build_plans", depth=depth)


def test_warmup_builds_plans_for_accepted_problems_attention_runs(monkeypatch, store):
    from fusedattn_select.selection import local_warmup
    from fusedattn_select.selection.selector import Selector

    double = PlanPersistDoubleForTests()
    monkeypatch.setattr(local_warmup, "persist_plans", double)
    engine = AcceptingEngineForTests()
    selector = Selector(engine, store=store)
    thd = BASE.replace(qkv_layout="thd_thd_thd", mask="padding_causal")
    rows = {name: local_warmup._warm_one(selector, name, cfg, cfg.cache_key(), ProbeDepth.FULL,
                                          PlanTarget(store, FINGERPRINT, engine))
            for name, cfg in (("train", BASE), ("infer", BASE.replace(is_training=False)), ("thd", thd))}
    # BSHD problems run their shape bucket's plans (every smaller shape of the class runs in that
    # bucket too); a THD problem runs its own plans, which dispatch never asks for from tensors.
    assert (rows["train"].plans_built, rows["infer"].plans_built) == (2, 1)
    assert rows["thd"].plans_built == 0 and "not a layout" in rows["thd"].plan_note
    assert [call[0] for call in double.calls] == [bucket_form(BASE).cache_key(),
                                                  bucket_form(BASE.replace(is_training=False)).cache_key()]


def test_warmup_flips_a_problem_whose_plan_does_not_build(monkeypatch, store):
    from fusedattn_select.selection import local_warmup
    from fusedattn_select.selection.selector import Selector

    failure = Verdict(Backend.F16, Phase.BACKWARD, Outcome.UNSUPPORTED, "build_plans", "no engine (test double)",
                      depth=ProbeDepth.FULL)
    monkeypatch.setattr(local_warmup, "persist_plans", PlanPersistDoubleForTests(failure))
    engine = AcceptingEngineForTests()
    selector = Selector(engine, store=store)
    row = local_warmup._warm_one(selector, "train", BASE, BASE.cache_key(), ProbeDepth.FULL,
                                  PlanTarget(store, FINGERPRINT, engine))
    assert row.backend is Backend.NONE and "no engine (test double)" in row.reason
    assert selector.select(BASE).backend is Backend.NONE


def test_warmup_without_a_live_cudnn_engine_builds_no_plans_and_says_why(store):
    from fusedattn_select.selection.local_warmup import warmup
    from fusedattn_select.selection.selector import Selector

    report = warmup([BASE], selector=Selector(AcceptingEngineForTests(), store=store))
    assert report.totals["plans_built"] == 0 and "live cuDNN engine" in report.plan_note
    assert report.to_dict()["plan_note"] == report.plan_note
    assert report.rows[0].to_dict()["plans"] == {"built": 0, "stored": 0, "note": ""}
    assert "execution plans" not in report.summary()
    fast = warmup([BASE], depth="fast", selector=Selector(AcceptingEngineForTests(), store=store))
    assert fast.plan_note == "depth fast builds nothing"
