"""Tensors for the measurements: random q, k, v in a layout, views, CUDA-event timing, errors.

torch is passed in by the caller, and the library's torch-side modules are imported inside the
functions: importing this module imports no GPU stack.
"""

from __future__ import annotations

from typing import Any, Callable


def qkv(torch: Any, cfg: Any, layout: str, requires_grad: bool, dtype: Any = None) -> tuple:
    """Random q, k, v for `cfg` in the dim order of `layout` (normal(0, 1); never zeros)."""
    from fusedattn_select.dtypes import torch_dtype
    from fusedattn_select.runtime.tensor_layouts import FROM_BHSD

    dtype = dtype or torch_dtype(cfg.qkv_dtype, torch)
    dims = {
        "q": (cfg.batch_size, cfg.num_heads_q, cfg.seqlen_q, cfg.head_dim_qk),
        "k": (cfg.batch_size, cfg.num_heads_kv, cfg.seqlen_kv, cfg.head_dim_qk),
        "v": (cfg.batch_size, cfg.num_heads_kv, cfg.seqlen_kv, cfg.resolved_head_dim_v),
    }
    order = FROM_BHSD[layout]
    out = []
    for name in ("q", "k", "v"):
        shape = tuple(dims[name][i] for i in order)
        out.append(torch.randn(shape, device="cuda", dtype=dtype).requires_grad_(requires_grad))
    return tuple(out)


def to_bhsd(t: Any, layout: str) -> Any:
    """The logical (B, H, S, D) view of a tensor in `layout`'s dim order."""
    from fusedattn_select.runtime.tensor_layouts import bhsd

    return bhsd(t, layout)


def from_layout(grad: Any, layout: str, like: Any) -> Any:
    """The output gradient given in the caller's layout, as the BHSD view SDPA returns."""
    g = to_bhsd(grad, layout)
    return g if tuple(g.shape) == tuple(like.shape) else g.reshape(like.shape)


def cuda_times(torch: Any, fn: Callable[[Any], Any], reps: int, warmup: int,
               setup: Callable[[], Any] | None = None) -> list[float]:
    """ms per call of fn(setup()) with CUDA events around fn only (setup is not timed)."""
    for _ in range(warmup):
        fn(setup() if setup else None)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    keep = []
    for i in range(reps):
        arg = setup() if setup else None
        starts[i].record()
        keep.append(fn(arg))
        ends[i].record()
        if len(keep) > 2:
            keep.pop(0)
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def kernel_profile(torch: Any, fn: Callable[[Any], Any], reps: int) -> dict[str, float]:
    """GPU ms per call of fn(None) by kernel name: the durations of the kernels, copies and fills it
    launched (torch.profiler, CUDA activity), without the gaps where the GPU waited for the host."""
    from torch.profiler import ProfilerActivity, profile

    fn(None)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn(None)
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    by_name: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == cuda:
            by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us() / reps / 1e3
    return by_name


def rel_err(a: Any, b: Any) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def cosine(a: Any, b: Any) -> float:
    """The cosine similarity of two tensors taken as vectors."""
    a, b = a.float().flatten(), b.float().flatten()
    return float((a @ b) / (a.norm() * b.norm()).clamp_min(1e-30))
