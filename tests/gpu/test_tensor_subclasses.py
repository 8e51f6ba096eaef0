"""A DTensor on a real GPU (one rank's mesh): attention() runs it by torch SDPA through DTensor's own
dispatch and returns a DTensor, with torch SDPA's output and gradients; cuDNN would read its data pointer,
which is 0. A plain call of the same shape afterwards still runs fused."""

from __future__ import annotations

import pytest
from gpu_setup import CUDA, GPU_MARKS, assert_close, torch

from fusedattn_select.runtime.api import attention, dispatch_info  # noqa: E402

pytestmark = GPU_MARKS


@pytest.fixture
def mesh(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield init_device_mesh("cuda", (1,))
    dist.destroy_process_group()


def test_a_dtensor_runs_through_its_dispatch_and_plain_calls_stay_fused(mesh, use_settings):
    use_settings(first_calls="wait")  # the plain call below is decided, and runs cuDNN, at once
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    gen = torch.Generator(device=CUDA).manual_seed(0)
    plain = [torch.randn(2, 256, 8, 64, generator=gen, device=CUDA, dtype=torch.bfloat16) for _ in range(3)]
    sharded = [distribute_tensor(t, mesh, [Shard(2)]).requires_grad_() for t in plain]  # by heads, as TP shards
    before = dispatch_info()
    out = attention(*sharded, mask="causal")
    assert isinstance(out, DTensor)
    assert dispatch_info()["fallback_calls"] == before["fallback_calls"] + 1
    leaves = [t.clone().requires_grad_() for t in plain]
    want = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves),
                                                            is_causal=True).transpose(1, 2)
    assert_close(out.full_tensor(), want, 2e-2, "out")
    grad = torch.randn_like(want)
    got = torch.autograd.grad(out, sharded, distribute_tensor(grad, mesh, [Shard(2)]))
    for name, g, expected in zip("qkv", got, torch.autograd.grad(want, leaves, grad)):
        assert_close(g.full_tensor(), expected, 4e-2, "d" + name)
    fused = dispatch_info()["fused_calls"]
    assert_close(attention(*plain, mask="causal"), want, 2e-2, "the plain call")
    assert dispatch_info()["fused_calls"] == fused + 1, "the plain call of the DTensor's shape fell back"
