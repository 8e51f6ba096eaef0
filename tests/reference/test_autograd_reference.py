"""Tests for the float32 reference attention in ``fusedattn_select.reference.autograd_reference``."""

import math

import pytest

torch = pytest.importorskip("torch")

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402

from fusedattn_select.reference.autograd_reference import reference_attention, reference_attention_bshd  # noqa: E402

F64 = torch.float64


def _qkv(b=2, hq=2, hkv=None, sq=5, skv=5, d=4, dv=None, dtype=torch.float32, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    hkv = hq if hkv is None else hkv
    dv = d if dv is None else dv
    q = torch.randn(b, hq, sq, d, generator=gen, dtype=dtype)
    k = torch.randn(b, hkv, skv, d, generator=gen, dtype=dtype)
    v = torch.randn(b, hkv, skv, dv, generator=gen, dtype=dtype)
    if grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


def _math_sdpa(q, k, v, **kwargs):
    with sdpa_kernel(SDPBackend.MATH):
        return sdpa(q, k, v, **kwargs)


def _gradcheck(fn, *inputs):
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


def _bottom_right_causal_mask(sq, skv):
    i = torch.arange(sq).view(sq, 1)
    j = torch.arange(skv).view(1, skv)
    return j <= i + (skv - sq)


def _manual_attention(q, k, v, scores_fn=None, allowed=None, extra_logit=None):
    """Plain softmax attention with optional score transform, mask, and extra value-less logit."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if scores_fn is not None:
        s = scores_fn(s)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    if extra_logit is not None:
        s = torch.cat([s, extra_logit.expand(*s.shape[:-1], 1)], dim=-1)
        v = torch.cat([v, torch.zeros(*v.shape[:-2], 1, v.shape[-1], dtype=v.dtype)], dim=-2)
    return torch.softmax(s, dim=-1) @ v


# ---------------------------------------------------------------- forward vs SDPA


def test_no_mask_matches_sdpa():
    """Unmasked attention equals PyTorch SDPA."""
    q, k, v = _qkv(sq=5, skv=7)
    torch.testing.assert_close(reference_attention(q, k, v), _math_sdpa(q, k, v), atol=1e-5, rtol=1e-5)


def test_causal_matches_sdpa_is_causal():
    """Top-left causal attention with Sq == Skv equals SDPA with is_causal."""
    q, k, v = _qkv(sq=6, skv=6)
    out = reference_attention(q, k, v, mask="causal")
    torch.testing.assert_close(out, _math_sdpa(q, k, v, is_causal=True), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sq,skv", [(3, 7), (5, 8)])
def test_bottom_right_causal_matches_sdpa_with_explicit_mask(sq, skv):
    """Bottom-right causal attention with Sq < Skv equals SDPA with the equivalent boolean mask."""
    q, k, v = _qkv(sq=sq, skv=skv)
    out = reference_attention(q, k, v, mask="causal_bottom_right")
    expected = _math_sdpa(q, k, v, attn_mask=_bottom_right_causal_mask(sq, skv))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 1)])
def test_gqa_matches_sdpa_enable_gqa(hq, hkv):
    """Grouped-query and multi-query attention equal SDPA with enable_gqa."""
    q, k, v = _qkv(hq=hq, hkv=hkv, sq=4, skv=6)
    out = reference_attention(q, k, v, mask="causal_bottom_right")
    expected = _math_sdpa(q, k, v, attn_mask=_bottom_right_causal_mask(4, 6), enable_gqa=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bias_shape", [(1, 2, 5, 6), (2, 1, 5, 6), (2, 2, 5, 6), (1, 1, 5, 6)])
def test_additive_bias_matches_sdpa_float_mask(bias_shape):
    """A broadcastable additive bias equals SDPA with the same float mask."""
    q, k, v = _qkv(sq=5, skv=6)
    bias = torch.randn(bias_shape, generator=torch.Generator().manual_seed(1))
    out = reference_attention(q, k, v, bias=bias)
    torch.testing.assert_close(out, _math_sdpa(q, k, v, attn_mask=bias), atol=1e-5, rtol=1e-5)


def test_different_value_head_dim_matches_sdpa():
    """Dv different from Dqk gives output head dim Dv equal to SDPA."""
    q, k, v = _qkv(sq=4, skv=5, d=4, dv=6)
    out = reference_attention(q, k, v)
    assert out.shape == (2, 2, 4, 6)
    torch.testing.assert_close(out, _math_sdpa(q, k, v), atol=1e-5, rtol=1e-5)


def test_padding_matches_sdpa_on_valid_rows():
    """Padding attention equals SDPA with a key-length boolean mask on rows within the query length."""
    q, k, v = _qkv(b=3, sq=5, skv=6)
    lens_q = torch.tensor([5, 3, 1])
    lens_kv = torch.tensor([6, 2, 4])
    out = reference_attention(q, k, v, mask="padding", seqlens_q=lens_q, seqlens_kv=lens_kv)
    key_mask = (torch.arange(6).view(1, 6) < lens_kv.view(3, 1)).view(3, 1, 1, 6)
    expected = _math_sdpa(q, k, v, attn_mask=key_mask)
    for b in range(3):
        n = int(lens_q[b])
        torch.testing.assert_close(out[b, :, :n], expected[b, :, :n], atol=1e-5, rtol=1e-5)


def test_padded_query_rows_are_zero():
    """Query rows beyond seqlens_q produce zero output and zero log-sum-exp."""
    q, k, v = _qkv(b=2, sq=5, skv=5)
    lens = torch.tensor([5, 2])
    out, lse = reference_attention(
        q, k, v, mask="padding_causal", seqlens_q=lens, seqlens_kv=lens, return_lse=True
    )
    assert torch.all(out[1, :, 2:] == 0)
    assert torch.all(lse[1, :, 2:] == 0)


def test_padding_causal_bottom_right_uses_per_sequence_lengths():
    """Bottom-right causal with padding aligns each batch element to its own actual lengths."""
    q, k, v = _qkv(b=2, sq=4, skv=7)
    lens_q = torch.tensor([4, 2])
    lens_kv = torch.tensor([7, 5])
    out = reference_attention(
        q, k, v, mask="padding_causal_bottom_right", seqlens_q=lens_q, seqlens_kv=lens_kv
    )
    for b in range(2):
        nq, nk = int(lens_q[b]), int(lens_kv[b])
        alone = reference_attention(
            q[b : b + 1, :, :nq], k[b : b + 1, :, :nk], v[b : b + 1, :, :nk], mask="causal_bottom_right"
        )
        torch.testing.assert_close(out[b : b + 1, :, :nq], alone, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- semantics


def test_sliding_window_matches_hand_built_mask():
    """A (left, right) window keeps exactly the keys i-left <= j <= i+right."""
    q, k, v = _qkv(sq=7, skv=7, dtype=F64)
    out = reference_attention(q, k, v, window_size=(2, 1), compute_dtype=F64)
    i = torch.arange(7).view(7, 1)
    j = torch.arange(7).view(1, 7)
    allowed = (j >= i - 2) & (j <= i + 1)
    torch.testing.assert_close(out, _manual_attention(q, k, v, allowed=allowed))


def test_causal_window_is_intersection():
    """A causal mask with a left window keeps keys i-left <= j <= i."""
    q, k, v = _qkv(sq=6, skv=6, dtype=F64)
    out = reference_attention(q, k, v, mask="causal", window_size=(2, -1), compute_dtype=F64)
    i = torch.arange(6).view(6, 1)
    j = torch.arange(6).view(1, 6)
    allowed = (j >= i - 2) & (j <= i)
    torch.testing.assert_close(out, _manual_attention(q, k, v, allowed=allowed))


def test_bottom_right_diagonal_shifts_window_without_causal():
    """bottom_right_diagonal=True centres a non-causal window on i + (Skv - Sq)."""
    q, k, v = _qkv(sq=3, skv=7, dtype=F64)
    out = reference_attention(q, k, v, window_size=(1, 1), bottom_right_diagonal=True, compute_dtype=F64)
    i = torch.arange(3).view(3, 1) + 4
    j = torch.arange(7).view(1, 7)
    allowed = (j >= i - 1) & (j <= i + 1)
    torch.testing.assert_close(out, _manual_attention(q, k, v, allowed=allowed))


def test_bottom_right_mask_sets_window_diagonal_by_default():
    """causal_bottom_right aligns the window to the bottom-right diagonal."""
    q, k, v = _qkv(sq=3, skv=7, dtype=F64)
    out = reference_attention(q, k, v, mask="causal_bottom_right", window_size=(2, 0), compute_dtype=F64)
    i = torch.arange(3).view(3, 1) + 4
    j = torch.arange(7).view(1, 7)
    allowed = (j >= i - 2) & (j <= i)
    torch.testing.assert_close(out, _manual_attention(q, k, v, allowed=allowed))


def test_off_by_one_equals_extra_zero_logit_key():
    """off_by_one equals vanilla attention with an extra key of logit 0 and zero value."""
    q, k, v = _qkv(sq=4, skv=5, dtype=F64)
    out = reference_attention(q, k, v, mask="causal_bottom_right", softmax="off_by_one", compute_dtype=F64)
    expected = _manual_attention(
        q, k, v, allowed=_bottom_right_causal_mask(4, 5), extra_logit=torch.zeros(1, dtype=F64)
    )
    torch.testing.assert_close(out, expected)


def test_learnable_sink_equals_extra_key_with_sink_logit():
    """learnable softmax equals vanilla attention with an extra per-head logit sink[h] and zero value."""
    q, k, v = _qkv(hq=3, sq=4, skv=4, dtype=F64)
    sink = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    out = reference_attention(q, k, v, softmax="learnable", sink=sink, compute_dtype=F64)
    expected = _manual_attention(q, k, v, extra_logit=sink.view(1, 3, 1, 1).expand(2, 3, 4, 1))
    torch.testing.assert_close(out, expected)


def test_lse_matches_torch_logsumexp():
    """The returned log-sum-exp equals torch.logsumexp of the scaled, masked scores."""
    q, k, v = _qkv(sq=4, skv=6, dtype=F64)
    _, lse = reference_attention(q, k, v, mask="causal_bottom_right", attn_scale=0.3, return_lse=True,
                                 compute_dtype=F64)
    s = (q @ k.transpose(-1, -2) * 0.3).masked_fill(~_bottom_right_causal_mask(4, 6), float("-inf"))
    assert lse.shape == (2, 2, 4, 1)
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1, keepdim=True))


def test_lse_includes_sink_logit():
    """With learnable sinks the log-sum-exp includes the sink logit."""
    q, k, v = _qkv(hq=2, sq=3, skv=4, dtype=F64)
    sink = torch.tensor([0.7, -0.2], dtype=F64)
    _, lse = reference_attention(q, k, v, softmax="learnable", sink=sink, return_lse=True, compute_dtype=F64)
    s = q @ k.transpose(-1, -2) / 2.0
    s = torch.cat([s, sink.view(1, 2, 1, 1).expand(2, 2, 3, 1)], dim=-1)
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1, keepdim=True))


def test_lse_is_float32_by_default():
    """The log-sum-exp is float32 even for half-precision inputs."""
    q, k, v = _qkv(dtype=torch.bfloat16)
    _, lse = reference_attention(q, k, v, return_lse=True)
    assert lse.dtype == torch.float32


def test_output_dtype_follows_q():
    """The output has q's dtype and the (B, Hq, Sq, Dv) shape."""
    q, k, v = _qkv(hq=4, hkv=2, sq=3, skv=5, dv=6, dtype=torch.float16)
    out = reference_attention(q, k, v)
    assert out.dtype == torch.float16
    assert out.shape == (2, 4, 3, 6)


def test_non_contiguous_inputs_give_same_result():
    """Strided (non-contiguous) inputs give the same output as contiguous ones."""
    q, k, v = _qkv(sq=5, skv=6)
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not qt.is_contiguous()
    torch.testing.assert_close(reference_attention(qt, kt, vt, mask="causal"),
                               reference_attention(q, k, v, mask="causal"))


def test_bshd_wrapper_matches_bhsd():
    """reference_attention_bshd equals reference_attention on transposed inputs."""
    q, k, v = _qkv(sq=4, skv=5)
    out = reference_attention_bshd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask="causal")
    torch.testing.assert_close(out, reference_attention(q, k, v, mask="causal").transpose(1, 2))


