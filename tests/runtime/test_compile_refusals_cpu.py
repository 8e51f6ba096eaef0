"""Refusals of attention() alike in eager mode and under torch.compile: a bad argument under
fullgraph=True names its field and allowed values; ALiBi slopes that require grad are refused on every
path (no path gives them a gradient), slopes that do not still run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.config import MASKS  # noqa: E402
from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.runtime.api import attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_platform")

SLOPES = (0.5, 0.25, 0.125, 0.0625)


def _qkv(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, s, h, 8, generator=gen).requires_grad_() for s, h in ((5, 4), (7, 2), (7, 2)))


def _compiled(fn, fullgraph=True):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=fullgraph, backend="aot_eager")


# What dynamo reports under fullgraph=True for an exception it traced: its arguments, from torch 2.13.
SHOWS_RAISED = pytest.mark.skipif(tuple(int(n) for n in torch.__version__.split(".")[:2]) < (2, 13),
                                  reason="dynamo before 2.13 (2.4-2.6 tried) does not show a raised exception")


@SHOWS_RAISED
def test_fullgraph_bad_argument_names_the_field_and_allowed_values():
    compiled = _compiled(lambda q, k, v: attention(q, k, v, mask="bogus"))
    with pytest.raises(Exception) as caught:
        compiled(*_qkv())
    text = str(caught.value)
    assert "ConfigError('mask', 'bogus'," in text
    assert all(repr(mask) in text for mask in MASKS), text


def _call_slopes(slopes, compiled):
    def layer(q, k, v, s):
        return attention(q, k, v, mask="causal", alibi_slopes=s)

    return (_compiled(layer, fullgraph=False) if compiled else layer)(*_qkv(), slopes)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_trainable_alibi_slopes_are_refused(compiled):
    fine = _call_slopes(torch.tensor(SLOPES), compiled)  # decided first: the refusal must not be skipped
    assert fine.shape == (2, 5, 4, 8) and fine.requires_grad
    with pytest.raises(ConfigError) as caught:
        _call_slopes(torch.tensor(SLOPES, requires_grad=True), compiled)
    assert caught.value.field == "alibi_slopes" and "detach" in caught.value.allowed


@SHOWS_RAISED
def test_trainable_alibi_slopes_are_refused_under_fullgraph():
    compiled = _compiled(lambda q, k, v, s: attention(q, k, v, alibi_slopes=s))
    with pytest.raises(Exception, match=r"ConfigError\('alibi_slopes', 'requires_grad=True'"):
        compiled(*_qkv(), torch.tensor(SLOPES, requires_grad=True))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_slopes_that_take_no_gradient_still_run(compiled):
    want = _call_slopes(torch.tensor(SLOPES), False)
    torch.testing.assert_close(_call_slopes(torch.tensor(SLOPES), compiled), want)
    with torch.no_grad():  # asked for no gradient: nothing is dropped
        torch.testing.assert_close(_call_slopes(torch.tensor(SLOPES, requires_grad=True), compiled), want)
    torch.testing.assert_close(_call_slopes(torch.tensor(SLOPES, requires_grad=True).detach(), compiled), want)
