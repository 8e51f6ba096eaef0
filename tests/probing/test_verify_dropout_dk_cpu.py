"""Depth verify's checks of dK, dBias and dSink under dropout on CPU (chunked_reference.row_term_moments,
tolerances.compare_under_dropout, as verify_checks.backward wires them): a kernel with its own mask, whose
backward reads the O its forward wrote (rounded to bf16) for the row term dO_i . O_i as cuDNN's does, passes
whatever the shape, down to one query row and one key, causal, GQA, a peaked softmax; planted wrong dKs that
the simulated band (0.5x-2x, the check verify ran before) accepted fail at the shapes named."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.probing.cudnn import tolerances  # noqa: E402
from fusedattn_select.reference import chunked_reference  # noqa: E402
from fusedattn_select.reference.chunked_reference import RefProblem  # noqa: E402

P = 0.1
ROUNDOFF = tolerances.roundoff("bf16")


def problem(b: int, hq: int, hkv: int, sq: int, skv: int, d: int = 64, causal: bool = False, scale: float | None = None,
            bias: bool = False, sink: bool = False, seed: int = 0) -> RefProblem:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=generator)
    k, v = (torch.randn(b, hkv, skv, d, generator=generator) for _ in range(2))
    ref = RefProblem(q, k, v, torch.full((b,), sq), torch.full((b,), skv), d ** -0.5 if scale is None else scale,
                     causal=causal, dropout=P)
    if bias:
        ref.bias = torch.randn(1, hq, sq, skv, generator=generator)
    if sink:
        ref.softmax, ref.sink = "learnable", torch.randn(hq, generator=generator)
    return ref


def grad_out_of(ref: RefProblem) -> torch.Tensor:
    generator = torch.Generator().manual_seed(5)
    return torch.randn(ref.q.shape[:3] + (ref.v.shape[3],), generator=generator).to(torch.bfloat16).float()


@dataclass
class Written:
    """What a dropout kernel writes: O (its forward's), and its backward's dK, dBias, dSink (bf16 values)."""

    out: torch.Tensor
    dk: torch.Tensor
    dbias: torch.Tensor
    dsink: torch.Tensor


def kernel(ref: RefProblem, grad_out: torch.Tensor, seed: int, *, dropout: float = P, rescale: bool = True,
           row_term: str = "read", backward_seed: int | None = None) -> Written:
    """A kernel with its own mask (`seed`): O rounded to bf16, then the backward (under `backward_seed`'s mask where
    given), kept dP rescaled by 1/(1-p) (`rescale`), the row term from the O it reads ("read", as cuDNN) or from
    the dropout-free O ("plain": no dropout correction of the row term)."""
    forward = dataclasses.replace(ref, dropout=dropout, dropout_seed=seed)
    out = chunked_reference.forward(forward)[0].to(torch.bfloat16).float()
    backward = forward if backward_seed is None else dataclasses.replace(forward, dropout_seed=backward_seed)
    dk = torch.zeros(ref.k.shape)
    dbias = torch.zeros((1,) + ref.q.shape[1:3] + (ref.k.shape[2],))
    dsink = torch.zeros(ref.q.shape[1])
    for kv_head, heads, start, stop, chunk in chunked_reference._chunks(backward):
        q, v = ref.q[:, heads, start:stop], ref.v[:, kv_head].unsqueeze(1)
        d_o = grad_out[:, heads, start:stop]
        o = out[:, heads, start:stop].nan_to_num(0.0) if row_term == "read" else torch.matmul(chunk.p, v)
        row = (d_o * o).sum(-1, keepdim=True)
        keep = chunk.keep if rescale else chunk.keep * (1.0 - dropout)
        d_s = chunk.p * (torch.matmul(d_o, v.transpose(-1, -2)) * keep - row)
        dk[:, kv_head] += ref.scale * torch.matmul(d_s.transpose(-1, -2), q).sum(1)
        dbias[0, heads, start:stop] += d_s.sum(0)
        if ref.sink is not None:
            p_sink = torch.exp(ref.sink[heads].view(1, -1, 1) - chunk.lse)
            dsink[heads] -= (p_sink * row.squeeze(-1)).sum((0, 2))
    rounded = (t.to(torch.bfloat16).float() for t in (dk, dbias, dsink))
    return Written(out, *rounded)


class Verify:
    """The dropout-free reference and moments of one problem, and verify's checks of a kernel's results."""

    def __init__(self, ref: RefProblem) -> None:
        self.ref, self.grad_out = ref, grad_out_of(ref)
        self.want = chunked_reference.backward(ref, self.grad_out, bias_grad=ref.bias is not None)

    def checks(self, written: Written) -> dict[str, tolerances.Check]:
        terms = chunked_reference.row_term_moments(self.ref, self.grad_out, self.want, written.out)
        found = {"dK": tolerances.compare_under_dropout("dK", written.dk.double() - terms.dk_shift, self.want.dk,
                                                        terms.dk, P, ROUNDOFF)}
        if terms.dbias is not None:
            found["dBias"] = tolerances.compare_under_dropout("dBias", written.dbias.double() - terms.dbias_shift,
                                                              self.want.dbias, terms.dbias, P, ROUNDOFF)
        if terms.dsink_shift is not None:
            found["dSink"] = tolerances.compare("dSink", written.dsink, self.want.dsink.double() + terms.dsink_shift,
                                                tolerances.tolerance("bf16", self.ref.q.shape[-1], "gradient"))
        return found

    def band(self, written: Written) -> tolerances.Check:
        """The check dK had before (a simulated dropout's error, 0.5x-2x), as verify ran it."""
        sample = chunked_reference.backward(dataclasses.replace(self.ref, dropout_seed=1235), self.grad_out)
        tol = tolerances.tolerance("bf16", self.ref.q.shape[-1], "gradient")
        got, want, noise_of = written.dk.float(), self.want.dk.float(), sample.dk.float()
        norm = max(float(want.norm()), 1e-6)
        error, noise = float((got - want).norm()) / norm, float((noise_of - want).norm()) / norm
        return tolerances.Check("dK", error, tol, 0.5 * noise <= error <= 2.0 * noise + tol)


# (b, Hq, Hkv, Sq, Skv, options): one query row or one key, causal, GQA and MQA, a peaked softmax
SMALL = [(1, 1, 1, 1, 1, {}), (1, 1, 1, 1, 8, {}), (1, 1, 1, 8, 1, {}), (1, 2, 2, 4, 16, {}),
         (1, 1, 1, 3, 2, {"causal": True}), (1, 4, 2, 8, 8, {"causal": True}), (2, 4, 1, 5, 7, {}),
         (1, 2, 2, 16, 16, {"scale": 1.0}), (1, 2, 1, 16, 16, {"scale": 1.0, "causal": True}),
         (1, 2, 2, 6, 9, {"bias": True}), (2, 2, 1, 6, 6, {"sink": True, "causal": True})]


@pytest.mark.parametrize("shape", SMALL, ids=lambda s: "x".join(map(str, s[:5])) + "".join(sorted(s[5])))
def test_right_kernels_pass_at_small_shapes(shape):
    verify = Verify(problem(*shape[:5], **shape[5]))
    for seed in range(100):
        checks = verify.checks(kernel(verify.ref, verify.grad_out, seed))
        assert all(c.passed for c in checks.values()), (seed, [c.describe() for c in checks.values()])


@pytest.mark.parametrize("options", [{}, {"causal": True}, {"scale": 1.0, "causal": True}, {"bias": True},
                                     {"sink": True}], ids=lambda o: "-".join(sorted(o)) or "plain")
def test_right_kernels_pass_at_a_probe_shape(options):
    verify = Verify(problem(1, 4, 2, 128, 128, **options))
    for seed in range(3):
        checks = verify.checks(kernel(verify.ref, verify.grad_out, seed))
        assert all(c.passed for c in checks.values()), [c.describe() for c in checks.values()]
        if "scale" not in options:  # the statistic is tight: a right dK sits near dropout's expected distance
            assert abs(checks["dK"].error - 1.0) < 0.15, checks["dK"].describe()


def test_the_row_term_shift_is_what_makes_a_right_dk_pass():
    # Without the shift (compared with the dropout-free dK as for dV) a right dK strays at a peaked softmax.
    verify = Verify(problem(1, 4, 4, 128, 128, causal=True, scale=1.0))
    written = kernel(verify.ref, verify.grad_out, 3)
    terms = chunked_reference.row_term_moments(verify.ref, verify.grad_out, verify.want, written.out)
    assert verify.checks(written)["dK"].passed
    assert not tolerances.compare_under_dropout("dK", written.dk, verify.want.dk, terms.dk, P, ROUNDOFF).passed


WRONG = {  # name: (shape, kernel options); each one the band accepted (asserted below)
    "run at p=0.25 for 0.1": ((1, 4, 4, 256, 256, {}), {"dropout": 0.25}),
    "run at p=0.25 for 0.1, GQA": ((2, 8, 2, 512, 512, {"causal": True}), {"dropout": 0.25}),
    "kept dP not rescaled by 1/(1-p)": ((2, 8, 8, 512, 512, {"causal": True}), {"rescale": False}),
    "dK from another mask than O's": ((2, 8, 8, 512, 512, {"causal": True, "scale": 0.75}), {"backward_seed": 77}),
    "row term without dropout's correction": ((2, 8, 8, 512, 512, {"causal": True, "scale": 0.5}),
                                              {"row_term": "plain"}),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_dks_the_band_accepted_fail(name):
    (b, hq, hkv, sq, skv, options), planted = WRONG[name]
    verify = Verify(problem(b, hq, hkv, sq, skv, **options))
    wrong = kernel(verify.ref, verify.grad_out, 7, **planted)
    # (with backward_seed the plant's dK is another mask's whole backward, its row term from that mask's O)
    if "backward_seed" in planted:
        other = kernel(verify.ref, verify.grad_out, planted["backward_seed"])
        wrong = dataclasses.replace(wrong, dk=other.dk)
    assert verify.band(wrong).passed, verify.band(wrong).describe()
    assert not verify.checks(wrong)["dK"].passed, verify.checks(wrong)["dK"].describe()
    assert verify.checks(kernel(verify.ref, verify.grad_out, 7))["dK"].passed  # the right kernel, same mask


def test_a_dk_scaled_by_1_minus_p_fails():
    verify = Verify(problem(2, 8, 8, 512, 512, causal=True))
    right = kernel(verify.ref, verify.grad_out, 7)
    wrong = dataclasses.replace(right, dk=(right.dk * (1.0 - P)).to(torch.bfloat16).float())
    assert verify.band(wrong).passed
    check = verify.checks(wrong)["dK"]
    assert not check.passed and check.scale[0] < -0.05, check.describe()


def test_wrong_dbias_and_dsink_fail():
    verify = Verify(problem(1, 4, 4, 128, 128, bias=True))
    wrong = kernel(verify.ref, verify.grad_out, 7, dropout=0.25)
    right = kernel(verify.ref, verify.grad_out, 7)
    assert not verify.checks(dataclasses.replace(right, dbias=wrong.dbias))["dBias"].passed
    sinks = Verify(problem(1, 4, 4, 128, 128, sink=True))
    right = kernel(sinks.ref, sinks.grad_out, 7)
    plain = kernel(sinks.ref, sinks.grad_out, 7, row_term="plain")  # dSink from the dropout-free row terms
    assert sinks.checks(right)["dSink"].passed
    assert not sinks.checks(dataclasses.replace(right, dsink=plain.dsink))["dSink"].passed


def test_a_not_finite_dk_fails_and_rows_without_keys_are_left_out():
    ref = problem(1, 2, 2, 8, 4, causal=True)
    ref.bottom_right = True  # rows 0-3 see no key: their O may hold NaN, their P is 0
    verify = Verify(ref)
    written = kernel(ref, verify.grad_out, 2)
    written.out[:, :, :4] = float("nan")
    assert verify.checks(written)["dK"].passed, verify.checks(written)["dK"].describe()
    written.dk[0, 0, 0, 0] = float("inf")
    assert not verify.checks(written)["dK"].passed
