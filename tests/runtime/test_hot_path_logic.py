"""runtime/entries.py hot-path logic on CPU: stride arithmetic of the lean binding, the
FUSEDATTN_SELECT_DENSE_AFTER setting, `fast_key`, `count_call`, and attention()'s `by_call` table
on a machine without a GPU (every call falls back to torch's SDPA)."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.errors import ConfigError
from fusedattn_select.runtime import api, entries, lean, plans
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.args import Arguments
from fusedattn_select.runtime.run_settings import run_settings
from fusedattn_select.runtime.tensor_layouts import FROM_BHSD, LAYOUTS, TO_BHSD, bhsd, from_bhsd
from fusedattn_select.runtime.options import CallOptions

BF16 = torch.bfloat16
# Caller-layout shapes, all dims distinct and > 1 (B=2, S=5, H=3, D=4 in each order).
CALLER_SHAPES = {"bshd": (2, 5, 3, 4), "sbhd": (5, 2, 3, 4), "bhsd": (2, 3, 5, 4)}


def _bhsd_view(layout: str, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.empty(shape).permute(TO_BHSD[layout])


def _spec(view: torch.Tensor, dtype=BF16) -> plans.TensorSpec:
    return plans.TensorSpec(tuple(view.shape), tuple(view.stride()), dtype)


# ----- the views of a call: bhsd / from_bhsd ---------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bhsd_and_from_bhsd_are_the_layouts_permutations_without_a_copy(layout):
    t = torch.randn(CALLER_SHAPES[layout])
    view = bhsd(t, layout)
    expected = t.permute(TO_BHSD[layout])
    assert view.shape == expected.shape == (2, 3, 5, 4) and view.stride() == expected.stride()
    assert view.data_ptr() == t.data_ptr() and torch.equal(view, expected)
    back = from_bhsd(view, layout)
    assert back.shape == t.shape and back.stride() == t.stride() and torch.equal(back, t)
    out = torch.randn(2, 3, 5, 4)  # a kernel's BHSD output in the caller's dim order
    assert from_bhsd(out, layout).stride() == out.permute(FROM_BHSD[layout]).stride()


# ----- _same_memory / caller_geometry ----------------------------------------------------------------
def test_same_memory_compares_strides_except_of_size_one_dims():
    assert lean.same_memory((2, 3), (3, 1), (3, 1))
    assert not lean.same_memory((2, 3), (3, 1), (1, 2))
    assert lean.same_memory((1, 3), (3, 1), (99, 1))
    assert not lean.same_memory((1, 3), (3, 1), (99, 2))
    assert lean.same_memory((1, 1), (5, 6), (7, 8))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("memory", LAYOUTS)
def test_caller_geometry_is_the_caller_view_of_the_declared_memory(layout, memory):
    # A graph tensor declared over memory stored in `memory`'s dim order; the caller sees `layout`.
    dims = tuple(_bhsd_view(layout, CALLER_SHAPES[layout]).shape)  # (B, H, S, D)
    stored = torch.empty(tuple(dims[i] for i in _from_bhsd(memory)))
    spec = _spec(stored.permute(TO_BHSD[memory]))
    want = stored.permute(TO_BHSD[memory]).permute(_from_bhsd(layout))  # the caller's view of that memory
    assert lean.caller_geometry(spec, layout) == (tuple(want.shape), want.stride())
    assert lean.caller_geometry(spec, layout)[0] == CALLER_SHAPES[layout]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bshd_geometry_is_the_caller_view_of_contiguous_bshd_memory(layout):
    # What bucket plans read and write: (B, S, H, D) contiguous memory, seen in the caller's dim order.
    memory = torch.empty(2, 5, 3, 4)  # B, S, H, D
    dims = tuple(memory.permute(0, 2, 1, 3).shape)  # logical (B, H, S, D)
    want = memory.permute(0, 2, 1, 3).permute(_from_bhsd(layout))
    assert lean.bshd_geometry(dims, layout) == (tuple(want.shape), want.stride())
    assert lean.bshd_geometry(dims, layout)[0] == CALLER_SHAPES[layout]


def _from_bhsd(layout: str) -> tuple[int, ...]:
    perm = TO_BHSD[layout]
    return tuple(perm.index(i) for i in range(4))

# ----- FUSEDATTN_SELECT_DENSE_AFTER ------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [("", 16), ("0", 0), ("5", 5), ("120", 120)])
def test_dense_after_reads_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("FUSEDATTN_SELECT_DENSE_AFTER", value)
    assert run_settings.get().dense_after == expected


def test_dense_after_defaults_to_16_when_unset(monkeypatch):
    monkeypatch.delenv("FUSEDATTN_SELECT_DENSE_AFTER", raising=False)
    assert run_settings.get().dense_after == 16


@pytest.mark.parametrize("value", ["x", "-1", "1.5", "3 0"])
def test_dense_after_refuses_what_is_not_a_whole_number(monkeypatch, value):
    monkeypatch.setenv("FUSEDATTN_SELECT_DENSE_AFTER", value)
    with pytest.raises(ConfigError, match="FUSEDATTN_SELECT_DENSE_AFTER") as err:
        run_settings.get()
    assert err.value.field == "FUSEDATTN_SELECT_DENSE_AFTER"
    assert err.value.value == value


# ----- fast_key --------------------------------------------------------------------------------------
ARGS = tuple(Arguments())
LENS = torch.full((2,), 5, dtype=torch.int32)


def _qkv(shape=(2, 5, 4, 8), dtype=BF16):
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def test_fast_key_is_equal_for_identical_calls_on_other_tensors():
    assert entries.fast_key(*_qkv(), ARGS, False) == entries.fast_key(*_qkv(), ARGS, False)
    assert hash(entries.fast_key(*_qkv(), ARGS, False)) == hash(entries.fast_key(*_qkv(), ARGS, False))


def test_fast_key_differs_with_shape_stride_dtype_training_and_arguments():
    q, k, v = _qkv()
    base = entries.fast_key(q, k, v, ARGS, False)
    transposed = torch.zeros(2, 4, 5, 8, dtype=BF16).transpose(1, 2)  # q's shape, other strides
    assert transposed.shape == q.shape and transposed.stride() != q.stride()
    others = [
        entries.fast_key(torch.zeros(2, 6, 4, 8, dtype=BF16), k, v, ARGS, False),   # q shape
        entries.fast_key(q, torch.zeros(2, 7, 4, 8, dtype=BF16), v, ARGS, False),   # k shape
        entries.fast_key(q, k, torch.zeros(2, 5, 4, 16, dtype=BF16), ARGS, False),  # v shape
        entries.fast_key(transposed, k, v, ARGS, False),                              # q strides
        entries.fast_key(q, transposed, v, ARGS, False),                              # k strides
        entries.fast_key(q, k, transposed, ARGS, False),                              # v strides
        entries.fast_key(*_qkv(dtype=torch.float16), ARGS, False),                    # dtype
        entries.fast_key(q, k.half(), v, ARGS, False),                                # k's dtype alone
        entries.fast_key(q, k, v.half(), ARGS, False),                                # v's dtype alone
        entries.fast_key(q, k, v, ARGS, True),                                        # training
        entries.fast_key(q, k, v, tuple(Arguments(mask="causal")), False),
        entries.fast_key(q, k, v, tuple(Arguments(layout="bshd")), False),          # None vs "bshd"
        entries.fast_key(q, k, v, tuple(Arguments(attn_scale=0.5)), False),
        entries.fast_key(q, k, v, tuple(Arguments(fp8=True)), False),
        entries.fast_key(q, k, v, tuple(Arguments(deterministic=True)), False),
        entries.fast_key(q, k, v, ARGS, False, LENS, LENS),                          # lengths
        entries.fast_key(q, k, v, ARGS, False, LENS.long(), LENS),                   # their dtype
        entries.fast_key(q, k, v, ARGS, False, LENS, torch.full((3,), 5, dtype=torch.int32)),  # shape
    ]
    assert all(other != base for other in others)
    assert len(set(others)) == len(others)


def test_k_and_v_of_another_dtype_than_an_earlier_calls_get_the_argument_error():
    """k and v are checked again when only their dtype differs from a decided call's."""
    q, k, v = _qkv((1, 8, 2, 16))
    api.attention(q, k, v)
    with pytest.raises(ConfigError, match="k and v must have q's dtype"):
        api.attention(q, k.half(), v.half())


