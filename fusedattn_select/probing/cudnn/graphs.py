"""The cuDNN frontend graphs of one attention problem, built without device memory or kernels.

`build_graph(cfg, backend, phase, handle=..., depth=...)` translates an AttnConfig into the
cudnn-frontend SDPA graph that runs it and takes that graph through cuDNN's build steps:

    graph_api               the Python graph is described (tensors, SDPA operation, outputs)
    validate                the frontend checks the description (e.g. "hidden_dim should be multiple of 8")
    build_operation_graph   the backend operation graph is created
    create_execution_plans  cuDNN's heuristics (modes A, then FALLBACK) list engine configs
    check_support           the first plan is asked whether it supports the graph
    build_plans             (ProbeDepth.FULL only) kernels are compiled: ~300-600 ms cold (H200)

The probing engine (probing/cudnn.py) runs it to answer "is this supported"; dispatch runs it with
ProbeDepth.FULL and then executes `GraphBuild.graph` with device pointers bound to
`GraphBuild.tensors`. Every AttnConfig field that changes the graph is taken as given: logical
dims are (batch, heads, seqlen, head_dim) and the physical layout is expressed only through strides
computed from qkv_layout, o_format, do_format and dqkv_layout (design.md section 7).

The frontend's API differs across the supported versions (1.28 .. 1.32). Arguments are chosen by
feature detection on the installed frontend (`frontend_features()`), never by version string; a
config field the installed frontend has no argument for raises CudnnUnsupported at stage
"graph_api", naming the field and the frontend version.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError, FusedAttnSelectError, ProbeError
from fusedattn_select.layouts import LAYOUTS, format_strides
from fusedattn_select.probing.cudnn.messages import (
    backend_decline,
    clean_message,
    is_incident,
)
from fusedattn_select.types import Backend, Phase, ProbeDepth

STAGES = (
    "graph_api", "validate", "build_operation_graph", "create_execution_plans", "check_support",
    "build_plans",
)

# Exception types cudnn-frontend raises when it rejects a graph description or finds no engine for
# it (its "not supported" family). Everything else -- and any text that describes a device or
# environment incident -- is a ProbeFailure.
_VERDICT_EXCEPTIONS: tuple[type[BaseException], ...] = (RuntimeError, ValueError, NotImplementedError)


class _StageOutcome:
    """The fields of CudnnUnsupported and ProbeFailure (a mixin ahead of their exception base).

    `stage` is one of STAGES; `message` is one cleaned line; `detail` the full original text;
    `timings_ms` the stages that ran before the rejection or failure, in milliseconds. The
    exception text is "<_summary> at <stage>: <message>".
    """

    _summary = ""

    def __init__(self, stage: str, message: str, detail: str = "",
                 timings_ms: Mapping[str, float] | None = None) -> None:
        self.stage = stage
        self.message = message
        self.detail = detail or message
        self.timings_ms = dict(timings_ms or {})
        super().__init__(f"{self._summary} at {stage}: {message}")


class CudnnUnsupported(_StageOutcome, FusedAttnSelectError):
    """cuDNN (or the frontend's graph API) cannot run this problem: a cacheable verdict.

    Fields: see _StageOutcome (stage, message, detail, timings_ms).
    """

    _summary = "not supported"


class ProbeFailure(_StageOutcome, ProbeError):
    """Building the graph failed for a reason that says nothing about support (out of memory, a
    CUDA or driver error, a missing module, an unexpected exception). Never cached.

    Fields: see _StageOutcome (stage, message, detail, timings_ms).
    """

    _summary = "probe failed"


@dataclass
class GraphBuild:
    """One built cuDNN graph and how to bind it.

    graph          the cudnn-frontend graph (cudnn.pygraph); after ProbeDepth.FULL it is ready to
                   execute: ``graph.execute({tensors[name]: device_pointer_or_tensor, ...},
                   workspace, handle=handle)``.
    tensors        graph tensors by stable name; only those the graph has. Inputs: "q", "k", "v"
                   (for paged KV: the page containers), "o", "dO", "stats" (backward), "bias",
                   "seq_len_q", "seq_len_kv" (int32 (B,1,1,1)), "ragged_offset_q",
                   "ragged_offset_kv", "ragged_offset_o" (int32 (B+1,1,1,1), element offsets of
                   each sequence's first token), "page_table_k", "page_table_v", "seed", "offset"
                   (int64 (1,1,1,1)), "sink_token" (float32 (1,H,1,1); for softmax="off_by_one"
                   bind zeros), FP8 "descale_*"/"scale_*" (float32 (1,1,1,1); bind 1.0 for a
                   scale whose tensor is not FP8). Outputs: "o", "stats", "max_logit", "dQ",
                   "dK", "dV", "dBias", "dSink_token", FP8 "amax_*".
                   A ragged tensor whose token stride differs from the first tensor of its
                   sequence axis gets its own offsets, named "ragged_offset_<tensor>" (e.g.
                   "ragged_offset_v" when V is a separate THD tensor with head_dim_v != head_dim_qk,
                   "ragged_offset_dQ" when dqkv_layout packs differently from qkv_layout).
                   MXFP8 adds "q_T", "k_T", "dO_T", "o_f16", "dO_f16" and their "descale_*" block
                   scales.
    dims_strides   (dims, strides) of every tensor in `tensors`, read back from the graph.
    data_types     cudnn.data_type of every tensor in `tensors`.
    options        the non-tensor arguments given to the SDPA operation (attn_scale, masks,
                   diagonal alignment and bounds, dropout probability, generate_stats,
                   use_deterministic_algorithm, ...): what the graph was asked to compute.
    operation      "sdpa", "sdpa_backward", "sdpa_fp8", "sdpa_fp8_backward", "sdpa_mxfp8" or
                   "sdpa_mxfp8_backward".
    workspace_size bytes of workspace the built plan needs (ProbeDepth.FAST: 0, nothing is built).
    timings_ms     milliseconds per stage, in the order run.
    dynamic_shapes whether the graph was built with is_dynamic_shape_enabled (and a kernel cache).
    plan_name      the engine config that was built (ProbeDepth.FULL, when the frontend says).
    note           why a kernel cache was given but the graph was built without dynamic shapes.
    """

    graph: Any
    tensors: dict[str, Any]
    dims_strides: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
    data_types: dict[str, Any]
    options: dict[str, Any]
    operation: str
    depth: ProbeDepth
    workspace_size: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)
    dynamic_shapes: bool = False
    plan_name: str = ""
    note: str = ""


# ----- feature detection ---------------------------------------------------------------------
_OPERATIONS = ("sdpa", "sdpa_backward", "sdpa_fp8", "sdpa_fp8_backward", "sdpa_mxfp8", "sdpa_mxfp8_backward")
_SIGNATURE_NAME = re.compile(r"[(,]\s*(\w+)\s*:")


@dataclass(frozen=True)
class FrontendFeatures:
    """What the installed cudnn-frontend can express, found by inspecting its API.

    `operations` maps each SDPA operation the frontend has to the keyword arguments it accepts.
    Frontend 1.27+ wraps the compiled graph in a pure-Python `pygraph` whose SDPA builders take
    **kwargs and forward them to the compiled `backend_graph` method, so the accepted names come
    from the compiled method's signature; older frontends expose the compiled signature directly.
    """

    version: str
    operations: Mapping[str, frozenset[str]]
    graph_arguments: frozenset[str]
    has_kernel_cache: bool
    data_types: frozenset[str]
    reorderings: frozenset[str]

    def has(self, operation: str) -> bool:
        return operation in self.operations

    def accepts(self, operation: str, argument: str) -> bool:
        return argument in self.operations.get(operation, frozenset())

    @property
    def dynamic_shapes(self) -> bool:
        """Dynamic shapes with a kernel cache: a new batch size or sequence length of a problem
        class reuses the compiled kernels (a few ms instead of hundreds)."""
        return self.has_kernel_cache and {"is_dynamic_shape_enabled", "kernel_cache"} <= self.graph_arguments

    def describe(self) -> dict[str, object]:
        return {
            "version": self.version,
            "operations": {op: sorted(args) for op, args in sorted(self.operations.items())},
            "graph_arguments": sorted(self.graph_arguments),
            "dynamic_shapes": self.dynamic_shapes,
        }


def _signature_names(function: Any) -> frozenset[str] | None:
    """Keyword names of a Python callable; None when it only takes **kwargs (a forwarding shim)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    names = {
        p.name for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    }
    forwards = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    if forwards and not names - {"name", "compute_data_type", "out_dims"}:
        return None
    return frozenset(names)


def _docstring_names(function: Any, operation: str) -> frozenset[str] | None:
    """Keyword names of a compiled (pybind11) method, from its signature line(s)."""
    doc = getattr(function, "__doc__", None) or ""
    names: set[str] = set()
    for line in doc.splitlines():
        line = re.sub(r"^\s*\d+\.\s*", "", line)
        if line.startswith(operation + "(") and "->" in line:
            names.update(_SIGNATURE_NAME.findall(line[len(operation):line.rindex("->")]))
    names.discard("self")
    return frozenset(names) or None


def _compiled_graph_classes(cudnn: Any) -> list[Any]:
    module = getattr(cudnn, "_pybind_module", None) or getattr(cudnn, "_compiled_module", None)
    classes = [getattr(module, name) for name in ("backend_graph", "pygraph") if hasattr(module, name)]
    return classes + [cudnn.pygraph]


@functools.lru_cache(maxsize=None)
def frontend_features() -> FrontendFeatures:
    """Inspect the installed cudnn-frontend once per process."""
    import cudnn

    operations: dict[str, frozenset[str]] = {}
    for op in _OPERATIONS:
        if not hasattr(cudnn.pygraph, op):
            continue
        names = _signature_names(getattr(cudnn.pygraph, op))
        if names is None:
            for cls in _compiled_graph_classes(cudnn):
                method = getattr(cls, op, None)
                if method is not None:
                    names = _docstring_names(method, op) or _signature_names(method)
                    if names:
                        break
        operations[op] = names or frozenset()
    graph_arguments = _signature_names(cudnn.pygraph.__init__)
    if graph_arguments is None:
        for cls in _compiled_graph_classes(cudnn):
            graph_arguments = _docstring_names(cls.__init__, "__init__")
            if graph_arguments:
                break
    return FrontendFeatures(
        version=str(getattr(cudnn, "__version__", "unknown")),
        operations=operations,
        graph_arguments=frozenset(graph_arguments or ()),
        has_kernel_cache=hasattr(cudnn, "create_kernel_cache"),
        data_types=frozenset(cudnn.data_type.__members__),
        reorderings=frozenset(getattr(getattr(cudnn, "tensor_reordering", None), "__members__", {})),
    )


# ----- layouts -------------------------------------------------------------------------------
def _q_packing(layout_name: str) -> str | None:
    packing = LAYOUTS[layout_name].packing
    return packing if packing in ("3hd", "h3d") else None


def _kv_packing(layout_name: str) -> str | None:
    return LAYOUTS[layout_name].packing


def _row_major(dims: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for extent in reversed(dims):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


_DTYPES = {"fp16": "HALF", "bf16": "BFLOAT16", "fp8_e4m3": "FP8_E4M3", "fp8_e5m2": "FP8_E5M2"}
_SCALAR = (1, 1, 1, 1)


# ----- the graph description -----------------------------------------------------------------
class _Description:
    """Builds the tensors and SDPA arguments of one graph, keeping names, dims and strides."""

    def __init__(self, cudnn: Any, graph: Any, cfg: AttnConfig, features: FrontendFeatures, operation: str):
        self.cudnn = cudnn
        self.graph = graph
        self.cfg = cfg
        self.features = features
        self.operation = operation
        self.tensors: dict[str, Any] = {}
        self._offsets: dict[tuple[str, int], Any] = {}
        self._offset_names: set[str] = set()

    # -- errors naming the field the frontend cannot express --
    def unsupported(self, field_name: str, value: object, why: str) -> CudnnUnsupported:
        message = f"{field_name}={value!r}: {why} (cudnn-frontend {self.features.version})"
        return CudnnUnsupported("graph_api", message, message)

    def require(self, argument: str, field_name: str, value: object, operation: str | None = None) -> None:
        op = operation or self.operation
        if not self.features.accepts(op, argument):
            raise self.unsupported(field_name, value, f"{op}() has no '{argument}' argument")

    def dtype(self, name: str) -> Any:
        return getattr(self.cudnn.data_type, _DTYPES.get(name, name))

    # -- tensors --
    def input(self, name: str, dims: tuple[int, ...], strides: tuple[int, ...] | None = None,
              dtype: Any = None, **extra: Any) -> Any:
        strides = _row_major(dims) if strides is None else strides
        tensor = self.graph.tensor(name=name, dim=list(dims), stride=list(strides),
                                   data_type=dtype if dtype is not None else self.dtype(self.cfg.qkv_dtype),
                                   **extra)
        self.tensors[name] = tensor
        return tensor

    def scalar(self, name: str, dtype: str = "FLOAT") -> Any:
        return self.input(name, _SCALAR, _SCALAR, getattr(self.cudnn.data_type, dtype))

    def output(self, name: str, tensor: Any, dims: tuple[int, ...], strides: tuple[int, ...] | None,
               dtype: Any) -> Any:
        if tensor is None:
            raise CudnnUnsupported(
                "graph_api", f"{self.operation}() returned no '{name}' output",
                f"{self.operation}() returned no '{name}' output (cudnn-frontend {self.features.version})",
            )
        strides = _row_major(dims) if strides is None else strides
        tensor.set_output(True).set_dim(list(dims)).set_stride(list(strides)).set_data_type(dtype)
        if hasattr(tensor, "set_name"):
            tensor.set_name(name)
        self.tensors[name] = tensor
        return tensor

    def ragged(self, tensor: Any, name: str, axis: str, token_stride: int) -> None:
        """Attach element offsets of each sequence: one offset tensor per (axis, token stride)."""
        key = (axis, token_stride)
        offsets = self._offsets.get(key)
        if offsets is None:
            base = f"ragged_offset_{axis}"
            offset_name = base if base not in self._offset_names else f"ragged_offset_{name}"
            offsets = self.input(offset_name, (self.cfg.batch_size + 1, 1, 1, 1), _SCALAR,
                                 self.cudnn.data_type.INT32)
            self._offsets[key] = offsets
            self._offset_names.add(base)
            self._offset_names.add(offset_name)
        tensor.set_ragged_offset(offsets)


def _qkv_dims(cfg: AttnConfig) -> dict[str, tuple[int, int, int, int]]:
    b, hq, hk = cfg.batch_size, cfg.num_heads_q, cfg.num_heads_kv
    sq, skv, dqk, dv = cfg.seqlen_q, cfg.seqlen_kv, cfg.head_dim_qk, cfg.resolved_head_dim_v
    return {
        "q": (b, hq, sq, dqk), "k": (b, hk, skv, dqk), "v": (b, hk, skv, dv), "o": (b, hq, sq, dv),
        "stats": (b, hq, sq, 1),
    }


def _qkv_strides(cfg: AttnConfig, layout_name: str) -> dict[str, tuple[int, int, int, int]]:
    """Strides of Q, K, V stored as `layout_name` (qkv_layout, or dqkv_layout for the gradients)."""
    layout = LAYOUTS[layout_name]
    d = _qkv_dims(cfg)
    q = d["q"]
    k, v = d["k"], d["v"]
    return {
        "q": format_strides(layout.q_format, cfg.batch_size, q[1], q[2], q[3], _q_packing(layout_name)),
        "k": format_strides(layout.kv_format, cfg.batch_size, k[1], k[2], k[3], _kv_packing(layout_name)),
        "v": format_strides(layout.kv_format, cfg.batch_size, v[1], v[2], v[3], _kv_packing(layout_name)),
    }


def _stats_strides(cfg: AttnConfig) -> tuple[int, int, int, int]:
    # (B, H, S_q, 1) float32 stored head-major, as TransformerEngine allocates the softmax stats.
    return (cfg.num_heads_q * cfg.seqlen_q, cfg.seqlen_q, 1, 1)


def _bias_dims(cfg: AttnConfig) -> tuple[int, int, int, int]:
    b, h, sq, skv = cfg.batch_size, cfg.num_heads_q, cfg.seqlen_q, cfg.seqlen_kv
    return {
        "1hss": (1, h, sq, skv), "b1ss": (b, 1, sq, skv), "bhss": (b, h, sq, skv), "11ss": (1, 1, sq, skv),
    }[cfg.bias_shape or "1hss"]


def _mask_arguments(desc: _Description) -> dict[str, Any]:
    """Causal masks, sliding windows and the diagonal alignment, in TransformerEngine's semantics.

    TE's window_size (left, right), -1 = unbounded, attends key j from query i when
    i - left <= j' <= i + right, with j' aligned to the top-left or bottom-right diagonal. cuDNN's
    diagonal band counts its left bound including the diagonal, so left bound = left + 1 (TE's
    fused_attn_f16_arbitrary_seqlen.cu does the same); a causal mask is a right bound of 0.
    """
    cfg, cudnn = desc.cfg, desc.cudnn
    left, right = cfg.window_size
    left_bound = left + 1 if left != -1 else None
    right_bound = right if right != -1 else None
    if cfg.is_causal:
        right_bound = 0
    bottom_right = cfg.resolved_bottom_right_diagonal
    alignment = cudnn.diagonal_alignment.BOTTOM_RIGHT if bottom_right else cudnn.diagonal_alignment.TOP_LEFT
    op = desc.operation
    left_name = next((n for n in ("diagonal_band_left_bound", "left_bound") if desc.features.accepts(op, n)), None)
    right_name = next((n for n in ("diagonal_band_right_bound", "right_bound") if desc.features.accepts(op, n)), None)
    if left_name and right_name and desc.features.accepts(op, "diagonal_alignment"):
        args: dict[str, Any] = {"diagonal_alignment": alignment}
        if left_bound is not None:
            args[left_name] = left_bound
        if right_bound is not None:
            args[right_name] = right_bound
        return args
    # Older frontends: causal flags and a left-only sliding window, aligned top-left unless the
    # bottom-right causal flag is set.
    args = {}
    if right_bound not in (None, 0):
        raise desc.unsupported("window_size", cfg.window_size, f"{op}() has no diagonal band right bound")
    if right_bound == 0:
        flag = "use_causal_mask_bottom_right" if bottom_right else "use_causal_mask"
        desc.require(flag, "mask", cfg.mask)
        args[flag] = True
    elif bottom_right:
        raise desc.unsupported("bottom_right_diagonal", True, f"{op}() has no diagonal_alignment argument")
    if left_bound is not None:
        name = next((n for n in ("sliding_window_length", "sliding_window") if desc.features.accepts(op, n)), None)
        if name is None:
            raise desc.unsupported("window_size", cfg.window_size, f"{op}() has no sliding window argument")
        args[name] = left_bound
    return args


def _common_arguments(desc: _Description, *, backward: bool) -> dict[str, Any]:
    """Arguments shared by every SDPA operation: scale, masks, padding, dropout, sink, bias."""
    cfg, cudnn = desc.cfg, desc.cudnn
    args: dict[str, Any] = {"attn_scale": float(cfg.resolved_attn_scale)}
    args.update(_mask_arguments(desc))
    if cfg.has_padding:
        desc.require("use_padding_mask", "mask", cfg.mask)
        b = cfg.batch_size
        args["use_padding_mask"] = True
        args["seq_len_q"] = desc.input("seq_len_q", (b, 1, 1, 1), _SCALAR, cudnn.data_type.INT32)
        args["seq_len_kv"] = desc.input("seq_len_kv", (b, 1, 1, 1), _SCALAR, cudnn.data_type.INT32)
    if cfg.dropout > 0.0:
        desc.require("dropout", "dropout", cfg.dropout)
        seed = desc.scalar("seed", "INT64")
        offset = desc.scalar("offset", "INT64")
        args["dropout"] = (float(cfg.dropout), seed, offset)
    if cfg.bias == "pre_scale_bias":
        raise desc.unsupported("bias", cfg.bias, "cuDNN's SDPA adds the bias after scaling; a pre-scale bias cannot be expressed")
    if cfg.bias == "alibi":
        desc.require("use_alibi_mask", "bias", cfg.bias)
        args["use_alibi_mask"] = True
    if cfg.bias == "post_scale_bias":
        desc.require("bias", "bias", cfg.bias)
        dims = _bias_dims(cfg)
        # The bias is in the 16-bit input type (an FP8 graph's bias, where the FP8 operation has
        # one, is bf16: FP8 is an input encoding, not a bias type).
        bias_dtype = desc.dtype("bf16" if cfg.is_fp8 else cfg.qkv_dtype)
        args["bias"] = desc.input("bias", dims, _row_major(dims), bias_dtype)
        # TransformerEngine computes dBias only for a (1, h, s_q, s_kv) bias: cuDNN has no bias
        # gradient reduction over the batch (TE fused_attn_f16_arbitrary_seqlen.cu).
        if backward and cfg.bias_shape == "1hss":
            desc.require("dBias", "bias", cfg.bias)
            args["dBias"] = desc.input("dBias", dims, _row_major(dims), bias_dtype)
    if cfg.softmax != "vanilla":
        desc.require("sink_token", "softmax", cfg.softmax)
        # off_by_one is softmax with a sink logit fixed at 0 (TE binds a zero softmax offset);
        # learnable trains the per-head sink, so the backward also returns its gradient.
        h = cfg.num_heads_q
        args["sink_token"] = desc.input("sink_token", (1, h, 1, 1), (h, 1, 1, 1), cudnn.data_type.FLOAT)
        if backward and cfg.softmax == "learnable":
            desc.require("dSink_token", "softmax", cfg.softmax)
            args["dSink_token"] = desc.input("dSink_token", (1, h, 1, 1), (h, 1, 1, 1), cudnn.data_type.FLOAT)
    if backward:
        if cfg.deterministic or desc.features.accepts(desc.operation, "use_deterministic_algorithm"):
            desc.require("use_deterministic_algorithm", "deterministic", cfg.deterministic)
            args["use_deterministic_algorithm"] = bool(cfg.deterministic)
        if cfg.layout.ragged and desc.features.accepts(desc.operation, "max_total_seq_len_q"):
            # The packed token capacity: the backward sizes its workspace from it (TE passes it).
            args["max_total_seq_len_q"] = cfg.batch_size * cfg.seqlen_q
            args["max_total_seq_len_kv"] = cfg.batch_size * cfg.seqlen_kv
    return args


def _stats_argument(desc: _Description) -> dict[str, Any]:
    cfg, op = desc.cfg, desc.operation
    if desc.features.accepts(op, "generate_stats"):
        return {"generate_stats": bool(cfg.is_training)}
    desc.require("is_inference", "is_training", cfg.is_training)
    return {"is_inference": not cfg.is_training}


def _forward_inputs(desc: _Description) -> tuple[Any, Any, Any, dict[str, Any]]:
    """Q, K, V (or paged K/V containers) with strides from qkv_layout, ragged offsets, page tables."""
    cfg, cudnn = desc.cfg, desc.cudnn
    dims, strides = _qkv_dims(cfg), _qkv_strides(cfg, cfg.qkv_layout)
    args: dict[str, Any] = {}
    q = desc.input("q", dims["q"], strides["q"])
    if cfg.q_format == "thd":
        desc.ragged(q, "q", "q", strides["q"][2])
    if cfg.layout.paged:
        desc.require("paged_attention_k_table", "qkv_layout", cfg.qkv_layout)
        pages, size, hk = cfg.num_pages, cfg.page_size, cfg.num_heads_kv
        per_seq = math.ceil(cfg.seqlen_kv / size)
        containers = {}
        for name, head_dim in (("k", cfg.head_dim_qk), ("v", cfg.resolved_head_dim_v)):
            # A page container is (num_pages, H, page_size, D) stored as the KV format:
            # BSHD -> [pages, page_size, H, D], SBHD -> [page_size, pages, H, D].
            container_strides = format_strides(cfg.kv_format, pages, hk, size, head_dim)
            containers[name] = desc.input(name, (pages, hk, size, head_dim), container_strides)
        table_dims = (cfg.batch_size, 1, per_seq, 1)
        args["paged_attention_k_table"] = desc.input("page_table_k", table_dims, _row_major(table_dims), cudnn.data_type.INT32)
        args["paged_attention_v_table"] = desc.input("page_table_v", table_dims, _row_major(table_dims), cudnn.data_type.INT32)
        args["paged_attention_max_seq_len_kv"] = cfg.seqlen_kv
        return q, containers["k"], containers["v"], args
    k = desc.input("k", dims["k"], strides["k"])
    v = desc.input("v", dims["v"], strides["v"])
    if cfg.kv_format == "thd":
        desc.ragged(k, "k", "kv", strides["k"][2])
        desc.ragged(v, "v", "kv", strides["v"][2])
    return q, k, v, args


def _o_strides(cfg: AttnConfig, fmt: str) -> tuple[int, int, int, int]:
    b, h, s, d = _qkv_dims(cfg)["o"]
    return format_strides(fmt, b, h, s, d)


def _forward_outputs(desc: _Description, o: Any, stats: Any) -> None:
    cfg = desc.cfg
    dims = _qkv_dims(cfg)
    o_fmt = cfg.resolved_o_format
    o_strides = _o_strides(cfg, o_fmt)
    desc.output("o", o, dims["o"], o_strides, desc.dtype(cfg.resolved_o_dtype))
    if o_fmt == "thd":
        desc.ragged(o, "o", "o", o_strides[2])
    if cfg.is_training:
        desc.output("stats", stats, dims["stats"], _stats_strides(cfg), desc.cudnn.data_type.FLOAT)


def _max_logit_argument(desc: _Description) -> dict[str, Any]:
    cfg = desc.cfg
    if not cfg.return_max_logit:
        return {}
    desc.require("score_max", "return_max_logit", True)
    # The row maxima of the scaled scores, (B, H, S_q, 1) float32; TE reduces them to the
    # per-head max logit (cudnn-frontend's set_logit_max / score_max).
    tensor = desc.graph.tensor(name="max_logit", dim=list(_qkv_dims(cfg)["stats"]),
                               stride=list(_stats_strides(cfg)), data_type=desc.cudnn.data_type.FLOAT)
    tensor.set_output(True)
    desc.tensors["max_logit"] = tensor
    return {"score_max": tensor}


def _fp8_scales(desc: _Description, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: desc.scalar(name) for name in names}


def _describe_forward(desc: _Description) -> dict[str, Any]:
    q, k, v, args = _forward_inputs(desc)
    args.update(_stats_argument(desc))
    args.update(_common_arguments(desc, backward=False))
    args.update(_max_logit_argument(desc))
    op = desc.operation
    if op == "sdpa_fp8":
        args.update(_fp8_scales(desc, ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")))
    elif op == "sdpa_mxfp8":
        args.update(_mxfp8_forward_scales(desc))
    _check_arguments(desc, args)
    outputs = list(getattr(desc.graph, op)(q=q, k=k, v=v, **args))
    o, stats = outputs[0], outputs[1]
    _forward_outputs(desc, o, stats)
    if op == "sdpa_fp8":
        desc.output("amax_s", outputs[2], _SCALAR, _SCALAR, desc.cudnn.data_type.FLOAT)
        desc.output("amax_o", outputs[3], _SCALAR, _SCALAR, desc.cudnn.data_type.FLOAT)
    elif op == "sdpa_mxfp8":
        desc.output("amax_o", outputs[2], _SCALAR, _SCALAR, desc.cudnn.data_type.FLOAT)
    return args


def _describe_backward(desc: _Description) -> dict[str, Any]:
    cfg, cudnn, op = desc.cfg, desc.cudnn, desc.operation
    if cfg.layout.paged:
        raise desc.unsupported("qkv_layout", cfg.qkv_layout, "paged KV caches have no backward graph")
    dims = _qkv_dims(cfg)
    q, k, v, args = _forward_inputs(desc)
    o_fmt, do_fmt = cfg.resolved_o_format, cfg.resolved_do_format
    o_strides, do_strides = _o_strides(cfg, o_fmt), _o_strides(cfg, do_fmt)
    o = None
    if op != "sdpa_mxfp8_backward":  # the MXFP8 backward reads O as o_f16 instead
        o = desc.input("o", dims["o"], o_strides, desc.dtype(cfg.resolved_o_dtype))
        if o_fmt == "thd":
            desc.ragged(o, "o", "o", o_strides[2])
    d_o = desc.input("dO", dims["o"], do_strides, desc.dtype(cfg.resolved_do_dtype))
    if do_fmt == "thd":
        desc.ragged(d_o, "dO", "o", do_strides[2])
    stats = desc.input("stats", dims["stats"], _stats_strides(cfg), cudnn.data_type.FLOAT)
    args.update(_common_arguments(desc, backward=True))
    if op == "sdpa_fp8_backward":
        args.update(_fp8_scales(desc, (
            "descale_q", "descale_k", "descale_v", "descale_o", "descale_dO", "descale_s", "descale_dP",
            "scale_s", "scale_dQ", "scale_dK", "scale_dV", "scale_dP",
        )))
    if op == "sdpa_mxfp8_backward":
        args.update(_mxfp8_backward_inputs(desc, q, k, d_o))
        _check_arguments(desc, args)
        outputs = list(desc.graph.sdpa_mxfp8_backward(q=q, k=k, v=v, stats=stats, **args))
    else:
        _check_arguments(desc, args)
        outputs = list(getattr(desc.graph, op)(q=q, k=k, v=v, o=o, dO=d_o, stats=stats, **args))
    grad_layout = cfg.resolved_dqkv_layout
    grad_strides = _qkv_strides(cfg, grad_layout)
    grad_dtype = desc.dtype(cfg.resolved_dqkv_dtype)
    for index, (name, source) in enumerate((("dQ", "q"), ("dK", "k"), ("dV", "v"))):
        tensor = desc.output(name, outputs[index], dims[source], grad_strides[source], grad_dtype)
        fmt = LAYOUTS[grad_layout].q_format if source == "q" else LAYOUTS[grad_layout].kv_format
        if fmt == "thd":
            desc.ragged(tensor, name, "q" if source == "q" else "kv", grad_strides[source][2])
    if op == "sdpa_fp8_backward":
        for index, name in enumerate(("amax_dQ", "amax_dK", "amax_dV", "amax_dP"), start=3):
            desc.output(name, outputs[index], _SCALAR, _SCALAR, cudnn.data_type.FLOAT)
    elif op == "sdpa_mxfp8_backward":
        for index, name in enumerate(("amax_dQ", "amax_dK", "amax_dV"), start=3):
            desc.output(name, outputs[index], _SCALAR, _SCALAR, cudnn.data_type.FLOAT)
    for name in ("dBias", "dSink_token"):
        if name in args:
            args[name].set_output(True)
    return args


# ----- MXFP8 (block-scaled FP8; cuDNN runs it on Blackwell) ----------------------------------
def _block_scale(desc: _Description, name: str, dims: tuple[int, int, int, int], along: str) -> Any:
    """An E8M0 block-scale tensor in F8_128x4 order: one scale per 32 elements along `along`."""
    if "FP8_E8M0" not in desc.features.data_types or "F8_128x4" not in desc.features.reorderings:
        raise desc.unsupported("scaling_mode", "mxfp8", "the frontend has no FP8_E8M0 / F8_128x4 block-scale tensors")
    b, h, s, d = dims
    if along == "d":
        scale_dims = (b, h, _ceil_to(s, 128), _ceil_to(math.ceil(d / 32), 4))
        strides = _row_major(scale_dims)
    else:
        scale_dims = (b, h, _ceil_to(math.ceil(s / 32), 4), _ceil_to(d, 128))
        strides = (h * scale_dims[2] * scale_dims[3], scale_dims[2] * scale_dims[3], 1, scale_dims[2])
    return desc.input(name, scale_dims, strides, desc.cudnn.data_type.FP8_E8M0,
                      reordering_type=desc.cudnn.tensor_reordering.F8_128x4)


def _mxfp8_forward_scales(desc: _Description) -> dict[str, Any]:
    dims = _qkv_dims(desc.cfg)
    return {
        "descale_q": _block_scale(desc, "descale_q", dims["q"], "d"),
        "descale_k": _block_scale(desc, "descale_k", dims["k"], "d"),
        "descale_v": _block_scale(desc, "descale_v", dims["v"], "s"),
    }


def _mxfp8_backward_inputs(desc: _Description, q: Any, k: Any, d_o: Any) -> dict[str, Any]:
    """The transposed-quantized copies and f16 tensors sdpa_mxfp8_backward reads, with their scales.

    q_T / k_T / dO_T hold the same logical tensors quantized along the sequence axis, so they have
    the dims and strides of Q / K / dO; o_f16 and dO_f16 are O and dO in 16 bits.
    """
    cfg = desc.cfg
    dims, strides = _qkv_dims(cfg), _qkv_strides(cfg, cfg.qkv_layout)
    o_strides = _o_strides(cfg, cfg.resolved_o_format)
    do_strides = _o_strides(cfg, cfg.resolved_do_format)
    f16 = desc.dtype("bf16")
    args = {
        "q_T": desc.input("q_T", dims["q"], strides["q"]),
        "k_T": desc.input("k_T", dims["k"], strides["k"]),
        "o_f16": desc.input("o_f16", dims["o"], o_strides, f16),
        "dO_f16": desc.input("dO_f16", dims["o"], do_strides, f16),
        "dO": d_o,
        "dO_T": desc.input("dO_T", dims["o"], do_strides, desc.dtype(cfg.resolved_do_dtype)),
    }
    args.update(_mxfp8_forward_scales(desc))
    args["descale_q_T"] = _block_scale(desc, "descale_q_T", dims["q"], "s")
    args["descale_k_T"] = _block_scale(desc, "descale_k_T", dims["k"], "s")
    args["descale_dO"] = _block_scale(desc, "descale_dO", dims["o"], "d")
    args["descale_dO_T"] = _block_scale(desc, "descale_dO_T", dims["o"], "s")
    return args


_FIELD_OF_ARGUMENT = {
    "dropout": "dropout", "use_alibi_mask": "bias", "bias": "bias", "dBias": "bias",
    "use_padding_mask": "mask", "seq_len_q": "mask", "seq_len_kv": "mask",
    "sink_token": "softmax", "dSink_token": "softmax", "score_max": "return_max_logit",
    "use_deterministic_algorithm": "deterministic", "paged_attention_k_table": "qkv_layout",
    "paged_attention_v_table": "qkv_layout", "paged_attention_max_seq_len_kv": "qkv_layout",
    "diagonal_alignment": "bottom_right_diagonal", "generate_stats": "is_training",
    "is_inference": "is_training", "attn_scale": "attn_scale",
}


def _check_arguments(desc: _Description, args: Mapping[str, Any]) -> None:
    """Every argument must exist in the installed frontend's operation: never silently dropped."""
    for name in args:
        if not desc.features.accepts(desc.operation, name):
            field_name = _FIELD_OF_ARGUMENT.get(name, "window_size" if "bound" in name or "window" in name else name)
            value = getattr(desc.cfg, field_name, None) if hasattr(desc.cfg, field_name) else None
            raise desc.unsupported(field_name, value, f"{desc.operation}() has no '{name}' argument")


# ----- the build -----------------------------------------------------------------------------
def operation_for(cfg: AttnConfig, backend: Backend, phase: Phase) -> str:
    """The frontend operation that computes `phase` of `cfg` on `backend`."""
    suffix = "_backward" if phase is Phase.BACKWARD else ""
    if backend is Backend.F16:
        return "sdpa" + suffix
    if backend is Backend.FP8:
        return ("sdpa_mxfp8" if cfg.resolved_scaling_mode == "mxfp8" else "sdpa_fp8") + suffix
    raise ConfigError("backend", backend, "must be Backend.F16 or Backend.FP8 (Backend.NONE has no graph)")


def _options(args: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar and enum arguments (tensors are in GraphBuild.tensors); dropout as its probability."""
    options: dict[str, Any] = {}
    for name, value in args.items():
        if name == "dropout":
            options["dropout"] = value[0]
        elif not hasattr(value, "set_output"):
            options[name] = value
    return options


def _read_back(tensors: Mapping[str, Any]) -> tuple[dict, dict]:
    dims_strides: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    data_types: dict[str, Any] = {}
    for name, tensor in tensors.items():
        dims = tensor.get_dim() if hasattr(tensor, "get_dim") else getattr(tensor, "dim", ())
        strides = tensor.get_stride() if hasattr(tensor, "get_stride") else getattr(tensor, "stride", ())
        dims_strides[name] = (tuple(int(x) for x in dims or ()), tuple(int(x) for x in strides or ()))
        data_types[name] = tensor.get_data_type() if hasattr(tensor, "get_data_type") else getattr(tensor, "data_type", None)
    return dims_strides, data_types


def _classify(stage: str, error: BaseException, timings: Mapping[str, float]) -> FusedAttnSelectError:
    """cuDNN's 'not supported' family -> CudnnUnsupported; incidents and bugs -> ProbeFailure.

    A cudnnGraphNotSupportedError is a verdict (its engine listing may name other engines' status
    codes, e.g. an architecture mismatch) unless it wraps a failed backend lowering that was an
    incident. A RuntimeError/ValueError/NotImplementedError from the frontend is its validation of
    the description, unless its text names an incident. Anything else (TypeError, MemoryError,
    ImportError, ...) is a failure.
    """
    import cudnn

    text = str(error) or type(error).__name__
    detail = f"{type(error).__name__}: {text}"
    message = clean_message(text)
    not_supported = getattr(cudnn, "cudnnGraphNotSupportedError", None)
    if isinstance(not_supported, type) and isinstance(error, not_supported):
        declined = backend_decline(text)
        incident = declined is not None and is_incident(declined)
    elif isinstance(error, _VERDICT_EXCEPTIONS) and not isinstance(error, MemoryError):
        incident = is_incident(text)
    else:
        incident = True
    if incident:
        return ProbeFailure(stage, f"{type(error).__name__}: {message}", detail, timings)
    return CudnnUnsupported(stage, message, detail, timings)


def _plan_name(graph: Any) -> str:
    try:
        index = getattr(graph, "_plan_index", 0)
        return str(graph.get_plan_name_at_index(index))
    except Exception:  # noqa: BLE001 -- informational; older frontends have no plan names
        return ""


def build_graph(cfg: AttnConfig, backend: Backend, phase: Phase, *, handle: Any, depth: ProbeDepth,
                kernel_cache: Any = None) -> GraphBuild:
    """Build the cuDNN graph of one phase of `cfg` on `backend` and take it through cuDNN's stages.

    handle        a cuDNN handle (cudnn.create_handle(); probing.cudnn.handle_for(device)) of the
                  device to build for, with that device's CUDA context current on this thread.
    depth         ProbeDepth.FAST stops after check_support (a few ms, workspace_size 0);
                  ProbeDepth.FULL also runs build_plans (kernels compiled; executable graph).
    kernel_cache  a cudnn kernel cache (cudnn.create_kernel_cache(); probing.cudnn.kernel_cache_for):
                  the graph is then built with dynamic shapes enabled, so graphs that differ only in
                  batch size / sequence lengths reuse compiled kernels. A cache binds to the first
                  operation graph it builds: share one per (thread, device, cfg.shape_class_key(),
                  operation). Some cuDNN engines have no dynamic-shape support (on Hopper with cuDNN
                  9.19, the SDPA backward): when cuDNN rejects the dynamic-shape graph but accepts
                  the static one, the static graph is returned (GraphBuild.dynamic_shapes False,
                  GraphBuild.note says why) and later builds of that problem class go straight to
                  static. Ignored when the frontend has no dynamic shapes.

    Raises CudnnUnsupported (a verdict: cuDNN's "not supported" family, or a field the installed
    frontend cannot express, stage "graph_api") or ProbeFailure (an incident: out of memory, CUDA
    or driver errors, unexpected exceptions). Neither keeps a reference to the graph.
    """
    depth = ProbeDepth(depth)
    if kernel_cache is None or not frontend_features().dynamic_shapes:
        return _build(cfg, backend, phase, handle, depth, None, describe_only=False)
    key = (cfg.shape_class_key(), operation_for(cfg, backend, phase))
    rejection = _STATIC_ONLY.get(key)
    if rejection is None:
        try:
            return _build(cfg, backend, phase, handle, depth, kernel_cache, describe_only=False)
        except (CudnnUnsupported, ProbeFailure) as dynamic_error:
            # Whatever the dynamic-shape graph's failure, the static graph decides: its error, if
            # any, is the answer (an unsupported problem fails both ways; an incident recurs).
            if dynamic_error.stage == "graph_api":
                raise
            rejection = dynamic_error.message
        build = _build(cfg, backend, phase, handle, depth, None, describe_only=False)
        if len(_STATIC_ONLY) >= _STATIC_ONLY_LIMIT:
            _STATIC_ONLY.clear()
        _STATIC_ONLY[key] = rejection
    else:
        build = _build(cfg, backend, phase, handle, depth, None, describe_only=False)
    build.note = f"built without dynamic shapes, which cuDNN rejects for this graph: {rejection}"
    return build


# Problem classes (shape_class_key, operation) whose graph cuDNN accepts only without dynamic
# shapes: later builds skip the dynamic attempt. Decided by the cuDNN of this process, so a plain
# dict; bounded because shape classes are unbounded in principle.
_STATIC_ONLY: dict[tuple[str, str], str] = {}
_STATIC_ONLY_LIMIT = 4096


def describe_graph(cfg: AttnConfig, backend: Backend, phase: Phase, *, handle: Any = None) -> GraphBuild:
    """The graph description only (stage "graph_api"): tensors, dims, strides, dtypes, options.

    Nothing is validated or built by cuDNN, so this answers "what would be built" even for a
    problem cuDNN rejects; timings hold only "graph_api".
    """
    return _build(cfg, backend, phase, handle, ProbeDepth.FAST, None, describe_only=True)


class _QuietDeclines(logging.Filter):
    """Drops cudnn-frontend's "backend could not build/lower this graph" warnings while this thread
    builds a graph here: a rejection is this library's answer (with cuDNN's text in the verdict),
    not something to warn about. The frontend's other records pass through."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(_BUILDING, "active", False):
            return True
        return not record.getMessage().startswith(("backend could not build this graph", "backend could not lower this graph"))


_BUILDING = threading.local()
_QUIET = _QuietDeclines()
logging.getLogger("cudnn.pygraph").addFilter(_QUIET)


def _build(cfg: AttnConfig, backend: Backend, phase: Phase, handle: Any, depth: ProbeDepth,
           kernel_cache: Any, *, describe_only: bool) -> GraphBuild:
    _BUILDING.active = True
    try:
        return _build_quietly(cfg, backend, phase, handle, depth, kernel_cache, describe_only=describe_only)
    finally:
        _BUILDING.active = False


def _build_quietly(cfg: AttnConfig, backend: Backend, phase: Phase, handle: Any, depth: ProbeDepth,
                   kernel_cache: Any, *, describe_only: bool) -> GraphBuild:
    import cudnn

    features = frontend_features()
    operation = operation_for(cfg, backend, phase)
    timings: dict[str, float] = {}
    stage = "graph_api"
    started = time.perf_counter()
    failure: FusedAttnSelectError | None = None
    graph = desc = None
    args: dict[str, Any] = {}
    workspace, plan_name = 0, ""
    dynamic = kernel_cache is not None and features.dynamic_shapes
    try:
        if backend is Backend.F16 and cfg.is_fp8 or backend is Backend.FP8 and not cfg.is_fp8:
            raise CudnnUnsupported("graph_api", f"qkv_dtype={cfg.qkv_dtype!r} cannot run on the {backend.value} backend")
        if not features.has(operation):
            message = (f"scaling_mode={cfg.resolved_scaling_mode!r}: cudnn-frontend {features.version} "
                       f"has no {operation}() operation")
            raise CudnnUnsupported("graph_api", message, message)
        graph_kwargs: dict[str, Any] = {
            "io_data_type": getattr(cudnn.data_type, _DTYPES[cfg.qkv_dtype]),
            "intermediate_data_type": cudnn.data_type.FLOAT,
            "compute_data_type": cudnn.data_type.FLOAT,
            "handle": handle,
        }
        if dynamic:
            graph_kwargs.update(is_dynamic_shape_enabled=True, kernel_cache=kernel_cache)
        if cfg.cuda_graph and "is_cuda_graph_replay_expected" in features.graph_arguments:
            # A statement about how the graph runs (captured and replayed); changes no support.
            graph_kwargs["is_cuda_graph_replay_expected"] = True
        graph = cudnn.pygraph(**graph_kwargs)
        desc = _Description(cudnn, graph, cfg, features, operation)
        args = _describe_backward(desc) if phase is Phase.BACKWARD else _describe_forward(desc)
        _lap(timings, stage, started)
        steps = () if describe_only else (
            ("validate", graph.validate),
            ("build_operation_graph", graph.build_operation_graph),
            ("create_execution_plans", lambda: graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])),
            ("check_support", graph.check_support),
        )
        for stage, step in steps:
            started = time.perf_counter()
            step()
            _lap(timings, stage, started)
        if depth is ProbeDepth.FULL and not describe_only:
            stage, started = "build_plans", time.perf_counter()
            graph.build_plans()
            workspace = int(graph.get_workspace_size())
            _lap(timings, stage, started)
            plan_name = _plan_name(graph)
    except CudnnUnsupported as err:
        _lap(timings, stage, started)
        failure = CudnnUnsupported(err.stage, err.message, err.detail, timings)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # noqa: BLE001 -- every other error is classified, none escapes raw
        _lap(timings, stage, started)
        failure = _classify(stage, err, timings)
    if failure is not None:
        # Raised outside the except blocks so the exception carries no traceback into the graph.
        graph = desc = args = steps = None
        raise failure
    assert desc is not None
    dims_strides, data_types = _read_back(desc.tensors)
    return GraphBuild(
        graph=graph, tensors=dict(desc.tensors), dims_strides=dims_strides, data_types=data_types,
        options=_options(args), operation=operation, depth=depth, workspace_size=workspace,
        timings_ms=timings, dynamic_shapes=dynamic, plan_name=plan_name,
    )


def _lap(timings: dict[str, float], stage: str, started: float) -> None:
    timings[stage] = timings.get(stage, 0.0) + (time.perf_counter() - started) * 1e3

