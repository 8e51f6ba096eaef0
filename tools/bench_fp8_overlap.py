"""Whether overlapping the FP8 forward's quantization with its attention buys speed: GPU time of the
serial FP8 forward against a pipelined one, beside bf16 attention().

    python -m tools.bench_fp8_overlap [-o results.json]

The FP8 forward with bf16 output is memory passes around one compute-bound graph: an amax read of
q, k, v (current scaling), the cast, the FP8 graph, the pass of O back to bf16. The serial form runs
them in that order on one stream. The pipelined form splits the batch into chunks: the cast of
chunk c+1 runs on a side stream while the FP8 graph (built for the chunk's batch) runs chunk c, and
the pass back of chunk c runs on another side stream behind it. Scales are global (one amax pass
first), per chunk (each chunk's amax on the side stream too) or given (delayed scaling, no amax).
Each form is captured in a CUDA graph and replayed (no host time inside), so the figures are what
the GPU can do. The quantization kernels are runtime/fp8_kernels.py's Triton ones. Each pipelined
output with global or given scales is checked equal to the serial one's (per-chunk scales differ
by design). llama-3-8b heads (h32/8 d128), causal, bshd bf16; CUDA-event median of 40 replays (30
calls for bf16 attention(), on the shape's own plan, and the raw bf16 graph). Exit status 1 when
an output differed.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

SHAPES = ((2, 4096), (4, 4096), (2, 8192))
HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
CHUNKS = (2, 4)
SCALES = ("global", "per_chunk", "delayed")


def _graph_ms(torch: Any, fn: Callable[[], Any]) -> tuple[float, Any]:
    """(median ms of replaying fn captured in a CUDA graph, fn's output in the graph's memory)."""
    from tools.bench.tensors import cuda_times

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return statistics.median(cuda_times(torch, lambda _: graph.replay(), 40, 5)), out


def _fp8_graph(torch: Any, batch: int, seqlen: int) -> Callable[..., None]:
    """The FP8 forward graph (e4m3 in and out, scales as inputs) for `batch`, run on bshd tensors."""
    import cudnn

    from fusedattn_select.config import AttnConfig
    from fusedattn_select.probing import cudnn as probe
    from fusedattn_select.types import Backend, Phase, ProbeDepth

    cfg = AttnConfig(batch_size=batch, num_heads_q=HEADS_Q, num_heads_kv=HEADS_KV, seqlen_q=seqlen,
                     seqlen_kv=seqlen, head_dim_qk=HEAD_DIM, mask="causal", is_training=False,
                     qkv_layout="bshd_bshd_bshd", qkv_dtype="fp8_e4m3", o_dtype="fp8_e4m3", scaling_mode="delayed")
    handle = probe.handle_for(0)
    with probe.device_context(0):
        build = probe.build_graph(cfg, Backend.FP8, Phase.FORWARD, handle=handle, depth=ProbeDepth.FULL)
    cells = {name: torch.ones(build.dims_strides[name][0], dtype=torch.float32, device="cuda")
             for name in build.tensors if name not in ("q", "k", "v", "o")}
    workspace = torch.empty(max(1, build.workspace_size), dtype=torch.uint8, device="cuda")

    def run(q8: Any, k8: Any, v8: Any, o8: Any) -> None:
        pack = {build.tensors[name]: t for name, t in cells.items()}
        pack.update({build.tensors[name]: t.permute(0, 2, 1, 3) for name, t in zip("qkvo", (q8, k8, v8, o8))})
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        build.graph.execute(pack, workspace, handle=handle)
    return run


def _scales(torch: Any, xs: tuple, mode: str, given: Any) -> Any:
    from fusedattn_select.runtime import fp8_kernels as fk

    if mode == "delayed":
        return given
    return fk.pow2_scale_torch(fk.amax(list(xs)), fk.FP8_MAX[torch.float8_e4m3fn], fk.MAX_SCALE[torch.bfloat16])


def _serial(torch: Any, qkv: tuple, graph: Callable[..., None], mode: str, given: Any) -> Any:
    from fusedattn_select.runtime import fp8_kernels as fk

    e4 = torch.float8_e4m3fn
    scale = _scales(torch, qkv, mode, given)
    q8, k8, v8 = (fk.scaled_cast(x, scale[i:i + 1], e4) for i, x in enumerate(qkv))
    o8 = torch.empty(q8.shape, dtype=e4, device="cuda")
    graph(q8, k8, v8, o8)
    return fk.dequantize(o8, given, torch.bfloat16)


def _pipelined(torch: Any, qkv: tuple, graph: Callable[..., None], chunks: int, mode: str, given: Any,
               streams: tuple) -> list:
    from fusedattn_select.runtime import fp8_kernels as fk

    e4 = torch.float8_e4m3fn
    main, cast_stream, out_stream = torch.cuda.current_stream(), *streams
    step = qkv[0].shape[0] // chunks
    scale = _scales(torch, qkv, mode, given) if mode != "per_chunk" else None
    outs, held = [], []  # held: each chunk's FP8 O, alive until the join (its pass back reads it on a side stream)
    cast_stream.wait_stream(main)
    casts = []
    with torch.cuda.stream(cast_stream):
        for start in range(0, qkv[0].shape[0], step):
            part = tuple(x[start:start + step] for x in qkv)
            s = scale if scale is not None else _scales(torch, part, "global", given)
            part8 = [fk.scaled_cast(x, s[i:i + 1], e4) for i, x in enumerate(part)]
            done = torch.cuda.Event()
            done.record(cast_stream)
            casts.append((start, part8, done))
    for start, part8, done in casts:
        main.wait_event(done)
        o8 = torch.empty(part8[0].shape, dtype=e4, device="cuda")
        held.append(o8)
        graph(*part8, o8)
        ran = torch.cuda.Event()
        ran.record(main)
        out_stream.wait_event(ran)
        with torch.cuda.stream(out_stream):
            outs.append(fk.dequantize(o8, given, torch.bfloat16))
    main.wait_stream(out_stream)
    main.wait_stream(cast_stream)
    return outs


def _shape(torch: Any, batch: int, seqlen: int) -> tuple[dict, bool]:
    from fusedattn_select.config import AttnConfig
    from fusedattn_select.runtime.api import attention
    from fusedattn_select.runtime.run_settings import run_settings
    from fusedattn_select.types import Backend, Phase
    from tools.bench.raw_graph import graph_runner
    from tools.bench.tensors import cuda_times

    run_settings.replace(dense_builds="inline", dense_after=1)  # the shape's own plan at once

    q = torch.randn(batch, seqlen, HEADS_Q, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, seqlen, HEADS_KV, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    qkv, given = (q, k, v), torch.full((3,), 16.0, device="cuda")
    streams = (torch.cuda.Stream(priority=-1), torch.cuda.Stream(priority=-1))
    ms: dict[str, float] = {}
    for _ in range(3):
        attention(q, k, v, mask="causal")
    ms["bf16 attention()"] = statistics.median(cuda_times(torch, lambda _: attention(q, k, v, mask="causal"), 30, 5))
    raw = graph_runner(torch, AttnConfig(batch_size=batch, num_heads_q=HEADS_Q, num_heads_kv=HEADS_KV, seqlen_q=seqlen,
                                         seqlen_kv=seqlen, head_dim_qk=HEAD_DIM, mask="causal", is_training=False,
                                         qkv_layout="bshd_bshd_bshd", qkv_dtype="bf16"), Backend.F16, Phase.FORWARD)
    ms["bf16 raw cuDNN graph"] = statistics.median(cuda_times(torch, lambda _: raw(), 30, 5))
    full = _fp8_graph(torch, batch, seqlen)
    same = True
    for mode in SCALES:
        if mode != "per_chunk":  # unchunked, per-chunk scales are the global ones
            ms[f"serial, {mode} scales"], want = _graph_ms(torch, lambda: _serial(torch, qkv, full, mode, given))
        for chunks in CHUNKS:
            if batch % chunks:
                continue
            part = _fp8_graph(torch, batch // chunks, seqlen)
            name = f"pipelined x{chunks}, {mode} scales"
            ms[name], got = _graph_ms(torch, lambda: _pipelined(torch, qkv, part, chunks, mode, given, streams))
            if mode != "per_chunk" and not torch.equal(torch.cat(got), want):
                print(f"bench_fp8_overlap: {name} at b{batch} s{seqlen} differs from the serial output")
                same = False
    bf16 = ms["bf16 attention()"]
    return {name: {"ms": round(t, 4), "speedup_vs_bf16": round(bf16 / t, 3)} for name, t in ms.items()}, same


def main(argv: list[str] | None = None) -> int:
    from tools.bench.environment import emit, standalone_args, standalone_record, triton_missing

    args = standalone_args(__doc__, argv)
    import torch

    if triton_missing("bench_fp8_overlap"):
        return 1
    record: dict[str, Any] = dict(standalone_record(torch), shapes={})
    ok = True
    with torch.no_grad():
        for batch, seqlen in SHAPES:
            rows, same = _shape(torch, batch, seqlen)
            record["shapes"][f"b{batch} h{HEADS_Q}/{HEADS_KV} s{seqlen} d{HEAD_DIM} causal bshd"] = rows
            ok &= same
            torch.cuda.empty_cache()
    emit(record, args.output)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