# ----- count_call ------------------------------------------------------------------------------------
def _options() -> CallOptions:
    return CallOptions("bshd", "no_mask", (-1, -1), None, 0.0, "vanilla", False, False, "", False, False,
                       False, False)


def test_count_call_leaves_a_dense_entry_alone():
    found = entries.Entry(_options())
    assert not found.bucketed
    q, k, v = _qkv()
    for _ in range(40):
        assert entries.count_call(found, q, k, v) is found
    assert found.calls == 0 and found.promotion == ""


@pytest.mark.parametrize("dense_after,calls", [(5, 4), (0, 20)])
def test_count_call_counts_a_bucketed_entry_without_promoting_below_the_threshold_or_at_zero(
        use_settings, dense_after, calls):
    use_settings(dense_after=dense_after)
    found = entries.Entry(_options(), ragged_forward={})
    assert found.bucketed
    q, k, v = _qkv()
    for n in range(1, calls + 1):
        assert entries.count_call(found, q, k, v) is found
        assert found.calls == n
    assert found.promotion == ""


def test_a_signature_whose_class_keeps_changing_shape_is_never_promoted(monkeypatch, use_settings):
    # Decode-like: every layer calls length n once, then length n+1 is new; across two generate()
    # calls each length reaches dense_after calls, but never half of its class's calls since its first.
    use_settings(dense_after=4)
    monkeypatch.setattr(dispatcher, "class_calls", Counter())
    q, k, v = _qkv()
    lengths = {}
    for _ in range(2):  # two generate() calls
        for n in range(10):
            found = lengths.setdefault(n, entries.Entry(_options(), ragged_forward={}, shape_class="c",
                                                        class_calls_before=dispatcher.class_calls["c"]))
            for _ in range(3):  # three layers
                assert entries.count_call(found, q, k, v) is found
    assert all(e.calls == 6 and e.promotion == "" for e in lengths.values())


