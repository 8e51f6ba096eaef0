"""Setup shared by the GPU tests that run torch on CUDA (import it first in a test module).

Importing it skips the importing module where torch or cudnn-frontend is missing; `GPU_MARKS` is
that module's `pytestmark` (marked `gpu`, skipped where torch has no CUDA device). Importable
because pytest puts each test's folder (no __init__.py) on sys.path.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cudnn")

CUDA = "cuda"
GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device"),
]


def assert_close(got, want, tol: float, what: str) -> None:
    """Max |got - want| within `tol` times the largest |want| (compared in float64)."""
    want = want.detach().double()
    scale = want.abs().max().item() or 1.0
    err = (got.detach().double() - want).abs().max().item()
    assert err <= tol * scale, f"{what}: max error {err:.4g} > {tol} x max |ref| {scale:.4g}"
