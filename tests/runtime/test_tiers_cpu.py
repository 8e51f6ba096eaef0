"""First contact on CPU (runtime/tiers.py): why a signature waits, the prepared torch SDPA call of a
signature against torch's SDPA computed directly, the dummy tensors a waiting signature is decided
with, plans under a limit, and the worker's job order (runtime/dense_worker.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import itertools
import json
import queue
import threading
from concurrent.futures import Future

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select import offpath, settings
from fusedattn_select.config import AttnConfig
from fusedattn_select.runtime import dense_builds, dense_worker, entries, fallback, plans, tiers
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.args import Arguments, call_options
from fusedattn_select.runtime.entries import Entry
from fusedattn_select.runtime.options import OptionalInputs
from fusedattn_select.types import Backend, Fingerprint, Phase

NONE = OptionalInputs(None, None, None, None, None)
DIMS = {"bshd": (0, 2, 1, 3), "sbhd": (2, 0, 1, 3), "bhsd": (0, 1, 2, 3)}  # BHSD dims -> the layout's
TO_BHSD = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}


def tensor(layout: str, b: int, h: int, s: int, d: int, dtype=torch.bfloat16, cls=None) -> torch.Tensor:
    t = torch.randn(b, h, s, d).permute(DIMS[layout]).contiguous().to(dtype)
    return t.as_subclass(cls) if cls is not None else t


def qkv(layout="bshd", sq=64, skv=64, hq=4, hkv=4, d=64, dtype=torch.bfloat16, cls=None):
    return (tensor(layout, 2, hq, sq, d, dtype, cls), tensor(layout, 2, hkv, skv, d, dtype, cls),
            tensor(layout, 2, hkv, skv, d, dtype, cls))


def signature(q, k, v, inputs=NONE, **arguments) -> tuple:
    """The signature attention() decides (api._decide): entries.key of the call's options."""
    return entries.key(q, k, v, call_options(q, k, v, inputs, Arguments(**arguments)), inputs)


def reason(q, k, v, inputs=NONE, sig=None, **arguments) -> str:
    plain = (t.as_subclass(torch.Tensor) for t in (q, k, v))  # entries.key asks CUDA whether it captures
    sig = sig or signature(*plain, inputs, **arguments)
    return tiers.wait_reason(sig, q, k, v, inputs, None)