@pytest.fixture
def promotions(monkeypatch, use_settings):
    """count_call's promotions, recorded instead of made (they build plans on a GPU)."""
    made = []

    def promote(found, q, k, v):
        made.append((found, found.calls))
        found.promotion = "dense"
        return found

    monkeypatch.setattr(entries, "promote", promote)
    for name in ("class_calls", "class_pass"):
        monkeypatch.setattr(dispatcher, name, Counter())
    monkeypatch.setattr(dispatcher, "newest", {})
    use_settings(dense_after=16)
    return made


def _bucketed(shape_class: str = "c") -> entries.Entry:
    return entries.Entry(_options(), ragged_forward={}, shape_class=shape_class,
                         class_calls_before=dispatcher.class_calls[shape_class])


def test_a_deep_models_decode_lengths_stay_on_bucket_plans(promotions):
    # 32 layers call each decode length once per token: 32 calls, more than dense_after. Once the
    # class has shown that one pass makes 32 calls of a shape, no later length is promoted.
    q, k, v = _qkv()
    lengths = [_bucketed() for _ in range(20)]
    for found in lengths:
        for _ in range(32):
            entries.count_call(found, q, k, v)
    assert promotions == [(lengths[0], 16)]  # before the first pass was known
    assert dispatcher.class_pass["c"] == 32


def test_a_shape_a_deep_model_keeps_calling_is_promoted(promotions):
    q, k, v = _qkv()
    fixed = _bucketed()
    for _ in range(100):  # one shape every step (a training loop, a static cache): promoted at dense_after
        entries.count_call(fixed, q, k, v)
    assert promotions == [(fixed, 16)]
    zeroth, first, second = _bucketed("d"), _bucketed("d"), _bucketed("d")
    for found in (zeroth, first, second, first, second, first):  # a length that comes back pass after pass
        for _ in range(32):
            entries.count_call(found, q, k, v)
    # The first at dense_after (before its class's pass was known); the one that keeps coming back
    # once past two passes of its class (65 calls) with half its class's calls since its first (96).
    assert promotions == [(fixed, 16), (zeroth, 16), (first, 96)] and dispatcher.class_pass["d"] == 32


def test_a_shape_after_a_long_used_one_is_promoted_within_two_max_passes(promotions):
    q, k, v = _qkv()
    long_used = _bucketed()
    for _ in range(1000):
        entries.count_call(long_used, q, k, v)
    after = _bucketed()
    for _ in range(400):
        entries.count_call(after, q, k, v)
    assert dispatcher.class_pass["c"] == entries.MAX_PASS == 128  # 1000 calls are no pass
    assert promotions == [(long_used, 16), (after, 2 * entries.MAX_PASS + 1)]


