"""What the SDPA drop-in tests share: torch's own function, and a fixture that leaves no routing behind."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
sdpa = pytest.importorskip("fusedattn_select.integrations.sdpa")

F = torch.nn.functional
TORCH_SDPA = F.scaled_dot_product_attention  # what torch has before any test routes it


@pytest.fixture(autouse=True)
def torch_attribute_restored():
    """Each test starts and ends with torch's own function and no routing state left behind."""
    assert not sdpa.is_installed()
    yield
    sdpa.uninstall()
    F.scaled_dot_product_attention = TORCH_SDPA