class ClaimsCuda(torch.Tensor):
    """A CPU tensor whose is_cuda says True: wait_reason reads only geometry and options, so this
    reaches its checks after "not a CUDA call" (nothing runs on it, nothing is probed)."""

    @property
    def is_cuda(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def claims_cuda_is_plain(monkeypatch):
    """ClaimsCuda stands in for a plain CUDA tensor here: wait_reason's subclass check lets it through
    (test_tensor_subclasses_cpu.py tests that check)."""
    real = tiers.tensor_subclass
    monkeypatch.setattr(tiers, "tensor_subclass",
                        lambda *qkv: real(*(t.as_subclass(torch.Tensor) if type(t) is ClaimsCuda else t for t in qkv)))


# ----- wait_reason -----------------------------------------------------------------------------------
@pytest.mark.parametrize("arguments", [{}, {"mask": "causal"}, {"return_lse": True}, {"mask": "padding"},
                                       {"window_size": (8, 0)}, {"fp8": True}])
def test_a_cpu_call_waits_because_it_is_not_a_cuda_call(arguments):
    assert reason(*qkv(), **arguments) == "not a CUDA call"
    with offpath.only(offpath.MEMORY):
        assert reason(*qkv(), **arguments) == "not a CUDA call"


def test_first_calls_wait_is_named_before_anything_else(use_settings):
    use_settings(first_calls="wait")
    for q, k, v in (qkv(), qkv(cls=ClaimsCuda)):
        why = reason(q, k, v, deterministic=True)
        assert why == "FUSEDATTN_SELECT_FIRST_CALLS=wait" and settings.FIRST_CALLS in why


def test_capture_and_deterministic_wait_even_on_cpu():
    q, k, v = qkv()
    captured = signature(q, k, v)[:-1] + (True,)
    assert reason(q, k, v, sig=captured) == "CUDA-graph capture"
    assert reason(q, k, v, deterministic=True) == "deterministic=True"
    assert reason(*qkv(cls=ClaimsCuda), deterministic=True) == "deterministic=True"


def test_training_waits_where_torch_cannot_tell_a_checkpointed_forward(monkeypatch):
    old_torch = "training on a torch without the saved-tensor hook stack (torch < 2.8)"
    q, k, v = (t.requires_grad_() for t in qkv(cls=ClaimsCuda))
    plain = [t.detach().as_subclass(torch.Tensor).requires_grad_() for t in (q, k, v)]
    # torch's own flash / memory-efficient checks refuse CPU tensors: here they stand for a CUDA call they take.
    monkeypatch.setattr(tiers, "_flash_or_efficient", lambda *args: True)
    monkeypatch.setattr(dispatcher, "no_cudnn", "")  # a process whose cuDNN frontend imports
    with torch.enable_grad():
        sig = signature(*plain)
        assert sig[0].training
        monkeypatch.setattr(tiers, "_top_hooks", lambda ignore_is_tracing: None)  # torch 2.8+, no hooks set
        assert tiers.wait_reason(sig, q, k, v, NONE, None) == ""  # training runs on torch first
        monkeypatch.setattr(tiers, "_top_hooks", None)  # a torch before 2.8
        assert tiers.wait_reason(sig, q, k, v, NONE, None) == old_torch
        assert reason(*(t.detach().requires_grad_() for t in qkv())) == "not a CUDA call"
        # Without the cuDNN frontend there is no swap to guard against: torch runs it for good.
        monkeypatch.setattr(dispatcher, "no_cudnn", "the cuDNN frontend (module cudnn) is not installed")
        assert tiers.wait_reason(sig, q, k, v, NONE, None) == ""
        monkeypatch.setattr(dispatcher, "no_cudnn", "")
        inference = signature(*(t.detach() for t in plain))
        assert not inference[0].training
        assert tiers.wait_reason(inference, q, k, v, NONE, None) == ""


@pytest.mark.parametrize("arguments, sq, skv, dtype, expected", [
    ({"return_lse": True}, 64, 64, torch.bfloat16, "torch SDPA cannot run return_lse=True"),
    ({"mask": "padding"}, 64, 64, torch.bfloat16, "torch SDPA cannot run mask='padding'"),
    ({"mask": "padding_causal"}, 64, 64, torch.float16, "torch SDPA cannot run mask='padding_causal'"),
    ({"window_size": (8, 0)}, 64, 64, torch.bfloat16, "torch SDPA cannot run window_size=(8, 0)"),
    ({"softmax": "off_by_one"}, 64, 64, torch.bfloat16, "torch SDPA cannot run softmax='off_by_one'"),
    ({"fp8": True}, 64, 64, torch.bfloat16, "FP8, or optional tensors"),
    ({"mask": "causal_bottom_right"}, 32, 64, torch.bfloat16, "a bottom-right causal mask over unequal lengths"),
    ({"mask": "causal_bottom_right"}, 64, 32, torch.bfloat16, "torch SDPA cannot run bottom-right causal mask with"),
    ({}, 64, 64, torch.float32, "neither flash nor memory-efficient attention takes it"),
    # reentrant checkpointing's forward is an inference call: on torch it drew torch's mask, and the
    # recomputation on cuDNN another (the gradients were of a mask the loss never saw, on an H200)
    ({"dropout": 0.1}, 64, 64, torch.bfloat16, "dropout (its mask is the kernel's)"),
])
def test_a_cuda_call_names_why_it_waits(arguments, sq, skv, dtype, expected):
    assert reason(*qkv(sq=sq, skv=skv, dtype=dtype, cls=ClaimsCuda), **arguments).startswith(expected)


def test_optional_tensors_and_a_limited_decision_wait():
    q, k, v = qkv(cls=ClaimsCuda)
    bias = OptionalInputs(torch.zeros(1, 4, 64, 64, dtype=torch.bfloat16), None, None, None, None)
    sig = signature(*qkv(), inputs=bias)
    assert tiers.wait_reason(sig, q, k, v, bias, None) == "FP8, or optional tensors"
    with offpath.only(offpath.STORED):
        assert reason(q, k, v) == "a limited decision"


@pytest.mark.skipif(importlib.util.find_spec("cudnn") is not None, reason="the cuDNN frontend is installed here")
def test_without_the_cudnn_frontend_torch_runs_each_signature_for_good_and_it_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(dispatcher, "no_cudnn", None)
    monkeypatch.setattr(dispatcher, "worker", None)
    # torch's own flash / memory-efficient checks refuse CPU tensors: here they stand for a CUDA call they take.
    monkeypatch.setattr(tiers, "_flash_or_efficient", lambda *args: True)
    prepared = []
    monkeypatch.setattr(dispatcher.preparer, "submit", prepared.append)
    with caplog.at_level("WARNING", logger="fusedattn_select"):
        for skv in (64, 65):  # a decode-like new KV length: a new signature, nothing to wait for either
            q, k, v = qkv(skv=skv, cls=ClaimsCuda)
            plain = [t.as_subclass(torch.Tensor) for t in (q, k, v)]
            sig = signature(*plain)
            assert tiers.wait_reason(sig, q, k, v, NONE, None) == ""  # a call that would otherwise wait
            found = tiers.entry(sig, q, k, v, NONE, None)
            assert found.runner == entries.RUN_TORCH and found.waiting is None
            assert "cuDNN frontend (module cudnn) is not installed" in found.torch_because
            expected = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in plain))
            torch.testing.assert_close(found.torch_call(*plain), expected.transpose(1, 2))
            # The paths that never switch kernels (compiled ops, checkpointing) keep torch too: nothing else can run it.
            assert tiers.cudnn_entry(found, sig, q, k, v, NONE, None) is found
    assert prepared == [] and dispatcher.worker is None  # no preparation, no worker process
    assert caplog.text.count("is not installed") == 1


