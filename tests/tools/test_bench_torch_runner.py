"""tools/bench_torch_runner.py on a machine without a GPU, and the shapes it measures."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime import fallback
from tools import bench_torch_runner


def test_without_a_device_it_says_so_and_fails(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert bench_torch_runner.main([]) == 1
    assert "no CUDA device" in capsys.readouterr().out


def test_its_shapes_lie_on_both_sides_of_the_bounds_the_runner_picks_by():
    sides = {fallback.small(torch.empty(b, h, s, d), torch.empty(b, h, s, d))
             for _, b, h, s, d in bench_torch_runner.SHAPES}
    assert sides == {True, False}
    for batch, seqlen in bench_torch_runner.ENCODERS:  # every encoder call is a small one
        shape = (batch, bench_torch_runner.HEADS, seqlen, bench_torch_runner.HEAD_DIM)
        assert fallback.small(torch.empty(shape), torch.empty(shape))
