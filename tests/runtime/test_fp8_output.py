"""FP8 output (FP8Scales(..., o_dtype=torch.float8_e4m3fn)) on CPU: argument checks, and the
fallback's result quantized into an FP8Tensor whose dequantized value is the attention of the
dequantized inputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select import FP8Scales, FP8Tensor, attention  # noqa: E402
from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime.api import clear_plans  # noqa: E402

E4M3 = torch.float8_e4m3fn


def _float8_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    raw = [torch.randn(2, 16, 4, 32, generator=gen) for _ in range(3)]  # bshd
    descales = [torch.tensor([2.0 ** -4]) for _ in range(3)]
    q8, k8, v8 = ((t / d).to(E4M3) for t, d in zip(raw, descales))
    return (q8, k8, v8), descales


def test_fp8_output_is_an_fp8_tensor_whose_value_is_the_attention_of_the_inputs():
    clear_plans()
    (q8, k8, v8), (dq, dk, dv) = _float8_inputs()
    with torch.no_grad():
        out = attention(q8, k8, v8, mask="causal", fp8=FP8Scales(dq, dk, dv, o_dtype=E4M3))
        want = attention(q8, k8, v8, mask="causal", fp8=FP8Scales(dq, dk, dv, o_dtype=torch.bfloat16))
    assert isinstance(out, FP8Tensor)
    assert out.data.dtype == E4M3 and out.data.shape == q8.shape
    assert out.descale.dtype == torch.float32 and out.descale.numel() == 1
    scale = 1.0 / float(out.descale)
    assert scale == 2.0 ** round(torch.log2(torch.tensor(scale)).item())  # a power of two
    assert float(out.data.float().abs().max()) <= 448.0
    got = out.dequantize(torch.float32)
    err = (got - want.float()).abs().max() / want.float().abs().max()
    assert err <= 2 ** -3  # e4m3 keeps 3 mantissa bits
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.float().flatten(), dim=0)
    assert cos >= 0.995


def test_fp8_output_with_the_lse_returns_both():
    (q8, k8, v8), (dq, dk, dv) = _float8_inputs(1)
    with torch.no_grad():
        out, lse = attention(q8, k8, v8, fp8=FP8Scales(dq, dk, dv, o_dtype=E4M3), return_lse=True)
    assert isinstance(out, FP8Tensor)
    assert lse.shape == (2, 4, 16, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e5m2, torch.int8])
def test_other_output_dtypes_are_refused_naming_the_allowed_ones(dtype):
    (q8, k8, v8), (dq, dk, dv) = _float8_inputs()
    with pytest.raises(ConfigError, match="float8_e4m3fn") as err:
        attention(q8, k8, v8, fp8=FP8Scales(dq, dk, dv, o_dtype=dtype))
    assert "fp8.o_dtype" in str(err.value)


def test_fp8_output_is_refused_under_torch_compile_naming_the_field():
    from fusedattn_select.runtime import ops
    from fusedattn_select.runtime.args import Arguments
    from fusedattn_select.runtime.options import OptionalInputs

    (q8, k8, v8), (dq, dk, dv) = _float8_inputs()
    arguments = Arguments(fp8=FP8Scales(dq, dk, dv, o_dtype=E4M3))
    with pytest.raises(ConfigError, match="eagerly only") as err:
        ops.compiled_attention(q8, k8, v8, OptionalInputs(), arguments)
    assert "fp8.o_dtype" in str(err.value)
