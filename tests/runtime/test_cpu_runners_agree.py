"""Without a GPU, attention() runs torch SDPA or the float32 reference: the same call answers alike
whichever runs it, and as the fused runners do (the lse takes no gradient; a bias is taken in q's
precision), and bad optional tensors are ConfigErrors naming the argument."""

from __future__ import annotations

import logging

import pytest
import torch

from fusedattn_select import attention
from fusedattn_select.errors import ConfigError
from fusedattn_select.selection.selector import Selector, set_default_selector


@pytest.fixture(autouse=True)
def no_gpu():
    set_default_selector(Selector(None, unavailable_reason="no GPU"))
    logging.getLogger("fusedattn_select").setLevel(logging.ERROR)
    yield
    logging.getLogger("fusedattn_select").setLevel(logging.NOTSET)


def test_the_lse_takes_no_gradient_on_the_reference_either():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 6, 2, 8, requires_grad=True) for _ in range(3))
    lens = torch.tensor([6, 4])
    out, lse = attention(q, k, v, mask="padding", seqlens_q=lens, seqlens_kv=lens, return_lse=True)
    assert out.requires_grad and not lse.requires_grad


def test_a_float32_bias_is_taken_in_q_precision_by_both_runners():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 64, 2, 16).to(torch.bfloat16) for _ in range(3))
    bias = 200.0 + torch.randn(1, 1, 64, 64) * 0.5  # float32, far from 0: bf16 rounds it by up to 0.5
    on_sdpa = attention(q, k, v, bias=bias).float()
    on_reference = attention(q, k, v, bias=bias, return_lse=True)[0].float()  # return_lse: the reference runs it
    assert (on_sdpa - on_reference).abs().max() <= 0.03 * on_sdpa.abs().max()


@pytest.mark.parametrize(("lens_q", "lens_kv", "field"), [([6, 5], [7, 7], "seqlens_q"), ([-1, 5], [7, 7], "seqlens_q"),
                                                          ([5, 5], [7, 9], "seqlens_kv")])
def test_lengths_outside_the_sequence_are_refused_naming_the_argument(lens_q, lens_kv, field):
    q = torch.randn(2, 5, 2, 8)
    k = v = torch.randn(2, 7, 2, 8)
    attention(q, k, v, mask="padding", seqlens_q=torch.tensor([5, 3]), seqlens_kv=torch.tensor([7, 2]))  # decided
    with pytest.raises(ConfigError) as err:  # the same signature: its values are checked on every call
        attention(q, k, v, mask="padding", seqlens_q=torch.tensor(lens_q), seqlens_kv=torch.tensor(lens_kv))
    assert err.value.field == field and "from 0 to the sequence length" in str(err.value)


def test_an_empty_head_or_head_dim_is_named_by_its_own_tensor():
    q = torch.randn(2, 7, 2, 8)
    with pytest.raises(ConfigError) as err:
        attention(q, torch.randn(2, 7, 0, 8), torch.randn(2, 7, 0, 8))
    assert err.value.field == "k"
    with pytest.raises(ConfigError) as err:
        attention(q, torch.randn(2, 7, 2, 8), torch.randn(2, 7, 2, 0))
    assert err.value.field == "v"


EMPTY = [((0, 6, 4, 8), (0, 6, 2, 8)), ((2, 0, 4, 8), (2, 6, 2, 8)), ((2, 6, 4, 8), (2, 0, 2, 8))]


@pytest.mark.parametrize(("q_shape", "kv_shape"), EMPTY, ids=["batch 0", "seqlen_q 0", "seqlen_kv 0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "causal_bottom_right"])
def test_an_empty_problem_answers_as_torch_sdpa(q_shape, kv_shape, dtype, mask):
    """Batch 0, no queries or no keys: the output, its gradients and the lse of torch's SDPA (rows that see
    no key give 0, as reference/semantics.py says), from torch SDPA and from the reference alike."""
    q = torch.randn(*q_shape, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(*kv_shape, dtype=dtype, requires_grad=True) for _ in range(2))
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), is_causal=mask == "causal", enable_gqa=True).transpose(1, 2)
    want = torch.autograd.grad(sdpa.sum(), (q, k, v))
    for return_lse in (False, True):  # return_lse: the reference runs it
        got = attention(q, k, v, mask=mask, return_lse=return_lse)
        out = got[0] if return_lse else got
        assert out.shape == sdpa.shape and out.dtype == dtype and torch.equal(out, sdpa)
        grads = torch.autograd.grad(out.sum(), (q, k, v), allow_unused=True)
        for name, g, expected in zip("qkv", grads, want):
            assert g is not None and g.shape == expected.shape and torch.equal(g, expected), name
        if return_lse:
            assert got[1].shape == (q_shape[0], 4, q_shape[1], 1) and not got[1].any()


def test_an_empty_batch_with_padding_lengths_runs():
    q = torch.randn(0, 6, 4, 8, requires_grad=True)
    lens = torch.zeros(0, dtype=torch.int32)
    out = attention(q, q, q, mask="padding", seqlens_q=lens, seqlens_kv=lens)
    assert out.shape == q.shape


def test_an_empty_fp8_output_keeps_its_precision_with_a_descale_of_one():
    from fusedattn_select.runtime.fp8 import FP8Scales, FP8Tensor

    one = torch.ones(1)
    q = torch.randn(0, 6, 4, 8).to(torch.float8_e4m3fn)
    got = attention(q, q, q, fp8=FP8Scales(one, one, one, o_dtype=torch.float8_e4m3fn))
    assert isinstance(got, FP8Tensor) and got.data.shape == q.shape and got.data.dtype == torch.float8_e4m3fn
    assert torch.equal(got.descale, one)
