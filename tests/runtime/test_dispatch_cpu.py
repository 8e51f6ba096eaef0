"""attention() and the SDPA drop-in on CPU: config derivation, logged fallbacks, argument errors.

No GPU here: the selector is the no-platform selector, so every selection is NONE (platform rule)
and every call runs a fallback, which must match the float32 reference / torch's SDPA exactly.
"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.reference.autograd_reference import reference_attention  # noqa: E402
from fusedattn_select.runtime import api as dispatch  # noqa: E402
from fusedattn_select.runtime import options  # noqa: E402
from fusedattn_select.runtime.api import FP8Scales, attention, config_from_tensors, dispatch_info  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.tensor_layouts import formats  # noqa: E402

sdpa_module = pytest.importorskip("fusedattn_select.integrations.sdpa")

BF16 = torch.bfloat16


pytestmark = pytest.mark.usefixtures("no_platform")


def _bshd(b=2, sq=5, skv=7, hq=4, hkv=2, d=8, dv=None, dtype=BF16, grad=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    q = torch.randn(b, sq, hq, d, generator=gen).to(dtype)
    k = torch.randn(b, skv, hkv, d, generator=gen).to(dtype)
    v = torch.randn(b, skv, hkv, dv, generator=gen).to(dtype)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def _bhsd(t):
    return t.transpose(1, 2)


# ----- config derivation -----------------------------------------------------------------------
def test_contiguous_bshd_tensors_run_as_bshd_layout():
    cfg = config_from_tensors(*_bshd())
    assert cfg.qkv_layout == "bshd_bshd_bshd"
    assert (cfg.batch_size, cfg.seqlen_q, cfg.seqlen_kv, cfg.num_heads_q, cfg.head_dim_qk) == (2, 5, 7, 4, 8)


def test_layout_comes_from_strides_not_from_the_dim_order():
    # (B, S, H, D) views of BHSD buffers: the kernels read BHSD memory, no copy.
    q, k, v = (torch.randn(2, h, s, 8, dtype=BF16).transpose(1, 2) for h, s in ((4, 5), (2, 7), (2, 7)))
    assert config_from_tensors(q, k, v).qkv_layout == "bhsd_bhsd_bhsd"


def test_sbhd_tensors_run_as_sbhd_layout():
    q, k, v = (t.transpose(0, 1).contiguous() for t in _bshd())
    assert config_from_tensors(q, k, v, layout="sbhd").qkv_layout == "sbhd_sbhd_sbhd"


def test_bhsd_layout_names_the_torch_sdpa_dim_order():
    q, k, v = (_bhsd(t).contiguous() for t in _bshd())
    cfg = config_from_tensors(q, k, v, layout="bhsd")
    assert cfg.qkv_layout == "bhsd_bhsd_bhsd" and cfg.seqlen_q == 5 and cfg.num_heads_q == 4


def test_mixed_q_and_kv_memory_layouts_keep_te_layout_name():
    q, k, v = _bshd()
    q_sb = q.transpose(0, 1).contiguous().transpose(0, 1)  # (B, S, H, D) stored SBHD
    assert config_from_tensors(q_sb, k, v).qkv_layout == "sbhd_bshd_bshd"


def test_interleaved_qkv_slices_are_described_in_the_callers_layout():
    qkv = torch.randn(2, 5, 3, 4, 8, dtype=BF16)  # (B, S, 3, H, D): strides fit no separate layout
    q, k, v = qkv.unbind(2)
    found = formats(_bhsd(q), _bhsd(k), _bhsd(v), "bshd")
    assert found.qkv_layout == "bshd_bshd_bshd" and found.copy_q and found.copy_k and found.copy_v


def test_gqa_head_counts_come_from_k():
    cfg = config_from_tensors(*_bshd(hq=8, hkv=2))
    assert (cfg.num_heads_q, cfg.num_heads_kv) == (8, 2)


def test_head_dim_v_differs_from_head_dim_qk():
    cfg = config_from_tensors(*_bshd(d=16, dv=8))
    assert (cfg.head_dim_qk, cfg.resolved_head_dim_v) == (16, 8)


def test_training_is_detected_from_requires_grad():
    assert config_from_tensors(*_bshd(grad=True)).is_training
    assert not config_from_tensors(*_bshd(grad=False)).is_training


def test_no_grad_mode_is_inference_even_with_grad_inputs():
    with torch.no_grad():
        assert not config_from_tensors(*_bshd(grad=True)).is_training


def test_a_trainable_bias_alone_makes_it_training():
    bias = torch.zeros(1, 4, 5, 7, dtype=BF16, requires_grad=True)
    assert config_from_tensors(*_bshd(), bias=bias).is_training


@pytest.mark.parametrize(("shape", "expected"), [
    ((1, 4, 5, 7), "1hss"), ((2, 1, 5, 7), "b1ss"), ((2, 4, 5, 7), "bhss"), ((1, 1, 5, 7), "11ss"),
    ((1, 1, 1, 7), "11ss"),
])
def test_bias_shape_is_named_from_the_bias_dims(shape, expected):
    cfg = config_from_tensors(*_bshd(), bias=torch.zeros(shape, dtype=BF16))
    assert (cfg.bias, cfg.bias_shape) == ("post_scale_bias", expected)


def test_batch_one_bias_is_a_broadcast_bias():
    cfg = config_from_tensors(*_bshd(b=1), bias=torch.zeros(1, 4, 5, 7, dtype=BF16))
    assert cfg.bias_shape == "1hss"


def test_alibi_slopes_select_the_alibi_bias():
    assert config_from_tensors(*_bshd(), mask="causal", alibi_slopes=torch.ones(4)).bias == "alibi"


def test_options_reach_the_config_as_given():
    cfg = config_from_tensors(*_bshd(), mask="padding_causal_bottom_right", window_size=(3, 0), attn_scale=0.5,
                              dropout=0.1, softmax="off_by_one", deterministic=True,
                              seqlens_q=torch.tensor([5, 3]), seqlens_kv=torch.tensor([7, 2]), is_training=True)
    assert (cfg.mask, cfg.window_size, cfg.attn_scale, cfg.dropout, cfg.softmax, cfg.deterministic) == (
        "padding_causal_bottom_right", (3, 0), 0.5, 0.1, "off_by_one", True)
    assert cfg.resolved_bottom_right_diagonal


def test_fp8_quantizes_to_e4m3_with_current_scaling_and_returns_input_precision():
    cfg = config_from_tensors(*_bshd(dtype=torch.float16), fp8=True)
    assert (cfg.qkv_dtype, cfg.scaling_mode, cfg.resolved_o_dtype) == ("fp8_e4m3", "current", "fp16")
    assert cfg.candidate.value == "FP8"


def test_float8_inputs_with_descales_keep_their_dtype():
    q, k, v = (t.to(torch.float8_e4m3fn) for t in _bshd())
    one = torch.ones(1)
    cfg = config_from_tensors(q, k, v, fp8=FP8Scales(one, one, one))
    assert (cfg.qkv_dtype, cfg.resolved_o_dtype) == ("fp8_e4m3", "bf16")


def test_float32_inputs_have_no_fused_config():
    with pytest.raises(ConfigError) as err:
        config_from_tensors(*_bshd(dtype=torch.float32))
    assert err.value.field == "q"


# ----- fallback on CPU -------------------------------------------------------------------------
def _reference_bshd(q, k, v, **kw):
    out = reference_attention(_bhsd(q), _bhsd(k), _bhsd(v), **kw)
    return _bhsd(out)


def _grads(out, inputs, seed=1):
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    return torch.autograd.grad(out, inputs, grad)


FALLBACK_CASES = {
    "no_mask": dict(),
    "causal": dict(mask="causal"),
    "causal_bottom_right": dict(mask="causal_bottom_right"),
    "sliding_window": dict(mask="causal", window_size=(2, 0)),
    "two_sided_window": dict(window_size=(2, 1)),
    "padding": dict(mask="padding_causal", seqlens_q=torch.tensor([5, 3]), seqlens_kv=torch.tensor([7, 4])),
    "off_by_one": dict(softmax="off_by_one"),
    "scale": dict(attn_scale=0.3),
    "alibi": dict(mask="causal", alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])),
}


@pytest.mark.parametrize("case", sorted(FALLBACK_CASES))
def test_fallback_output_and_gradients_match_reference(case):
    kw = FALLBACK_CASES[case]
    q, k, v = _bshd(grad=True)
    out = attention(q, k, v, **kw)
    expected = _reference_bshd(q, k, v, **kw)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
    for got, want in zip(_grads(out, (q, k, v)), _grads(expected, (q, k, v))):
        torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


def test_learnable_sink_gets_its_gradient():
    q, k, v = _bshd(grad=True)
    sink = torch.randn(4, requires_grad=True)
    out = attention(q, k, v, softmax="learnable", sink=sink)
    expected = _reference_bshd(q, k, v, softmax="learnable", sink=sink)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
    (got,) = _grads(out, (sink,))
    (want,) = _grads(expected, (sink,))
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_trainable_bias_gets_its_gradient():
    q, k, v = _bshd(grad=True)
    bias = torch.randn(1, 4, 5, 7, dtype=BF16, requires_grad=True)
    out = attention(q, k, v, bias=bias, mask="causal")
    expected = _reference_bshd(q, k, v, bias=bias, mask="causal")
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(_grads(out, (bias,))[0].float(), _grads(expected, (bias,))[0].float(),
                               atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("layout", ["sbhd", "bhsd"])
def test_output_comes_back_in_the_callers_layout(layout):
    q, k, v = _bshd()
    perm = {"sbhd": (1, 0, 2, 3), "bhsd": (0, 2, 1, 3)}[layout]
    out = attention(*(t.permute(perm) for t in (q, k, v)), layout=layout, mask="causal")
    torch.testing.assert_close(out.permute(perm).float(), _reference_bshd(q, k, v, mask="causal").float(),
                               atol=2e-2, rtol=2e-2)


def test_return_lse_matches_reference():
    q, k, v = _bshd()
    out, lse = attention(q, k, v, mask="causal", return_lse=True)
    expected, expected_lse = reference_attention(_bhsd(q), _bhsd(k), _bhsd(v), mask="causal", return_lse=True)
    torch.testing.assert_close(lse, expected_lse, atol=1e-3, rtol=1e-3)
    assert lse.shape == (2, 4, 5, 1)


def test_fp8_request_without_a_gpu_falls_back_in_input_precision():
    q, k, v = _bshd()
    out = attention(q, k, v, mask="causal", fp8=True)
    assert out.dtype == BF16
    torch.testing.assert_close(out.float(), _reference_bshd(q, k, v, mask="causal").float(), atol=2e-2, rtol=2e-2)


def test_float32_inputs_fall_back_to_torch_sdpa():
    q, k, v = _bshd(dtype=torch.float32)
    out = attention(q, k, v, mask="causal")
    torch.testing.assert_close(out, _reference_bshd(q, k, v, mask="causal"), atol=1e-5, rtol=1e-5)
    entry = next(iter(dispatcher.entries.values()))
    assert entry.fallback == dispatch.FALLBACK_TORCH and "q=torch.float32" in entry.reason


def test_problems_torch_sdpa_expresses_use_torch_sdpa_others_reference():
    q, k, v = _bshd()
    attention(q, k, v, mask="causal")
    attention(q, k, v, mask="causal", window_size=(2, 0))
    kinds = sorted(e.fallback for e in dispatcher.entries.values())
    assert kinds == [dispatch.FALLBACK_REFERENCE, dispatch.FALLBACK_TORCH]


def _fallback_records(caplog):
    return [r for r in caplog.records if r.name == "fusedattn_select" and "falls back" in r.getMessage()]


def test_fallback_is_logged_once_per_config_with_its_reason(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    q, k, v = _bshd()
    for _ in range(3):
        attention(q, k, v, mask="causal")
    records = _fallback_records(caplog)
    assert len(records) == 1
    assert "rule:platform" in records[0].getMessage() and "no GPU in this test" in records[0].getMessage()


def test_each_new_problem_class_logs_its_own_fallback_and_its_other_shapes_do_not(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    attention(*_bshd(), mask="causal")
    attention(*_bshd(), mask="no_mask")  # another problem class: its own line
    attention(*_bshd(sq=6), mask="causal")  # another shape of the first class, for the same reason: none
    assert len(_fallback_records(caplog)) == 2


def test_the_hot_path_finds_a_decided_signature_without_deciding_again():
    q, k, v = _bshd()
    attention(q, k, v, mask="causal")
    built = dispatch_info()["entries_built"]
    for _ in range(5):
        attention(q, k, v, mask="causal")
    info = dispatch_info()
    assert info["entries_built"] == built and info["calls"] == 6 and info["fallback_calls"] == 6


# ----- argument errors -------------------------------------------------------------------------
BAD_ARGUMENTS = [
    ("q", lambda q, k, v: dict(q=q[0])),
    ("k", lambda q, k, v: dict(k=k[..., :4])),
    ("k", lambda q, k, v: dict(k=torch.randn(2, 7, 3, 8, dtype=BF16), v=torch.randn(2, 7, 3, 8, dtype=BF16))),
    ("v", lambda q, k, v: dict(v=v[:, :3])),
    ("k", lambda q, k, v: dict(k=k.float())),
    ("layout", lambda q, k, v: dict(layout="bhds")),
    ("mask", lambda q, k, v: dict(mask="triangular")),
    ("window_size", lambda q, k, v: dict(window_size=(3,))),
    ("window_size", lambda q, k, v: dict(mask="causal", window_size=(3, 2))),
    ("attn_scale", lambda q, k, v: dict(attn_scale=-1.0)),
    ("dropout", lambda q, k, v: dict(dropout=1.5)),
    ("softmax", lambda q, k, v: dict(softmax="sparsemax")),
    ("sink", lambda q, k, v: dict(softmax="learnable")),
    ("sink", lambda q, k, v: dict(sink=torch.zeros(4))),
    ("bias", lambda q, k, v: dict(bias=torch.zeros(2, 4, 5, 6, dtype=BF16))),
    ("alibi_slopes", lambda q, k, v: dict(alibi_slopes=torch.ones(3))),
    ("seqlens_q", lambda q, k, v: dict(mask="padding")),
    ("seqlens_q", lambda q, k, v: dict(seqlens_q=torch.tensor([1, 2]), seqlens_kv=torch.tensor([1, 2]))),
    ("seqlens_kv", lambda q, k, v: dict(mask="padding", seqlens_q=torch.tensor([1, 2]),
                                        seqlens_kv=torch.tensor([1.0, 2.0]))),
    ("deterministic", lambda q, k, v: dict(deterministic="yes")),
    ("fp8", lambda q, k, v: dict(fp8="yes")),
    ("fp8", lambda q, k, v: dict(q=q.to(torch.float8_e4m3fn), k=k.to(torch.float8_e4m3fn),
                                 v=v.to(torch.float8_e4m3fn))),
    ("return_lse", lambda q, k, v: dict(return_lse=1)),
]


@pytest.mark.parametrize(("field", "make"), BAD_ARGUMENTS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_ARGUMENTS)])
def test_bad_arguments_raise_config_error_naming_the_argument(field, make):
    q, k, v = _bshd()
    kwargs = dict(q=q, k=k, v=v)
    kwargs.update(make(q, k, v))
    with pytest.raises(ConfigError) as err:
        attention(kwargs.pop("q"), kwargs.pop("k"), kwargs.pop("v"), **kwargs)
    assert err.value.field == field
    assert str(err.value).startswith(field)


# A bad argument after a good call of the same shape: test_argument_checks_cpu.py.


# ----- the SDPA drop-in ------------------------------------------------------------------------
def _sdpa_inputs(b=2, hq=4, hkv=4, lq=5, s=7, e=8, ev=8, dtype=BF16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, lq, e, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(b, hkv, s, e, generator=gen).to(dtype).requires_grad_()
    v = torch.randn(b, hkv, s, ev, generator=gen).to(dtype).requires_grad_()
    return q, k, v


SDPA_CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "scale": dict(scale=0.2),
    "gqa": dict(enable_gqa=True, _hkv=2),
    "gqa_causal": dict(enable_gqa=True, is_causal=True, _hkv=1),
    "float_mask_full": dict(attn_mask=(4, 5, 7)),
    "float_mask_2d": dict(attn_mask=(5, 7)),
    "float_mask_broadcast_rows": dict(attn_mask=(2, 1, 1, 7)),
    "float_mask_bhss": dict(attn_mask=(2, 4, 5, 7)),
    "bool_mask": dict(attn_mask="bool"),
    "head_dim_v": dict(_ev=16),
    "float32": dict(_dtype=torch.float32, is_causal=True),
}


@pytest.mark.parametrize("case", sorted(SDPA_CASES))
def test_sdpa_drop_in_equals_torch_sdpa(case):
    kw = dict(SDPA_CASES[case])
    q, k, v = _sdpa_inputs(hkv=kw.pop("_hkv", 4), ev=kw.pop("_ev", 8), dtype=kw.pop("_dtype", BF16))
    if isinstance(kw.get("attn_mask"), tuple):
        kw["attn_mask"] = torch.randn(kw["attn_mask"], generator=torch.Generator().manual_seed(3)).to(q.dtype)
    elif kw.get("attn_mask") == "bool":
        kw["attn_mask"] = torch.rand(5, 7, generator=torch.Generator().manual_seed(3)) > 0.3
    ours = sdpa_module.scaled_dot_product_attention(q, k, v, **kw)
    theirs = sdpa_module.torch_sdpa(q, k, v, **kw)
    torch.testing.assert_close(ours, theirs, atol=1e-2, rtol=1e-2)
    for got, want in zip(_grads(ours, (q, k, v)), _grads(theirs, (q, k, v))):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_sdpa_drop_in_routes_mappable_calls_through_attention():
    q, k, v = _sdpa_inputs()
    sdpa_module.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert dispatch_info()["calls"] == 1


def test_sdpa_drop_in_leaves_boolean_masks_to_torch():
    q, k, v = _sdpa_inputs()
    sdpa_module.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 7, dtype=torch.bool))
    assert dispatch_info()["calls"] == 0


def test_sdpa_drop_in_dropout_draws_the_same_mask_as_torch():
    q, k, v = _sdpa_inputs()
    torch.manual_seed(7)
    ours = sdpa_module.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(7)
    theirs = sdpa_module.torch_sdpa(q, k, v, dropout_p=0.3)
    torch.testing.assert_close(ours, theirs)


def test_sdpa_drop_in_raises_torch_errors_for_what_torch_rejects():
    q, k, v = _sdpa_inputs(hkv=2)
    with pytest.raises(RuntimeError):
        sdpa_module.scaled_dot_product_attention(q, k, v)  # fewer K/V heads without enable_gqa


# ----- install / uninstall / routed ------------------------------------------------------------
def test_install_routes_torch_functional_and_uninstall_restores_it():
    original = torch.nn.functional.scaled_dot_product_attention
    sdpa_module.install()
    try:
        assert torch.nn.functional.scaled_dot_product_attention is sdpa_module.scaled_dot_product_attention
        q, k, v = _sdpa_inputs()
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert dispatch_info()["calls"] == 1
    finally:
        sdpa_module.uninstall()
    assert torch.nn.functional.scaled_dot_product_attention is original


def test_install_twice_then_uninstall_once_restores_the_original():
    original = torch.nn.functional.scaled_dot_product_attention
    sdpa_module.install()
    sdpa_module.install()
    sdpa_module.uninstall()
    assert torch.nn.functional.scaled_dot_product_attention is original
    sdpa_module.uninstall()  # not installed: nothing to do
    assert torch.nn.functional.scaled_dot_product_attention is original


def test_routed_restores_the_original_function():
    original = torch.nn.functional.scaled_dot_product_attention
    with sdpa_module.routed():
        assert sdpa_module.is_installed()
    assert torch.nn.functional.scaled_dot_product_attention is original


def test_routed_restores_even_when_the_block_raises():
    original = torch.nn.functional.scaled_dot_product_attention
    with pytest.raises(KeyError):
        with sdpa_module.routed():
            raise KeyError("boom")
    assert torch.nn.functional.scaled_dot_product_attention is original


def test_routed_inside_install_keeps_it_installed():
    original = torch.nn.functional.scaled_dot_product_attention
    sdpa_module.install()
    try:
        with sdpa_module.routed():
            pass
        assert sdpa_module.is_installed()
    finally:
        sdpa_module.uninstall()
    assert torch.nn.functional.scaled_dot_product_attention is original


def test_fallback_inside_the_drop_in_does_not_route_back_to_itself():
    with sdpa_module.routed():
        q, k, v = _sdpa_inputs()
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, sdpa_module.torch_sdpa(q, k, v, is_causal=True))


def test_multihead_attention_module_runs_through_the_drop_in():
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).to(BF16)
    x = torch.randn(2, 5, 16, dtype=BF16)
    expected, _ = mha(x, x, x, need_weights=False)
    with sdpa_module.routed():
        got, _ = mha(x, x, x, need_weights=False)
    torch.testing.assert_close(got, expected, atol=1e-2, rtol=1e-2)


# ----- torch.compile and the custom ops --------------------------------------------------------
def test_custom_ops_are_registered():
    assert hasattr(torch.ops.fusedattn_select, "attention_fwd")
    assert hasattr(torch.ops.fusedattn_select, "attention_bwd")


@pytest.mark.parametrize("training, dropout", [(True, 0.0), (False, 0.0), (True, 0.3)])
def test_forward_op_passes_opcheck(training, dropout):
    # With dropout a training call's op is given its seed (dropout_rng): the same inputs give the same
    # outputs and gradients, as opcheck's runs compare.
    q, k, v = _bshd(grad=True)
    bias = torch.randn(1, 4, 5, 7, dtype=BF16, requires_grad=True)
    opts = options.CallOptions("bshd", "causal", (-1, -1), None, dropout, "vanilla", False, False, "", training,
                               training, False, False)
    rng = torch.tensor([1234, 0], dtype=torch.int64) if dropout else None
    args = (q, k, v, bias, None, None, None, None, None, None, None, rng) + options.flatten(opts)
    torch.library.opcheck(torch.ops.fusedattn_select.attention_fwd.default, args)


def test_compiled_fullgraph_matches_eager_forward_and_backward():
    sink = torch.randn(4, requires_grad=True)

    def layer(q, k, v):
        return attention(q, k, v, mask="causal", window_size=(2, 0), softmax="learnable", sink=sink)

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    q, k, v = _bshd(grad=True)
    out = compiled(q, k, v)
    grads = _grads(out, (q, k, v, sink))
    expected = layer(q, k, v)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, _grads(expected, (q, k, v, sink))):
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