def test_count_call_tries_promotion_once(promotions):
    found = entries.Entry(_options(), ragged_forward={}, promotion="not selected")
    q, k, v = _qkv()
    for _ in range(40):
        assert entries.count_call(found, q, k, v) is found
    assert found.calls == 40 and promotions == []  # counted (its class's pass), never tried again


# ----- attention() on CPU: fallback through by_call --------------------------------------------------
@pytest.mark.usefixtures("no_platform")
@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_attention_on_cpu_falls_back_to_sdpa_and_files_its_call(dtype):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, 4, 8, generator=gen).to(dtype)   # bshd, GQA 4/2
    k = torch.randn(2, 9, 2, 8, generator=gen).to(dtype)
    v = torch.randn(2, 9, 2, 8, generator=gen).to(dtype)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True).transpose(1, 2)
    assert not dispatcher.by_call
    call_key = entries.fast_key(q, k, v, tuple(Arguments(mask="causal")), False)

    first = api.attention(q, k, v, mask="causal")
    assert call_key in dispatcher.by_call
    filed = dispatcher.by_call[call_key]
    assert not filed.fused and filed.fallback == api.FALLBACK_TORCH
    built = dispatcher.counters["entries_built"]

    second = api.attention(q, k, v, mask="causal")
    assert dispatcher.by_call[call_key] is filed and len(dispatcher.by_call) == 1
    assert dispatcher.counters["entries_built"] == built == 1
    assert dispatcher.counters["fallback_calls"] == 2
    for out in (first, second):
        assert out.shape == q.shape and out.dtype == dtype
        torch.testing.assert_close(out, expected, rtol=0, atol=0)  # the same SDPA call: bit-identical


@pytest.mark.usefixtures("no_platform")
def test_calls_with_lengths_take_the_hot_path_and_lengths_of_another_shape_are_still_refused():
    q, k, v = _qkv(dtype=torch.float32)
    lens = torch.tensor([5, 3], dtype=torch.int32)
    for _ in range(2):
        api.attention(q, k, v, mask="padding", seqlens_q=lens, seqlens_kv=lens)
    assert len(dispatcher.by_call) == 1 and dispatcher.counters["entries_built"] == 1
    with pytest.raises(ConfigError, match="seqlens_q"):
        api.attention(q, k, v, mask="padding", seqlens_q=torch.tensor([5, 3, 1], dtype=torch.int32),
                      seqlens_kv=lens)


@pytest.mark.usefixtures("no_platform")
@pytest.mark.parametrize("valid,bad", [({"dropout": 0.0}, {"dropout": False}), ({"attn_scale": 1.0}, {"attn_scale": True}),
                                       ({"window_size": (1, 0)}, {"window_size": (True, 0)})])
def test_a_bool_is_refused_after_a_call_with_the_number_it_equals(valid, bad):
    q, k, v = _qkv(dtype=torch.float32)
    api.attention(q, k, v, mask="causal", **valid)
    with pytest.raises(ConfigError, match=next(iter(bad))):
        api.attention(q, k, v, mask="causal", **bad)


@pytest.mark.usefixtures("no_platform")
def test_clear_plans_empties_by_call():
    q, k, v = _qkv(dtype=torch.float32)
    api.attention(q, k, v)
    assert len(dispatcher.by_call) == 1 and len(dispatcher.entries) == 1
    api.clear_plans()
    assert dispatcher.by_call == {}
    assert len(dispatcher.entries) == 0
    assert dispatcher.counters["calls"] == 0


# ----- apply_lean ----------------------------------------------------------------------------------
class _Doubling:
    """A stand-in for a built plan (autograd plumbing only, no cuDNN): its forward writes 2*q and
    ones as stats, its backward 2*dO into dQ and dO's row sums into dK and dV."""

    def __init__(self, backward: bool) -> None:
        self.backward = backward

    def run(self, buffers: tuple) -> None:
        if self.backward:
            q, k, v, o, stats, d_o, dq, dk, dv = buffers
            dq.copy_(2 * d_o)
            dk.copy_(d_o.sum(-1, keepdim=True).expand_as(dk))
            dv.copy_(d_o.sum(-1, keepdim=True).expand_as(dv))
        else:
            q, k, v, o, stats = buffers
            o.copy_(2 * q)
            stats.fill_(1.0)


