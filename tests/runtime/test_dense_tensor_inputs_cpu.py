"""attention() takes dense (strided) q, k and v: a nested tensor (jagged or strided), a sparse tensor or an
MKL-DNN tensor is refused with a ConfigError naming the argument, as every other bad argument is. Nested
tensors used to fall through to torch's SDPA where it could take them (a new call signature and a fallback
warning for every batch, as each batch's ragged length is a new symbol) and crash inside torch where it could
not (a causal mask, the sbhd layout, a dense q with nested k and v); sparse and MKL-DNN tensors crashed inside
torch's SDPA. Nested tensors go to torch's SDPA through the drop-in (integrations.sdpa)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime.api import attention, config_from_tensors  # noqa: E402
from fusedattn_select.runtime.args import Arguments, check_args  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.options import NO_INPUTS  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_platform")


def _jagged(lengths=(3, 5), dtype=torch.bfloat16):
    """A (B, j, H, D) jagged nested tensor: one (S_i, H, D) sequence per batch item."""
    gen = torch.Generator().manual_seed(0)
    return torch.nested.nested_tensor([torch.randn(n, 2, 8, generator=gen).to(dtype) for n in lengths],
                                      layout=torch.jagged)


def _dense(dtype=torch.bfloat16):
    return torch.randn(2, 5, 2, 8, generator=torch.Generator().manual_seed(1)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("options", [{}, {"mask": "causal"}, {"layout": "sbhd"}, {"layout": "bhsd"}])
def test_jagged_nested_q_k_v_are_refused_naming_q(dtype, options):
    nt = _jagged(dtype=dtype)
    with pytest.raises(ConfigError, match=r"^q=.*nested.*must be a dense") as err:
        attention(nt, nt, nt, **options)
    assert err.value.field == "q"


@pytest.mark.parametrize("field", ["k", "v"])
def test_a_nested_k_or_v_with_a_dense_q_is_refused_naming_it(field):
    q, nt = _dense(), _jagged()
    tensors = {"q": q, "k": q, "v": q, field: nt}
    with pytest.raises(ConfigError, match=f"^{field}=.*must be a dense") as err:
        attention(tensors["q"], tensors["k"], tensors["v"])
    assert err.value.field == field


def test_nested_batches_leave_no_call_signature_behind():
    before = len(dispatcher.entries), len(dispatcher.by_call)
    for extra in range(4):  # each batch's ragged length is a new symbol: it was a new signature each time
        nt = _jagged(lengths=(3 + extra, 5))
        with pytest.raises(ConfigError):
            attention(nt, nt, nt)
    assert (len(dispatcher.entries), len(dispatcher.by_call)) == before


def test_config_from_tensors_refuses_nested_tensors_naming_q():
    nt = _jagged()
    with pytest.raises(ConfigError, match=r"^q=.*must be a dense"):
        config_from_tensors(nt, nt, nt)


def test_strided_nested_tensors_are_refused_by_the_checks():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's prototype warning for the strided nested layout
        nt = torch.nested.nested_tensor([torch.randn(3, 2, 8), torch.randn(5, 2, 8)]).to(torch.bfloat16)
    with pytest.raises(ConfigError, match=r"^q=.*nested.*must be a dense"):
        check_args(nt, nt, nt, NO_INPUTS, Arguments())


@pytest.mark.parametrize("make", [lambda t: t.to_sparse(), lambda t: t.to_mkldnn()], ids=["sparse", "mkldnn"])
def test_sparse_and_mkldnn_inputs_are_refused_naming_q(make):
    q = make(_dense(torch.float32))
    with pytest.raises(ConfigError, match=r"^q=.*must be a dense \(strided\) tensor") as err:
        attention(q, q, q)
    assert err.value.field == "q"