def test_alibi_matches_explicit_signed_bias():
    """ALiBi adds slope * (j - (i + offset)) with the bottom-right offset."""
    q, k, v = _qkv(hq=2, sq=3, skv=5, dtype=F64)
    slopes = torch.tensor([0.5, 0.25], dtype=F64)
    out = reference_attention(q, k, v, mask="causal_bottom_right", alibi_slopes=slopes, compute_dtype=F64)
    rel = (torch.arange(5).view(1, 5) - (torch.arange(3).view(3, 1) + 2)).to(F64)
    bias = slopes.view(1, 2, 1, 1) * rel
    expected = reference_attention(q, k, v, mask="causal_bottom_right", bias=bias, compute_dtype=F64)
    torch.testing.assert_close(out, expected)


def test_per_batch_alibi_slopes_apply_per_batch():
    """(B, Hq) ALiBi slopes apply a different slope to each batch element."""
    q, k, v = _qkv(b=2, hq=2, sq=4, skv=4, dtype=F64)
    slopes = torch.tensor([[0.5, 0.25], [1.0, 0.125]], dtype=F64)
    out = reference_attention(q, k, v, mask="causal", alibi_slopes=slopes, compute_dtype=F64)
    for b in range(2):
        alone = reference_attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], mask="causal",
                                    alibi_slopes=slopes[b], compute_dtype=F64)
        torch.testing.assert_close(out[b : b + 1], alone)