def _lean_entry(q: torch.Tensor):
    geometry = (tuple(q.shape), q.stride())
    stats = plans.TensorSpec((q.shape[0], q.shape[2], q.shape[1], 1), (q.shape[1] * q.shape[2], 1, q.shape[2], 1),
                             torch.float32)
    shape = lean.Lean(out=geometry, out_dtype=q.dtype, forward_index=(0, 1, 2, 3, 4), stats=stats,
                      grads=(geometry,) * 3, do_strides=q.stride(), backward_index=tuple(range(9)),
                      out_like_q=True, grads_like_qkv=True)

    class _Entry:
        forward, backward = _Doubling(False), _Doubling(True)

    found = _Entry()
    found.lean = shape
    return found


@pytest.mark.parametrize("internals", [True, False], ids=["C apply", "torch without its internals"])
def test_apply_lean_records_the_same_autograd_node_as_function_apply(internals, monkeypatch):
    if not internals:  # a torch version lacking the internals apply_lean uses: Function.apply itself
        monkeypatch.setattr(lean, "_apply", None)
    q, k, v = (torch.randn(2, 5, 3, 4, requires_grad=True) for _ in range(3))
    found = _lean_entry(q)
    out = lean.apply_lean(found, q, k, v)
    assert type(out.grad_fn).__name__ == "LeanAttentionBackward"
    assert torch.equal(out, 2 * q.detach())
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert torch.equal(grads[0], torch.full_like(q, 2.0)) and torch.equal(grads[1], torch.full_like(k, 4.0))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out = lean.apply_lean(found, q, k, v)
        with torch.no_grad():
            q.add_(1)  # in-place change of a saved input: backward must refuse, as with Function.apply
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def test_apply_lean_defers_to_function_apply_under_functorch_transforms():
    q, k, v = (torch.randn(2, 5, 3, 4) for _ in range(3))
    found = _lean_entry(q)
    # Function.apply refuses a Function without setup_context under a transform; apply_lean must too.
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda x: lean.apply_lean(found, x, k, v).sum())(q)


# ----- the compiled table's place in attention() ---------------------------------------------------
def test_attention_asks_the_compiled_table_first_and_only_for_calls_it_can_hold(monkeypatch):
    """attention() hands plain calls (no optional tensors, fp8 False, no lse) to the table with its
    arguments as given, returns the table's output where it has one, and decides in Python on None."""
    asked = []
    answer = {}

    def table(q, k, v, arguments):
        asked.append(arguments)
        return answer.get("out")

    monkeypatch.setattr(dispatcher, "native_call", table)
    q, k, v = _qkv((1, 8, 2, 16))
    lens = torch.full((1,), 8, dtype=torch.int32)
    api.attention(q, k, v, mask="causal", attn_scale=0.5)  # None: decided in Python (CPU: falls back)
    assert asked == [(None, "causal", (-1, -1), 0.5, 0.0, "vanilla", False)]
    for other in (dict(fp8=True), dict(return_lse=True), dict(seqlens_q=lens, seqlens_kv=lens, mask="padding"),
                  dict(bias=torch.zeros(1, 2, 8, 8, dtype=BF16))):
        try:
            api.attention(q, k, v, **other)
        except ConfigError:
            pass  # refused here or not: never asked the table
    assert len(asked) == 1
    answer["out"] = sentinel = torch.ones(1)
    assert api.attention(q, k, v) is sentinel


def test_only_compiled_lean_entries_off_bucket_plans_are_filed_in_the_table(monkeypatch):
    filed = []
    monkeypatch.setattr(api.native, "remember", lambda q, k, v, arguments, plan: filed.append(plan))
    q, k, v = _qkv((1, 8, 2, 16))

    class Found:
        def __init__(self, native=None, lean=True, reason="", ragged=None):
            self.lean = type("L", (), {"native": native, "native_generation": 0})() if lean else None
            self.reason, self.ragged_forward = reason, ragged

        fused = property(lambda self: not self.reason)
        bucketed = property(lambda self: self.ragged_forward is not None)

    for found in (Found(), Found(lean=False), Found("plan", reason="falls back"), Found("plan", ragged={})):
        api._table_remember(found, q, k, v, ARGS[:7])
    assert filed == []
    monkeypatch.setattr(api, "functorch_active", lambda: True)  # under vmap, grad, ...: never filed
    api._table_remember(Found("plan"), q, k, v, ARGS[:7])
    assert filed == []
    monkeypatch.setattr(api, "functorch_active", lambda: False)
    api._table_remember(Found("plan"), q, k, v, ARGS[:7])
    assert filed == ["plan"]
