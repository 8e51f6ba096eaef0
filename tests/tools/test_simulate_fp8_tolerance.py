"""tools/simulate_fp8_tolerance.py: the simulated FP8 forward rounds (its error is not zero) and stays
inside the tolerance depth verify applies, with room to spare; a wrong output does not."""

from __future__ import annotations

import pytest

from fusedattn_select.probing.cudnn import tolerances

torch = pytest.importorskip("torch")
simulate = pytest.importorskip("tools.simulate_fp8_tolerance")


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_simulated_fp8_forward_is_well_inside_the_tolerance(dtype, causal):
    error = simulate.relative_error(dtype, 64, 128, causal, batch=1, heads=2)
    assert 0.0 < error < tolerances.fp8_tolerance(dtype, dtype) / 2
