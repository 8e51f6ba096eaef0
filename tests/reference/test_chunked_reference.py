"""The chunked reference (verify's forward and analytic backward, a chunk of query rows at a time)
computes what the autograd reference computes: output, log-sum-exp and every gradient."""

from __future__ import annotations

from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.reference import chunked_reference  # noqa: E402
from fusedattn_select.reference.autograd_reference import ReferenceOptions, ReferenceTensors, attend  # noqa: E402
from fusedattn_select.reference.semantics import alibi_slopes  # noqa: E402

B, HQ, HKV, SQ, SKV, D = 2, 4, 2, 19, 23, 8


class Case(NamedTuple):
    mask: str
    window: tuple[int, int]
    softmax: str
    bias: bool
    alibi: bool
    padding: bool


CASES = [
    Case("no_mask", (-1, -1), "vanilla", False, False, False),
    Case("causal", (-1, -1), "vanilla", True, False, True),
    Case("causal_bottom_right", (4, -1), "learnable", False, True, True),
    Case("no_mask", (3, 2), "off_by_one", True, False, False),
    Case("causal", (-1, -1), "learnable", True, True, False),
]


class Autograd(NamedTuple):
    """The autograd reference's results in float64: output, log-sum-exp, gradients by input name."""

    out: torch.Tensor
    lse: torch.Tensor
    grads: dict[str, torch.Tensor]


def _inputs(case: Case) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    inputs = {name: torch.randn(shape, generator=generator, dtype=torch.float64) for name, shape in (
        ("q", (B, HQ, SQ, D)), ("k", (B, HKV, SKV, D)), ("v", (B, HKV, SKV, D)), ("grad_out", (B, HQ, SQ, D)))}
    inputs["lens_q"] = torch.tensor([SQ, 7]) if case.padding else torch.full((B,), SQ)
    inputs["lens_kv"] = torch.tensor([SKV, 11]) if case.padding else torch.full((B,), SKV)
    if case.bias:
        inputs["bias"] = torch.randn((1, HQ, SQ, SKV), generator=generator, dtype=torch.float64)
    if case.alibi:
        inputs["alibi"] = torch.tensor(alibi_slopes(HQ), dtype=torch.float64)
    if case.softmax == "learnable":
        inputs["sink"] = torch.randn(HQ, generator=generator, dtype=torch.float64)
    return inputs


def _autograd(case: Case, inputs: dict[str, torch.Tensor]) -> Autograd:
    leaves = {name: inputs[name].clone().requires_grad_() for name in ("q", "k", "v", "bias", "sink")
              if name in inputs}
    mask = ("padding_" + case.mask if case.mask != "no_mask" else "padding") if case.padding else case.mask
    options = ReferenceOptions(mask=mask, window_size=case.window, softmax=case.softmax, return_lse=True,
                               compute_dtype=torch.float64)
    tensors = ReferenceTensors(bias=leaves.get("bias"), sink=leaves.get("sink"), alibi_slopes=inputs.get("alibi"),
                               seqlens_q=inputs["lens_q"] if case.padding else None,
                               seqlens_kv=inputs["lens_kv"] if case.padding else None)
    out, lse = attend(leaves["q"], leaves["k"], leaves["v"], options, tensors)
    (out * inputs["grad_out"]).sum().backward()
    return Autograd(out.detach(), lse.detach().squeeze(-1), {name: t.grad for name, t in leaves.items()})


def _problem(case: Case, inputs: dict[str, torch.Tensor]) -> chunked_reference.RefProblem:
    return chunked_reference.RefProblem(
        inputs["q"], inputs["k"], inputs["v"], inputs["lens_q"], inputs["lens_kv"], D ** -0.5,
        causal="causal" in case.mask, bottom_right=case.mask.endswith("bottom_right"), left=case.window[0],
        right=case.window[1], bias=inputs.get("bias"), alibi=inputs.get("alibi"), softmax=case.softmax,
        sink=inputs.get("sink"))


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(map(str, case)))
def test_chunked_forward_matches_the_autograd_output_and_log_sum_exp(monkeypatch, case):
    monkeypatch.setattr(chunked_reference, "CHUNK_ELEMENTS", 200)  # several chunks of query rows
    inputs = _inputs(case)
    want = _autograd(case, inputs)
    out, lse, rows_ok = chunked_reference.forward(_problem(case, inputs))
    rows = rows_ok.expand(want.out.shape[:3])
    assert rows.any()
    torch.testing.assert_close(out.double()[rows], want.out[rows], rtol=0, atol=1e-5)
    torch.testing.assert_close(lse.double()[rows], want.lse[rows], rtol=0, atol=1e-5)
    assert torch.equal(out[~rows], torch.zeros_like(out[~rows]))  # rows that see no key give 0


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(map(str, case)))
def test_chunked_backward_matches_the_autograd_gradients(monkeypatch, case):
    monkeypatch.setattr(chunked_reference, "CHUNK_ELEMENTS", 200)
    inputs = _inputs(case)
    want = _autograd(case, inputs)
    grads = chunked_reference.backward(_problem(case, inputs), inputs["grad_out"], bias_grad=case.bias)
    got = {"q": grads.dq, "k": grads.dk, "v": grads.dv, "bias": grads.dbias, "sink": grads.dsink}
    assert sorted(name for name, grad in got.items() if grad is not None) == sorted(want.grads)
    for name, grad in want.grads.items():
        torch.testing.assert_close(got[name].double(), grad, rtol=0, atol=1e-4, msg=lambda m, n=name: f"d{n}: {m}")