@pytest.fixture
def early(monkeypatch):
    """start_early as on a machine with one GPU and the cuDNN frontend: the selector made on device 0
    (no CUDA here: its device context is a no-op), from a store directory that holds a file when
    asked; returns (the selector module, store_with_a_file())."""
    from fusedattn_select.selection import selector as selection
    from fusedattn_select.store.sqlite import DATABASE_NAME
    from fusedattn_select.store.store_settings import default_cache_dir

    monkeypatch.setattr(dispatcher, "no_cudnn", "")
    monkeypatch.setattr(tiers, "_current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())

    def store_with_a_file() -> None:
        default_cache_dir().mkdir(parents=True, exist_ok=True)
        (default_cache_dir() / DATABASE_NAME).touch()

    return selection, store_with_a_file


def test_start_early_makes_the_selector_from_a_store_that_holds_files(early):
    selection, store_with_a_file = early
    store_with_a_file()
    made = tiers.start_early()
    assert made is not None
    selector = made.result(timeout=60)
    assert selector is not None and selection.made_default_selector() is selector
    assert tiers.start_early() is None  # made already


def test_start_early_warms_the_engine_up_before_it_hands_the_selector_over(early, monkeypatch):
    """A selector's live engine builds its warm-up graph (cuDNN loading its libraries) at its first
    probe; made ahead, it is warmed up there, during the model's load, not at the first plan load."""
    selection, store_with_a_file = early
    store_with_a_file()
    warmed_on = []

    class WarmingTestEngine:  # TEST DOUBLE: only the warm-up is asked of it here
        name, provenance = "warming-test-engine", None

        def fingerprint(self):
            return Fingerprint("test-double", "Test GPU", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")

        def warm_up(self) -> None:
            warmed_on.append(threading.current_thread().name)

    made_selector = selection.Selector(WarmingTestEngine())
    monkeypatch.setattr(selection, "default_selector", lambda: made_selector)
    made = tiers.start_early()
    assert made is not None and made.result(timeout=60) is made_selector
    assert warmed_on == ["fusedattn-selector"]


def test_start_early_leaves_an_empty_store_to_the_worker_and_starts_it(early, monkeypatch):
    from fusedattn_select.store.store_settings import default_cache_dir

    selection, store_with_a_file = early
    started = []
    monkeypatch.setattr(dense_builds, "prestart", started.append)
    assert tiers.start_early() is None  # this test's store directory holds no file
    assert selection.made_default_selector() is None
    assert started == [(str(default_cache_dir()), 0)]
    store_with_a_file()
    tiers.start_early().result(timeout=60)
    assert len(started) == 1  # a store with files: the selector is made here, no worker ahead


def test_start_early_starts_no_worker_where_several_devices_are_visible(early, monkeypatch):
    # The device the calls go to is a guess there: a worker warmed up on another would hold a context on it.
    selection, _ = early
    started = []
    monkeypatch.setattr(dense_builds, "prestart", started.append)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert tiers.start_early() is None and started == []


def test_start_early_starts_no_worker_where_first_calls_wait(early, monkeypatch, use_settings):
    # Every call then decides on the caller's path: the worker would only ever build promotions.
    selection, _ = early
    started = []
    monkeypatch.setattr(dense_builds, "prestart", started.append)
    use_settings(first_calls="wait")
    assert tiers.start_early() is None and started == [] and selection.made_default_selector() is None


def test_start_early_makes_nothing_without_the_frontend(early, monkeypatch):
    selection, store_with_a_file = early
    store_with_a_file()
    monkeypatch.setattr(dispatcher, "no_cudnn", "the cuDNN frontend (module cudnn) is not installed")
    assert tiers.start_early() is None and selection.made_default_selector() is None


def test_start_early_leaves_a_selector_it_cannot_make_to_the_first_call(early, monkeypatch):
    selection, store_with_a_file = early
    store_with_a_file()

    def cannot() -> None:
        raise RuntimeError("no usable CUDA device")

    monkeypatch.setattr(selection, "default_selector", cannot)
    made = tiers.start_early()
    assert made is not None and made.result(timeout=60) is None
    assert selection.made_default_selector() is None


def test_the_device_made_on_is_the_current_one_or_the_only_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert tiers._current_device() == 0
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert tiers._current_device() is None  # several devices, none chosen yet
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert tiers._current_device() == 1


# ----- torch_call --------------------------------------------------------------------------------------
def reference(layout, mask, q, k, v, scale):
    """Float32 SDPA on BHSD views with an explicit mask and repeated KV heads."""
    qb, kb, vb = (t.float().permute(TO_BHSD[layout]) for t in (q, k, v))
    groups = qb.shape[1] // kb.shape[1]
    kb, vb = kb.repeat_interleave(groups, 1), vb.repeat_interleave(groups, 1)
    sq, skv = qb.shape[2], kb.shape[2]
    rows, cols = torch.arange(sq).view(sq, 1), torch.arange(skv).view(1, skv)
    allowed = {"no_mask": None, "causal": cols <= rows, "causal_bottom_right": cols <= rows + (skv - sq)}[mask]
    out = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=allowed, scale=scale)
    return out.permute(DIMS[layout])


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "causal_bottom_right"])
@pytest.mark.parametrize("sq", [48, 1])
@pytest.mark.parametrize("hkv", [4, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_torch_call_matches_sdpa_computed_directly(layout, mask, sq, hkv, dtype):
    scale = 0.2 if hkv == 2 else None
    q, k, v = qkv(layout, sq=sq, skv=48, hq=4, hkv=hkv, d=32, dtype=dtype)
    opts = call_options(q, k, v, NONE, Arguments(layout=layout, mask=mask, attn_scale=scale))
    call = tiers.torch_call(opts, q, k, v)
    for tensors in ((q, k, v), qkv(layout, sq=sq, skv=48, hq=4, hkv=hkv, d=32, dtype=dtype)):  # prepared once
        out = call(*tensors)
        assert out.shape == tensors[0].shape and out.dtype == dtype
        tol = 2e-2 if dtype is torch.bfloat16 else 1e-5
        torch.testing.assert_close(out.float(), reference(layout, mask, *tensors, scale), atol=tol, rtol=tol)


def test_small_bounds_the_keys_and_scores_of_the_calls_bucket():
    def small(b, h, sq, skv):
        return fallback.small(torch.empty(b, h, sq, 8), torch.empty(b, h, skv, 8))
    assert small(1, 1, 64, 64) and small(2, 14, 1, fallback.SMALL_KEYS)
    assert not small(1, 1, 1, fallback.SMALL_KEYS + 1)
    assert small(64, 1, 256, 256) and not small(64, 1, 257, 256)  # 64 * 256 * 256 == SMALL_SCORES
    # Every call of a bucket gets one answer: lengths and batch sizes are taken as the bucket's.
    assert small(1, 12, 1, 300) == small(1, 12, 1, 512) and small(1, 12, 300, 300) == small(1, 12, 512, 512)
    assert small(48, 1, 256, 256) == small(64, 1, 256, 256) and not small(65, 1, 256, 256)


@pytest.mark.parametrize("case,training,hkv,skv,flash,efficient,kernel", [
    ("small inference", False, 4, 64, True, True, "efficient"),
    ("small training (log-sum-exp wanted)", True, 4, 64, True, True, "flash"),
    ("small inference with grouped KV heads", False, 2, 64, True, True, "flash"),
    ("inference past SMALL_KEYS", False, 4, 1024, True, True, "flash"),
    ("flash refuses it", False, 4, 1024, False, True, "efficient"),
    ("neither takes it", False, 4, 64, False, False, "sdpa"),
])
def test_torch_kernel_picks_by_torchs_checks_and_the_bounds(monkeypatch, case, training, hkv, skv, flash,
                                                            efficient, kernel):
    # torch's own checks answered here (they need CUDA tensors); the choice between them is ours.
    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", lambda *args: args)
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention", lambda params, debug: flash)
    monkeypatch.setattr(torch.backends.cuda, "can_use_efficient_attention", lambda params, debug: efficient)
    q = torch.empty(1, 4, 64, 64).as_subclass(ClaimsCuda)
    k, v = (torch.empty(1, hkv, skv, 64).as_subclass(ClaimsCuda) for _ in range(2))
    assert fallback.torch_kernel(q, k, v, 0.0, False, training) == kernel, case


def test_torch_kernel_on_cpu_is_sdpa():
    q, k, v = qkv("bhsd", sq=16, hq=4, hkv=4)
    assert fallback.torch_kernel(q, k, v, 0.0, False, False) == "sdpa"


@pytest.mark.parametrize("enabled", [True, False])
def test_torch_call_leaves_the_cudnn_sdp_switch_as_it_was(enabled):
    q, k, v = qkv()
    call = tiers.torch_call(call_options(q, k, v, NONE, Arguments()), q, k, v)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(enabled)
    try:
        call(q, k, v)
        assert torch.backends.cuda.cudnn_sdp_enabled() is enabled
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


# ----- dummies -----------------------------------------------------------------------------------------
def test_dummies_are_compact_tensors_of_the_signatures_shapes_and_dim_order():
    q = torch.randn(2, 40, 8, 128, dtype=torch.bfloat16)[..., :64]       # a non-contiguous slice
    k = torch.randn(2, 4, 40, 64, dtype=torch.bfloat16).transpose(1, 2)   # a BHSD buffer seen as BSHD
    v = torch.randn(2, 40, 4, 64, dtype=torch.float16)
    sig = signature(q, k, v)
    made = tiers.dummies(sig)
    for dummy, original in zip(made, (q, k, v)):
        assert (dummy.shape, dummy.dtype, dummy.device) == (original.shape, original.dtype, original.device)
        assert dummy.untyped_storage().nbytes() == dummy.numel() * dummy.element_size()  # no gaps
        assert dummy.data_ptr() != original.data_ptr()
    assert made[0].is_contiguous() and made[0].stride() != q.stride()  # the slice, packed
    assert made[1].stride() == k.stride() and not made[1].is_contiguous()  # BHSD memory stays BHSD
    assert made[2].stride() == v.stride()
    compact = tuple(t.contiguous() for t in (q, k, v))
    assert entries.key(*tiers.dummies(signature(*compact)), sig[0], NONE) == signature(*compact)


CFG = AttnConfig(batch_size=2, num_heads_q=4, num_heads_kv=4, seqlen_q=64, seqlen_kv=64, head_dim_qk=64)


def opts_of(q, k, v):
    return call_options(q, k, v, NONE, Arguments())


class _Decided:
    """entries.new_entry standing in: records the limit and the K strides each decision was made under."""

    def __init__(self, monkeypatch, raises=None):
        self.calls = []
        self.raises = raises
        monkeypatch.setattr(tiers.entries, "new_entry", self)

    def __call__(self, sig, q, k, v, inputs, scales):
        self.calls.append((offpath.limit(), k.stride()))
        if self.raises is not None:
            raise self.raises
        return Entry(sig[0], cfg=CFG)


def test_a_compact_callers_signature_keeps_the_entry_prepared_on_the_dummies(monkeypatch):
    decided = _Decided(monkeypatch)
    q, k, v = qkv()
    prepared = Entry(opts_of(q, k, v), cfg=CFG)
    assert tiers.for_callers_geometry(prepared, q, k, v) is prepared and decided.calls == []


def test_a_cache_slice_is_decided_again_on_the_callers_strides_from_memory(monkeypatch):
    decided = _Decided(monkeypatch)
    q = torch.randn(2, 16, 4, 64, dtype=torch.bfloat16)
    cache = torch.randn(2, 4096, 4, 64, dtype=torch.bfloat16)
    k, v = cache[:, :16], cache[:, :16]  # rows of a longer cache: the bucket plans' offsets step a cache row
    prepared = Entry(opts_of(q, k, v), cfg=CFG)
    found = tiers.for_callers_geometry(prepared, q, k, v)
    assert found is not prepared and decided.calls == [(offpath.MEMORY, k.stride())]


def test_a_cache_slice_whose_own_decision_needs_more_than_memory_gets_none(monkeypatch):
    _Decided(monkeypatch, raises=offpath.NotReady("plans of another form"))
    q = torch.randn(2, 16, 4, 64, dtype=torch.bfloat16)
    k = v = torch.randn(2, 4096, 4, 64, dtype=torch.bfloat16)[:, :16]
    assert tiers.for_callers_geometry(Entry(opts_of(q, k, v), cfg=CFG), q, k, v) is None


def test_the_worker_is_sent_compact_strides(monkeypatch):
    sent = []
    monkeypatch.setattr(dense_builds, "_submit", lambda job: sent.append(job) or Future())
    monkeypatch.setattr(dispatcher, "worker_deaths", 0)
    q = torch.randn(8, 16, 32, 128, dtype=torch.bfloat16)
    k = v = torch.empty(8, 4096, 8, 128, dtype=torch.bfloat16)[:, :16]
    assert dense_builds.ask_decide(None, signature(q, k, v), ("store-dir", 0)) is not None
    shapes_strides = [(tuple(shape), tuple(stride)) for shape, stride, _ in sent[0]["tensors"]]
    assert shapes_strides == [(tuple(t.shape), t.contiguous().stride()) for t in (q, k, v)]


# ----- plans under a limit ----------------------------------------------------------------------------------
def test_obtain_plan_refuses_a_memory_miss_and_never_builds_under_stored():
    cfg = AttnConfig(batch_size=2, num_heads_q=4, num_heads_kv=4, seqlen_q=64, seqlen_kv=64, head_dim_qk=64)
    device = torch.device("cuda", 0)
    failures = plans.plan_stats()["build_failures"]
    with offpath.only(offpath.MEMORY), pytest.raises(offpath.NotReady, match="^plans of "):
        plans.obtain_plan(cfg, Backend.F16, Phase.FORWARD, device)
    with offpath.only(offpath.STORED), pytest.raises(offpath.NotReady, match="^a build of "):
        plans.obtain_plan(cfg, Backend.F16, Phase.FORWARD, device)  # no plan key here: it would build
    assert plans.plan_stats()["build_failures"] == failures  # build_plan never ran
    held = object()
    dispatcher.plans_by_problem[(0, cfg.cache_key(), Backend.F16, Phase.FORWARD)] = held
    try:
        with offpath.only(offpath.MEMORY):
            assert plans.obtain_plan(cfg, Backend.F16, Phase.FORWARD, device) is held
    finally:
        dispatcher.plans_by_problem.pop((0, cfg.cache_key(), Backend.F16, Phase.FORWARD), None)


# ----- the worker's job order -------------------------------------------------------------------------------
def drain(jobs: queue.PriorityQueue) -> list:
    found = []
    while not jobs.empty():
        found.append(jobs.get_nowait()[2])
    return found


def test_asked_jobs_and_the_end_of_input_come_before_build_ahead_work(monkeypatch):
    jobs: queue.PriorityQueue = queue.PriorityQueue()
    order = itertools.count()
    jobs.put((dense_worker.AHEAD_PRIORITY, next(order), {"kind": "ahead", "n": 0}))  # queued first
    lines = [{"id": 1, "kind": "decide"}, {"id": 2, "config": {}}, {"id": 3, "kind": "decide"}]
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(json.dumps(line) + "\n" for line in lines)))
    dense_worker._read(jobs, order)
    jobs.put((dense_worker.AHEAD_PRIORITY, next(order), {"kind": "ahead", "n": 1}))
    assert drain(jobs) == [*lines, None, {"kind": "ahead", "n": 0}, {"kind": "ahead", "n": 1}]