def test_softcap_applies_tanh_after_scale_before_bias():
    """softcap transforms scaled scores by softcap * tanh(s / softcap) before the bias is added."""
    q, k, v = _qkv(sq=4, skv=4, dtype=F64)
    q = q * 5.0
    bias = torch.randn(1, 1, 4, 4, dtype=F64, generator=torch.Generator().manual_seed(3))
    out = reference_attention(q, k, v, softcap=2.0, bias=bias, compute_dtype=F64)
    expected = _manual_attention(q, k, v, scores_fn=lambda s: 2.0 * torch.tanh(s / 2.0) + bias)
    torch.testing.assert_close(out, expected)


def test_attn_scale_overrides_default():
    """An explicit attn_scale replaces 1/sqrt(Dqk)."""
    q, k, v = _qkv(sq=4, skv=4)
    out = reference_attention(q, k, v, attn_scale=0.1)
    torch.testing.assert_close(out, _math_sdpa(q, k, v, scale=0.1), atol=1e-5, rtol=1e-5)


def test_fully_masked_row_gives_zeros_not_nan():
    """A row with every key masked yields zero output and zero log-sum-exp, not NaN."""
    q, k, v = _qkv(sq=5, skv=3)
    # Bottom-right causal with Skv < Sq: the first Sq - Skv rows see no key.
    out, lse = reference_attention(q, k, v, mask="causal_bottom_right", return_lse=True)
    assert torch.all(out[:, :, :2] == 0)
    assert torch.all(lse[:, :, :2] == 0)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


