"""Depth verify's checks of dK, dBias and dSink under dropout on CPU (chunked_reference.row_term_moments,
tolerances.compare_under_dropout, as verify_checks.backward wires them): a kernel with its own mask, whose
backward reads the O its forward wrote (rounded to bf16) for the row term dO_i . O_i as cuDNN's does, passes
whatever the shape, down to one query row and one key, causal, GQA, a peaked softmax; planted wrong dKs that
the simulated band (0.5x-2x, the check verify ran before) accepted fail at the shapes named."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.probing.cudnn import tolerances  # noqa: E402
from fusedattn_select.reference import chunked_reference  # noqa: E402
from fusedattn_select.reference.chunked_reference import RefProblem  # noqa: E402
from dropout_kernels import Written, grad_out_of, kernel, problem  # noqa: E402

P = 0.1
ROUNDOFF = tolerances.roundoff("bf16")


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