def test_the_end_of_input_is_queued_even_when_a_line_is_not_json(monkeypatch):
    jobs: queue.PriorityQueue = queue.PriorityQueue()
    order = itertools.count()
    jobs.put((dense_worker.AHEAD_PRIORITY, next(order), {"kind": "ahead"}))
    monkeypatch.setattr("sys.stdin", io.StringIO('{"id": 1}\nnot json\n{"id": 2}\n'))
    with pytest.raises(json.JSONDecodeError):
        dense_worker._read(jobs, order)
    assert drain(jobs) == [{"id": 1}, None, {"kind": "ahead"}]


def test_a_decide_job_queues_its_build_ahead_behind_later_asked_jobs(monkeypatch):
    cfg = AttnConfig(batch_size=2, num_heads_q=4, num_heads_kv=4, seqlen_q=64, seqlen_kv=64, head_dim_qk=64)
    monkeypatch.setattr(dense_worker, "decide", lambda job: ('{"reason": "", "forms": []}', (cfg, True)))
    jobs: queue.PriorityQueue = queue.PriorityQueue()
    order = itertools.count()
    job = {"id": 7, "kind": "decide", "store_dir": "/tmp/x", "device": 0}
    assert dense_worker._answer(job, jobs, order) == {"id": 7, "result": '{"reason": "", "forms": []}'}
    monkeypatch.setattr("sys.stdin", io.StringIO('{"id": 8}\n'))
    dense_worker._read(jobs, order)
    ahead = [{"kind": "ahead", "config": cfg, "bucket": bucket, "return_lse": True, "store_dir": "/tmp/x", "device": 0}
             for bucket in dense_worker.ahead_buckets(cfg)]
    assert len(ahead) == dense_worker.AHEAD  # one job per bucket, smallest first
    assert drain(jobs) == [{"id": 8}, None, *ahead]
