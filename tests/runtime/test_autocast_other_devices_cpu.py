"""attention() inside an autocast region with tensors of a device type autocast has no region for (meta
tensors, as shape-only passes over a model make them): nothing is cast, as torch's SDPA casts nothing there.
Asking torch whether autocast is on for such a device raises RuntimeError ("unknown device type for
autocast"), which attention() used to let through."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from fusedattn_select.runtime.api import attention  # noqa: E402
from fusedattn_select.runtime.args import autocast_inputs  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_platform")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_meta_tensors_inside_a_cpu_autocast_region_run_uncast_as_in_torch_sdpa(dtype):
    q = torch.empty(2, 5, 4, 8, dtype=dtype, device="meta")
    k = torch.empty(2, 7, 2, 8, dtype=dtype, device="meta")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention(q, k, k, mask="causal")
        want = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2),
                                              is_causal=True, enable_gqa=True).transpose(1, 2)
    assert out.device.type == "meta"
    assert (out.shape, out.dtype) == (want.shape, want.dtype)


def test_autocast_inputs_leaves_meta_tensors_as_they_are():
    q = torch.empty(1, 2, 1, 8, device="meta")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = autocast_inputs(q, q, q)
    assert all(t is q for t in cast)
