"""A cudnn-frontend graph executed directly: the floor attention() is compared with."""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

# Output tensor names of the forward and backward graphs (zeroed, never synthesized inputs).
RAW_OUTPUTS = frozenset({"o", "stats", "dQ", "dK", "dV", "max_logit", "dBias", "dSink_token", "amax_s", "amax_o",
                         "amax_dP", "amax_dQ", "amax_dK", "amax_dV"})


class RawGraph:
    """One cudnn-frontend graph built with probing.cudnn.build_graph(depth=FULL), executed directly
    with preallocated tensors (no allocation, no lookup: the floor attention() is compared with)."""

    def __init__(self, torch: Any, cfg: Any, phase: Any, provided: Mapping[str, Any], *, kernel_cache: bool,
                 device_index: int = 0) -> None:
        import cudnn

        from fusedattn_select.probing import cudnn as probe
        from fusedattn_select.types import Backend, ProbeDepth
        self.torch = torch
        self.handle = probe.handle_for(device_index)
        cache = probe.kernel_cache_for(cfg, Backend.F16, phase, device_index) if kernel_cache else None
        started = time.perf_counter()
        with probe.device_context(device_index):
            self.build = probe.build_graph(cfg, Backend.F16, phase, handle=self.handle, depth=ProbeDepth.FULL,
                                           kernel_cache=cache)
        self.build_ms = (time.perf_counter() - started) * 1e3
        self.tensors: dict[str, Any] = {}
        self.copied: list[str] = []
        self.synthesized: list[str] = []
        for name in self.build.tensors:
            self.tensors[name] = self._bind(name, provided.get(name))
        self.pack = {self.build.tensors[n]: t for n, t in self.tensors.items()}
        self.workspace = torch.empty(max(1, int(self.build.workspace_size)), dtype=torch.uint8, device="cuda")
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)

    def _bind(self, name: str, t: Any) -> Any:
        """The tensor for graph tensor `name`: the provided one (copied to the graph's strides where
        they differ), else a new one: zeroed outputs, unit scales, zeroed synthesized inputs."""
        from fusedattn_select.dtypes import from_cudnn, torch_dtype

        torch = self.torch
        dims, strides = self.build.dims_strides[name]
        dtype = torch_dtype(from_cudnn(self.build.data_types[name]), torch)
        if t is not None:
            t = t.detach()
            if tuple(t.shape) != tuple(dims):
                raise ValueError(f"{name}: shape {tuple(t.shape)} but the graph declares {tuple(dims)}")
            if t.dtype != dtype:
                raise ValueError(f"{name}: dtype {t.dtype} but the graph declares {dtype}")
            if not all(n == 1 or a == b for n, a, b in zip(dims, t.stride(), strides)):
                copy = torch.empty_strided(dims, strides, dtype=dtype, device="cuda")
                copy.copy_(t)
                t = copy
                self.copied.append(name)
            return t
        t = torch.empty_strided(dims, strides, dtype=dtype, device="cuda")
        if name in RAW_OUTPUTS:
            t.zero_()
        elif name.startswith(("scale_", "descale_")):
            t.fill_(1.0)
        else:
            t.zero_()
            self.synthesized.append(name)
        return t

    def __call__(self, _: Any = None) -> None:
        self.build.graph.execute(self.pack, self.workspace, handle=self.handle)


def fp8_graph_config(cfg: Any) -> Any:
    """`cfg` as the FP8 graph the raw timings build: TransformerEngine's HYBRID recipe (e4m3 q, k, v
    and O; e5m2 dO and dQ/dK/dV when training), FP8 outputs, delayed scaling (scales as inputs)."""
    backward = {"do_dtype": "fp8_e5m2", "dqkv_dtype": "fp8_e5m2"} if cfg.is_training else {}
    return cfg.replace(qkv_dtype="fp8_e4m3", o_dtype="fp8_e4m3", scaling_mode="delayed", **backward)


def graph_runner(torch: Any, cfg: Any, backend: Any, phase: Any) -> Callable[[], None]:
    """The raw graph of `phase` for `backend` (F16 or FP8), bound to random inputs (normal(0, 1);
    unit scales), as a no-argument runner: the floor of attention() in that precision."""
    import cudnn

    from fusedattn_select.dtypes import from_cudnn, torch_dtype
    from fusedattn_select.probing import cudnn as probe
    from fusedattn_select.types import ProbeDepth

    handle = probe.handle_for(0)
    with probe.device_context(0):
        build = probe.build_graph(cfg, backend, phase, handle=handle, depth=ProbeDepth.FULL)
    tensors = {}
    for name in build.tensors:
        dims, strides = build.dims_strides[name]
        dtype = torch_dtype(from_cudnn(build.data_types[name]), torch)
        t = torch.empty_strided(dims, strides, dtype=torch.float32, device="cuda")
        if name.startswith(("scale", "descale")):
            t.fill_(1.0)
        elif name == "stats":
            t.fill_(5.0)
        else:
            t.normal_()
        tensors[build.tensors[name]] = t.to(dtype)
    workspace = torch.empty(max(1, build.workspace_size), dtype=torch.uint8, device="cuda")
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    return lambda: build.graph.execute(tensors, workspace, handle=handle)
