"""attention() on CPU float64 tensors is float64 throughout, on both of its CPU runners (torch SDPA and the
reference): `torch.autograd.gradcheck` of attention() passes whatever the mask or softmax, and the
reference's default precision follows float64 inputs."""

import math

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select import attention  # noqa: E402
from fusedattn_select.reference.autograd_reference import reference_attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_platform")

F64 = torch.float64


def _qkv(seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, 2, 4, generator=gen, dtype=F64, requires_grad=True)   # bshd, Sq 3
    k = torch.randn(2, 4, 1, 4, generator=gen, dtype=F64, requires_grad=True)   # Skv 4, GQA 2/1
    v = torch.randn(2, 4, 1, 5, generator=gen, dtype=F64, requires_grad=True)
    return q, k, v


CALLS = {
    "no_mask": {},
    "padding": dict(mask="padding", seqlens_q=torch.tensor([3, 2]), seqlens_kv=torch.tensor([4, 1])),
    "window": dict(window_size=(1, 0)),
    "causal_bottom_right_window": dict(mask="causal_bottom_right", window_size=(1, 0)),
    "off_by_one": dict(softmax="off_by_one"),
    "alibi": dict(alibi_slopes=torch.tensor([0.5, 0.25], dtype=F64), mask="causal"),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_gradcheck_of_attention_in_float64(name):
    """Every problem passes gradcheck in float64 (the reference ran float32 inside and failed it)."""
    keywords = CALLS[name]
    q, k, v = _qkv()
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, **keywords), (q, k, v), eps=1e-6,
                                    atol=1e-7, rtol=1e-6)


def test_learnable_sink_gradcheck_in_float64():
    q, k, v = _qkv(1)
    sink = torch.tensor([0.3, -1.2], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v, s: attention(q, k, v, softmax="learnable", sink=s),
                                    (q, k, v, sink), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_float64_output_matches_a_float64_softmax_to_float64_precision():
    q, k, v = (t.detach() for t in _qkv(2))
    out, lse = attention(q, k, v, layout="bshd", softmax="off_by_one", return_lse=True)
    qb, kb, vb = q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(2, 1), v.transpose(1, 2).repeat_interleave(2, 1)
    s = qb @ kb.transpose(-1, -2) / math.sqrt(4)
    s = torch.cat([s, torch.zeros(*s.shape[:-1], 1, dtype=F64)], -1)
    expected = torch.softmax(s, -1)[..., :-1] @ vb
    assert out.dtype == F64 and lse.dtype == F64
    torch.testing.assert_close(out.transpose(1, 2), expected, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1, keepdim=True), atol=1e-12, rtol=1e-12)


def test_reference_default_precision_follows_the_inputs():
    q, k, v = (t.detach().transpose(1, 2) for t in _qkv(3))
    _, lse64 = reference_attention(q, k, v, return_lse=True)
    assert lse64.dtype == F64
    _, lse32 = reference_attention(q.float(), k.float(), v.float(), return_lse=True)
    assert lse32.dtype == torch.float32
    _, lse_asked = reference_attention(q, k, v, return_lse=True, compute_dtype=torch.float32)
    assert lse_asked.dtype == torch.float32  # an explicit compute_dtype is honoured
    with pytest.raises(ValueError, match="compute_dtype"):
        reference_attention(q, k, v, compute_dtype=torch.float16)