def test_fully_masked_row_has_finite_gradients():
    """Backward through fully masked rows yields finite gradients."""
    q, k, v = _qkv(b=2, sq=4, skv=4, grad=True)
    lens_kv = torch.tensor([0, 4])
    out, lse = reference_attention(q, k, v, mask="padding", seqlens_q=torch.tensor([4, 4]),
                                   seqlens_kv=lens_kv, return_lse=True)
    (out.sum() + lse.sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


def test_dropout_is_reproducible_with_generator():
    """Dropout with equally seeded generators gives identical outputs."""
    q, k, v = _qkv()
    a = reference_attention(q, k, v, dropout=0.3, generator=torch.Generator().manual_seed(7))
    b = reference_attention(q, k, v, dropout=0.3, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.allclose(a, reference_attention(q, k, v))


def test_dropout_is_unbiased():
    """Averaged over many draws, dropout with 1/(1-p) rescaling matches no dropout."""
    q, k, v = _qkv(b=1, hq=1, sq=2, skv=3, d=2, dtype=F64)
    n = 20000
    qn, kn, vn = (t.expand(n, -1, -1, -1) for t in (q, k, v))
    out = reference_attention(qn, kn, vn, dropout=0.5, generator=torch.Generator().manual_seed(0),
                              compute_dtype=F64)
    torch.testing.assert_close(out.mean(0, keepdim=True), reference_attention(q, k, v, compute_dtype=F64),
                               atol=0.05, rtol=0)


# ---------------------------------------------------------------- gradients


def test_gradcheck_causal():
    """Gradients of top-left causal attention match finite differences."""
    q, k, v = _qkv(sq=4, skv=4, d=3, dtype=F64, grad=True)
    _gradcheck(lambda q, k, v: reference_attention(q, k, v, mask="causal", compute_dtype=F64), q, k, v)


def test_gradcheck_bottom_right_causal_short_query():
    """Gradients of bottom-right causal attention with Sq < Skv match finite differences."""
    q, k, v = _qkv(sq=3, skv=5, d=3, dtype=F64, grad=True)
    _gradcheck(lambda q, k, v: reference_attention(q, k, v, mask="causal_bottom_right", compute_dtype=F64),
               q, k, v)


def test_gradcheck_sliding_window():
    """Gradients of sliding-window attention match finite differences."""
    q, k, v = _qkv(sq=5, skv=5, d=3, dtype=F64, grad=True)
    _gradcheck(lambda q, k, v: reference_attention(q, k, v, window_size=(1, 1), compute_dtype=F64), q, k, v)


def test_gradcheck_padding():
    """Gradients of padding attention match finite differences."""
    q, k, v = _qkv(sq=4, skv=5, d=3, dtype=F64, grad=True)
    lq, lkv = torch.tensor([4, 2]), torch.tensor([3, 5])
    _gradcheck(lambda q, k, v: reference_attention(q, k, v, mask="padding_causal_bottom_right", seqlens_q=lq,
                                                   seqlens_kv=lkv, compute_dtype=F64), q, k, v)


def test_gradcheck_gqa():
    """Gradients of grouped-query attention match finite differences, summing over the group."""
    q, k, v = _qkv(b=1, hq=4, hkv=2, sq=3, skv=4, d=3, dtype=F64, grad=True)
    _gradcheck(lambda q, k, v: reference_attention(q, k, v, mask="causal", compute_dtype=F64), q, k, v)


def test_gradcheck_off_by_one():
    """Gradients of off-by-one softmax attention match finite differences."""
    q, k, v = _qkv(sq=3, skv=4, d=3, dtype=F64, grad=True)
    _gradcheck(lambda q, k, v: reference_attention(q, k, v, softmax="off_by_one", compute_dtype=F64), q, k, v)


def test_gradcheck_learnable_sink():
    """Gradients w.r.t. q, k, v and the learnable sink match finite differences."""
    q, k, v = _qkv(sq=3, skv=4, d=3, dtype=F64, grad=True)
    sink = torch.tensor([0.3, -0.5], dtype=F64, requires_grad=True)
    _gradcheck(lambda q, k, v, s: reference_attention(q, k, v, mask="causal", softmax="learnable", sink=s,
                                                      compute_dtype=F64), q, k, v, sink)


def test_gradcheck_bias():
    """Gradients w.r.t. q, k, v and a broadcast bias match finite differences."""
    q, k, v = _qkv(sq=3, skv=4, d=3, dtype=F64, grad=True)
    bias = torch.randn(1, 2, 3, 4, dtype=F64, requires_grad=True)
    _gradcheck(lambda q, k, v, b: reference_attention(q, k, v, bias=b, compute_dtype=F64), q, k, v, bias)


def test_gradcheck_alibi():
    """Gradients w.r.t. q, k, v and the ALiBi slopes match finite differences."""
    q, k, v = _qkv(sq=3, skv=4, d=3, dtype=F64, grad=True)
    slopes = torch.tensor([0.5, 0.25], dtype=F64, requires_grad=True)
    _gradcheck(lambda q, k, v, s: reference_attention(q, k, v, mask="causal_bottom_right", alibi_slopes=s,
                                                      compute_dtype=F64), q, k, v, slopes)


def test_gradcheck_softcap():
    """Gradients of soft-capped attention match finite differences."""
    q, k, v = _qkv(sq=3, skv=4, d=3, dtype=F64, grad=True)
    _gradcheck(lambda q, k, v: reference_attention(q, k, v, softcap=1.5, compute_dtype=F64), q, k, v)


def test_gradcheck_lse():
    """Gradients of the returned log-sum-exp match finite differences."""
    q, k, v = _qkv(sq=3, skv=4, d=3, dtype=F64, grad=True)
    _gradcheck(lambda q, k, v: reference_attention(q, k, v, mask="causal", return_lse=True,
                                                   compute_dtype=F64)[1], q, k, v)


# ---------------------------------------------------------------- validation

_Q, _K, _V = _qkv(b=2, hq=4, hkv=2, sq=3, skv=5, d=4)
_BAD_CASES = {
    "q_ndim": ("q", dict(q=_Q[0])),
    "k_ndim": ("k", dict(k=_K[0])),
    "q_int": ("q", dict(q=_Q.to(torch.int32))),
    "head_mismatch": (r"q heads \(4\) .* k/v heads \(3\)",
                      dict(k=_K[:, :1].expand(2, 3, 5, 4), v=_V[:, :1].expand(2, 3, 5, 4))),
    "kv_heads_mismatch": ("k has 2 heads, v has 1", dict(v=_V[:, :1])),
    "batch_mismatch": ("q has 2, k has 1", dict(k=_K[:1], v=_V[:1])),
    "dqk_mismatch": ("q has Dqk=4, k has 3", dict(k=_K[..., :3])),
    "skv_mismatch": ("k has 5, v has 4", dict(v=_V[:, :, :4])),
    "mask": ("mask", dict(mask="causal_top_left")),
    "softmax": ("softmax", dict(softmax="sigmoid")),
    "window_len": ("window_size", dict(window_size=(1,))),
    "window_neg": ("window_size", dict(window_size=(-2, 0))),
    "attn_scale": ("attn_scale", dict(attn_scale="0.5")),
    "dropout_high": ("dropout", dict(dropout=1.0)),
    "dropout_neg": ("dropout", dict(dropout=-0.1)),
    "softcap": ("softcap", dict(softcap=0.0)),
    "bias_shape": ("bias", dict(bias=torch.zeros(2, 4, 3, 4))),
    "bias_ndim": ("bias", dict(bias=torch.zeros(3, 5))),
    "alibi_shape": ("alibi_slopes", dict(alibi_slopes=torch.ones(2))),
    "sink_missing": ("sink", dict(softmax="learnable")),
    "sink_unexpected": ("sink", dict(sink=torch.zeros(4))),
    "sink_shape": ("sink", dict(softmax="learnable", sink=torch.zeros(2))),
    "seqlens_q_missing": ("seqlens_q", dict(mask="padding", seqlens_kv=torch.tensor([5, 5]))),
    "seqlens_kv_missing": ("seqlens_kv", dict(mask="padding_causal", seqlens_q=torch.tensor([3, 3]))),
    "seqlens_without_padding": ("seqlens_q", dict(seqlens_q=torch.tensor([3, 3]),
                                                  seqlens_kv=torch.tensor([5, 5]))),
    "seqlens_too_long": ("seqlens_kv", dict(mask="padding", seqlens_q=torch.tensor([3, 3]),
                                            seqlens_kv=torch.tensor([6, 5]))),
    "seqlens_float": ("seqlens_q", dict(mask="padding", seqlens_q=torch.tensor([3.0, 3.0]),
                                        seqlens_kv=torch.tensor([5, 5]))),
    "seqlens_shape": ("seqlens_q", dict(mask="padding", seqlens_q=torch.tensor([3]),
                                        seqlens_kv=torch.tensor([5, 5]))),
    "diagonal_conflict": ("bottom_right_diagonal", dict(mask="causal", bottom_right_diagonal=True)),
    "compute_dtype": ("compute_dtype", dict(compute_dtype=torch.float16)),
}


@pytest.mark.parametrize("case", sorted(_BAD_CASES))
def test_invalid_argument_raises_value_error_naming_it(case):
    """Each invalid argument raises ValueError whose message names the argument."""
    name, overrides = _BAD_CASES[case]
    kwargs = dict(q=_Q, k=_K, v=_V)
    kwargs.update(overrides)
    q, k, v = kwargs.pop("q"), kwargs.pop("k"), kwargs.pop("v")
    with pytest.raises(ValueError, match=name):
        reference_attention(q, k, v, **kwargs)


def test_the_references_names_are_the_configs():
    # The reference imports nothing else of the package (an oracle that shares no code with what it
    # checks), so it keeps its own copy of the names; this keeps the copy equal to config's.
    from fusedattn_select.config import MASKS, SOFTMAXES
    from fusedattn_select.reference.semantics import MASK_TYPES, SOFTMAX_TYPES

    assert MASK_TYPES == MASKS and SOFTMAX_TYPES == SOFTMAXES
