"""attention()'s argument checks on CPU where they used to be skipped: tensors of another kind than
torch.Tensor, FP8Scales' descales, the optional tensors' device and dtype, config_from_tensors' own
arguments, and values a call found by the key of an earlier checked call would take without a check
(numbers equal across types, layouts that look false, values call_options turned into others)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime import api  # noqa: E402
from fusedattn_select.runtime.api import FP8History, FP8Scales, attention, config_from_tensors  # noqa: E402
from fusedattn_select.runtime.args import Arguments, check_args, keyable, plain_numbers  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.options import NO_INPUTS, OptionalInputs  # noqa: E402

BF16 = torch.bfloat16
E4M3 = torch.float8_e4m3fn
META = torch.device("meta")

pytestmark = pytest.mark.usefixtures("no_platform")


def _bshd(dtype=BF16):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 4, 8, generator=gen).to(dtype)
    k = torch.randn(2, 7, 2, 8, generator=gen).to(dtype)
    v = torch.randn(2, 7, 2, 8, generator=gen).to(dtype)
    return q, k, v


def _float8():
    q, k, v = _bshd(torch.float32)
    one = torch.ones(1)
    return tuple(t.to(E4M3) for t in (q, k, v)), (one, one, one)


# ----- q, k and v that are not tensors ---------------------------------------------------------------
@pytest.mark.parametrize(("field", "make"), [
    ("q", lambda q, k, v: (q.float().numpy(), k, v)),
    ("q", lambda q, k, v: (None, k, v)),
    ("k", lambda q, k, v: (q, k.tolist(), v)),
    ("v", lambda q, k, v: (q, k, 1.0)),
])
@pytest.mark.parametrize("warm", [False, True])
def test_q_k_or_v_of_another_kind_get_the_argument_error(field, make, warm):
    q, k, v = _bshd()
    if warm:
        attention(q, k, v)
    with pytest.raises(ConfigError, match=f"^{field}=.*must be a torch.Tensor") as err:
        attention(*make(q, k, v))
    assert err.value.field == field


# ----- FP8Scales --------------------------------------------------------------------------------------
ONE = torch.ones(1)


@pytest.mark.parametrize("descales", [
    (1.0, ONE, ONE), (ONE, [1.0], ONE), (ONE, ONE, None), (torch.ones(3), ONE, ONE),
    (ONE, torch.ones(1, dtype=torch.int32), ONE), (ONE, ONE, torch.ones(1, 2)),
], ids=["float", "list", "none", "three-elements", "int32", "1x2"])
def test_fp8_scales_refuse_a_descale_that_is_not_a_one_element_float_tensor(descales):
    bad = next(i for i, d in enumerate(descales) if not (isinstance(d, torch.Tensor) and d.numel() == 1
                                                          and d.is_floating_point()))
    name = ("descale_q", "descale_k", "descale_v")[bad]
    with pytest.raises(ConfigError, match="floating-point torch.Tensor with one element") as err:
        FP8Scales(*descales)
    assert err.value.field == "FP8Scales." + name


@pytest.mark.parametrize("descale", [torch.tensor(0.5), torch.ones(1, 1, dtype=torch.float16), torch.ones(1)])
def test_fp8_scales_take_any_one_element_float_tensor(descale):
    (q8, k8, v8), (one, _, _) = _float8()
    with torch.no_grad():
        out = attention(q8, k8, v8, fp8=FP8Scales(one, descale, one))
    assert out.dtype == BF16 and out.shape == (2, 5, 4, 8)


@pytest.mark.parametrize("warm", [False, True])
def test_a_descale_on_another_device_than_q_is_refused_naming_it(warm):
    (q8, k8, v8), (one, _, _) = _float8()
    if warm:  # a call of the same shapes with descales on q's device: the key does not hold the descales
        with torch.no_grad():
            attention(q8, k8, v8, fp8=FP8Scales(one, one, one))
    with pytest.raises(ConfigError, match="q's device") as err:
        attention(q8, k8, v8, fp8=FP8Scales(one, torch.ones(1, device=META), one))
    assert err.value.field == "fp8.descale_k"


# ----- optional tensors ------------------------------------------------------------------------------
def test_integer_alibi_slopes_are_refused_by_attention_and_config_from_tensors():
    q, k, v = _bshd()
    slopes = torch.ones(4, dtype=torch.int32)
    for call in (attention, config_from_tensors):
        with pytest.raises(ConfigError, match="floating-point") as err:
            call(q, k, v, alibi_slopes=slopes)
        assert err.value.field == "alibi_slopes"


OPTIONAL_ON_META = [
    ("bias", dict(bias=torch.zeros(1, 4, 5, 7, dtype=BF16, device=META))),
    ("alibi_slopes", dict(alibi_slopes=torch.ones(4, device=META))),
    ("sink", dict(softmax="learnable", sink=torch.zeros(4, device=META))),
    ("seqlens_q", dict(mask="padding", seqlens_q=torch.tensor([5, 3], device=META), seqlens_kv=torch.tensor([7, 2]))),
    ("seqlens_kv", dict(mask="padding", seqlens_q=torch.tensor([5, 3]), seqlens_kv=torch.tensor([7, 2], device=META))),
]


@pytest.mark.parametrize(("field", "kwargs"), OPTIONAL_ON_META, ids=[f for f, _ in OPTIONAL_ON_META])
def test_an_optional_tensor_on_another_device_than_q_is_refused_naming_it(field, kwargs):
    q, k, v = _bshd()
    with pytest.raises(ConfigError, match=r"must be on q's device \(cpu\)") as err:
        attention(q, k, v, **kwargs)
    assert err.value.field == field


# ----- config_from_tensors' own arguments -----------------------------------------------------------
@pytest.mark.parametrize(("field", "kwargs"), [("is_training", dict(is_training="no")),
                                               ("is_training", dict(is_training=0)),
                                               ("return_lse", dict(return_lse="x"))])
def test_config_from_tensors_refuses_what_attention_refuses(field, kwargs):
    with pytest.raises(ConfigError, match="True or False") as err:
        config_from_tensors(*_bshd(), **kwargs)
    assert err.value.field == field


def test_config_from_tensors_takes_a_bool_is_training_and_return_lse():
    q, k, v = _bshd()
    assert config_from_tensors(q, k, v, is_training=False, return_lse=True).is_training is False
    assert config_from_tensors(q, k, v, is_training=True).is_training is True


# ----- a bad value after a good call whose key it would equal ---------------------------------------
WARM_THEN_BAD = [  # (the field, a good call's arguments, a bad call's arguments equal to them once coerced)
    ("mask", dict(mask="causal"), dict(mask="Causal")),
    ("dropout", {}, dict(dropout="0")),
    ("dropout", {}, dict(dropout=" 0e0 ")),
    ("dropout", {}, dict(dropout=torch.tensor(0.0))),
    ("dropout", {}, dict(dropout=np.float32(0.0))),
    ("dropout", {}, dict(dropout=False)),
    ("layout", {}, dict(layout="")),
    ("layout", {}, dict(layout=0)),
    ("layout", {}, dict(layout=False)),
    ("layout", {}, dict(layout=[])),
    ("window_size", {}, dict(window_size=(-1.0, -1.0))),
    ("window_size", dict(window_size=(2, 0), mask="causal"), dict(window_size=[2.0, 0], mask="causal")),
    ("window_size", dict(window_size=(2, 0), mask="causal"), dict(window_size=(np.int64(2), 0), mask="causal")),
    ("attn_scale", dict(attn_scale=0.5), dict(attn_scale=np.float32(0.5))),
    ("attn_scale", dict(attn_scale=1.0), dict(attn_scale=True)),
    ("deterministic", dict(deterministic=True), dict(deterministic=1)),
    ("return_lse", {}, dict(return_lse=0)),
    ("fp8", {}, dict(fp8=0)),
    ("alibi_slopes", dict(alibi_slopes=torch.ones(4)), dict(alibi_slopes=torch.ones(4, dtype=torch.int32))),
    ("alibi_slopes", dict(alibi_slopes=torch.ones(4)), dict(alibi_slopes=torch.ones(4, device=META))),
    ("bias", dict(bias=torch.zeros(1, 4, 5, 7, dtype=BF16)),
     dict(bias=torch.zeros(1, 4, 5, 7, dtype=BF16, device=META))),
    ("sink", dict(softmax="learnable", sink=torch.zeros(4)),
     dict(softmax="learnable", sink=torch.zeros(4, device=META))),
]


@pytest.mark.parametrize(("field", "good", "bad"), WARM_THEN_BAD,
                         ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(WARM_THEN_BAD)])
def test_a_bad_argument_is_rejected_even_after_a_good_call_of_the_same_shape(field, good, bad):
    q, k, v = _bshd()
    for _ in range(2):  # the second call is found by its key
        attention(q, k, v, **good)
    with pytest.raises(ConfigError, match=f"^{field}=") as err:
        attention(q, k, v, **bad)
    assert err.value.field == field


def _history():
    return FP8History(o_dtype=E4M3)


def _scales(o_dtype=E4M3):
    one = torch.ones(1)
    return FP8Scales(one, one, one, o_dtype=o_dtype)


@pytest.mark.parametrize(("inputs", "good", "bad"), [
    ("bf16", _history, _scales),  # FP8Scales is for float8 inputs
    ("float8", _scales, _history),  # FP8History quantizes fp16/bf16 inputs
    ("bf16", lambda: True, lambda: _scales(o_dtype=None)),
], ids=["history-then-scales", "scales-then-history", "true-then-scales"])
def test_a_call_of_another_fp8_kind_is_checked_after_a_good_one(inputs, good, bad):
    # Each pair gives equal keys (FP8 on, the same output precision): the kind of `fp8` is not in them.
    q, k, v = _float8()[0] if inputs == "float8" else _bshd()
    with torch.no_grad():
        for _ in range(2):
            attention(q, k, v, fp8=good())
        with pytest.raises(ConfigError, match="^fp8(.o_dtype)?="):
            attention(q, k, v, fp8=bad())


GOOD_OF_OTHER_TYPES = [  # (a call's arguments, the same call with values of other types check_args takes)
    (dict(attn_scale=0.5), dict(attn_scale=np.float64(0.5))),
    (dict(attn_scale=2.0), dict(attn_scale=2)),
    (dict(dropout=0.0), dict(dropout=0)),
    (dict(window_size=(2, 0), mask="causal"), dict(window_size=[2, 0], mask="causal")),
    (dict(layout=None), dict(layout="bshd")),
]


@pytest.mark.parametrize(("good", "same"), GOOD_OF_OTHER_TYPES)
def test_values_of_other_accepted_types_share_the_decision_of_the_call(good, same):
    q, k, v = _bshd()
    want = attention(q, k, v, **good)
    built = dispatcher.counters["entries_built"]
    for _ in range(2):
        torch.testing.assert_close(attention(q, k, v, **same), want, rtol=0, atol=0)
    assert dispatcher.counters["entries_built"] == built  # found by the call's key, not decided again


# ----- the guards themselves -------------------------------------------------------------------------
def test_every_call_the_checks_accept_here_is_looked_up_by_its_key():
    """keyable admits every argument set these tests call with successfully: none is checked per call."""
    q, k, v = _bshd()
    for good, same in GOOD_OF_OTHER_TYPES:
        for kwargs in (good, same):
            arguments = Arguments(**kwargs)
            check_args(q, k, v, NO_INPUTS, arguments)
            assert keyable(q, NO_INPUTS, arguments), kwargs
    inputs = OptionalInputs(bias=torch.zeros(1, 4, 5, 7, dtype=BF16), alibi_slopes=torch.ones(4))
    assert keyable(q, inputs, Arguments())
    (q8, _, _), descales = _float8()
    assert keyable(q8, NO_INPUTS, Arguments(fp8=FP8Scales(*descales)))


@pytest.mark.parametrize("given", [dict(attn_scale=np.float32(0.5)), dict(dropout=np.float32(0)),
                                   dict(window_size=(-1.0, -1.0)), dict(window_size=(True, 0)),
                                   dict(dropout=False), dict(attn_scale=True)])
def test_numbers_of_types_the_checks_refuse_make_no_fast_key(given):
    assert plain_numbers(tuple(Arguments()))
    assert not plain_numbers(tuple(Arguments(**given)))


def test_attention_keeps_its_default_window_object():
    # plain_numbers tells the default apart by identity: attention()'s default must be that object
    assert api.attention.__kwdefaults__["window_size"] is Arguments._field_defaults["window_size"]


@pytest.mark.parametrize("window", [(2**31, -1), (4, 2**31)])
def test_a_window_past_int32_is_refused_by_attention_as_by_a_config(window):
    # attention() allowed any window >= -1 while a config refuses past 2**31-1: such a call fell back to
    # the float32 reference with "no fused config" instead of naming its argument.
    q, k, v = _bshd()
    for call in (lambda: attention(q, k, v, window_size=window), lambda: config_from_tensors(q, k, v, window_size=window)):
        with pytest.raises(ConfigError, match=r"window_size.*\[-1, 2147483647\]"):
            call()
