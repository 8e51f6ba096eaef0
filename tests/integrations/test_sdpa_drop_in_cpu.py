"""The SDPA drop-in (integrations/sdpa.py) on CPU: nested tensors and masks it leaves to torch's own
SDPA (so the answer or the error is torch's), and torch's signature (keyword-only scale and enable_gqa)."""

from __future__ import annotations

import inspect
import logging

import pytest

torch = pytest.importorskip("torch")

from sdpa_state import TORCH_SDPA, F, sdpa, torch_attribute_restored  # noqa: E402,F401 (an autouse fixture)


@pytest.fixture
def attention_calls(monkeypatch):
    """The calls the drop-in hands to attention() (counted, then run as before)."""
    calls = []
    original = sdpa.attention

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(sdpa, "attention", counted)
    return calls


# ----- what goes to torch's own SDPA ---------------------------------------------------------------
def _strided_nested():
    return torch.nested.nested_tensor([torch.randn(3, n, 8, dtype=torch.float16) for n in (4, 6)])


def _jagged_nested():
    seqs = [torch.randn(n, 3, 8, dtype=torch.float16) for n in (4, 6)]
    return torch.nested.nested_tensor(seqs, layout=torch.jagged).transpose(1, 2)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make", [_strided_nested, _jagged_nested], ids=["strided", "jagged"])
def test_nested_inputs_go_to_torch_sdpa_untouched_without_a_warning(make, attention_calls, caplog):
    torch.manual_seed(0)
    nt = make()
    with caplog.at_level(logging.INFO, logger="fusedattn_select"):
        out = sdpa.scaled_dot_product_attention(nt, nt, nt)
    expected = sdpa.torch_sdpa(nt, nt, nt)
    assert out.is_nested and attention_calls == []
    for got, want in zip(out.unbind(), expected.unbind()):
        torch.testing.assert_close(got, want)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("fusedattn_select")] == []


@pytest.mark.parametrize("shape", [(), (7,), (1, 1, 2, 5, 7)], ids=["0d", "1d", "5d"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_float_mask_torch_rejects_raises_torchs_own_error(shape, dtype, attention_calls):
    q = torch.randn(2, 3, 5, 8, dtype=dtype)
    k = v = torch.randn(2, 3, 7, 8, dtype=dtype)
    mask = torch.randn(shape).to(dtype)
    with pytest.raises(Exception) as theirs:
        sdpa.torch_sdpa(q, k, v, attn_mask=mask)
    with pytest.raises(type(theirs.value)) as ours:
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert str(ours.value) == str(theirs.value) and attention_calls == []


# ----- torch's signature -----------------------------------------------------------------------------
def test_signature_matches_torchs_schema_scale_and_enable_gqa_keyword_only():
    schema = torch._C._jit_get_schemas_for_operator("aten::scaled_dot_product_attention")[0]
    expected = [(a.name, a.kwarg_only) for a in schema.arguments]
    params = inspect.signature(sdpa.scaled_dot_product_attention).parameters.values()
    assert [(p.name, p.kind is inspect.Parameter.KEYWORD_ONLY) for p in params] == expected
    defaults = {a.name: a.default_value for a in schema.arguments if a.default_value is not None}
    assert {p.name: p.default for p in params if p.default is not inspect.Parameter.empty} == {
        "attn_mask": None, **defaults, "scale": None}


@pytest.mark.parametrize("extra", [(0.5,), (None, True)], ids=["scale", "scale_and_enable_gqa"])
def test_scale_given_positionally_is_a_type_error_as_in_torch(extra):
    q = torch.randn(1, 2, 3, 8, dtype=torch.bfloat16)
    args = (q, q, q, None, 0.0, False, *extra)
    with pytest.raises(TypeError):
        TORCH_SDPA(*args)
    with pytest.raises(TypeError):
        sdpa.scaled_dot_product_attention(*args)


def test_scale_and_enable_gqa_by_keyword_still_run_and_match_torch():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 3, 8, generator=gen).to(torch.bfloat16)
    k = v = torch.randn(1, 2, 5, 8, generator=gen).to(torch.bfloat16)
    ours = sdpa.scaled_dot_product_attention(q, k, v, None, 0.0, True, scale=0.5, enable_gqa=True)
    theirs = sdpa.torch_sdpa(q, k, v, None, 0.0, True, scale=0.5, enable_gqa=True)
    torch.testing.assert_close(ours, theirs, atol=1e-2, rtol=1e-2)
