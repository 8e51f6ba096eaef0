"""The cuDNN frontend graph of one attention problem, built without device memory or kernels.

`build_graph(cfg, backend, phase, handle=..., depth=...)` translates an AttnConfig into the
cudnn-frontend SDPA graph that runs it (see description.py) and takes that graph through cuDNN's
build steps:

    graph_api               the Python graph is described (tensors, SDPA operation, outputs)
    validate                the frontend checks the description (e.g. "hidden_dim should be multiple of 8")
    build_operation_graph   the backend operation graph is created
    create_execution_plans  cuDNN's heuristics (modes A, then FALLBACK) list engine configs
    check_support           the first plan is asked whether it supports the graph
    build_plans             (ProbeDepth.FULL only) kernels are compiled: the slow step

The probing engine runs it to answer "is this supported"; dispatch runs it with ProbeDepth.FULL
and then executes `GraphBuild.graph` with device pointers bound to `GraphBuild.tensors`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from fusedattn_select.config import AttnConfig
from fusedattn_select.dtypes import cudnn_dtype
from fusedattn_select.errors import ConfigError
from fusedattn_select.probing.cudnn.description import Description, describe_backward, describe_forward
from fusedattn_select.probing.cudnn.features import frontend_features
from fusedattn_select.probing.cudnn.messages import CudnnUnsupported, ProbeFailure, classify_exception
from fusedattn_select.types import Backend, Phase, ProbeDepth


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
    depth = ProbeDepth.parse(depth, "depth")
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
            incident = isinstance(dynamic_error, ProbeFailure)
        build = _build(cfg, backend, phase, handle, depth, None, describe_only=False)
        if incident:  # out of memory, a CUDA error: says nothing of the class; dynamic shapes next time
            build.note = f"built without dynamic shapes after the dynamic-shape build failed: {rejection}"
            return build
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


def _new_graph(cudnn: Any, cfg: AttnConfig, handle: Any, kernel_cache: Any) -> Any:
    """An empty cudnn-frontend graph for `cfg`; with dynamic shapes when `kernel_cache` is given."""
    graph_kwargs: dict[str, Any] = {
        "io_data_type": cudnn_dtype(cfg.qkv_dtype, cudnn),
        "intermediate_data_type": cudnn_dtype("fp32", cudnn),
        "compute_data_type": cudnn_dtype("fp32", cudnn),
        "handle": handle,
    }
    if kernel_cache is not None:
        graph_kwargs.update(is_dynamic_shape_enabled=True, kernel_cache=kernel_cache)
    if cfg.cuda_graph and "is_cuda_graph_replay_expected" in frontend_features().graph_arguments:
        # A statement about how the graph runs (captured and replayed); changes no support.
        graph_kwargs["is_cuda_graph_replay_expected"] = True
    return cudnn.pygraph(**graph_kwargs)


def _build_quietly(cfg: AttnConfig, backend: Backend, phase: Phase, handle: Any, depth: ProbeDepth,
                   kernel_cache: Any, *, describe_only: bool) -> GraphBuild:
    import cudnn  # optional dependency (the 'cuda' extra): imported only when a graph is built

    features = frontend_features()
    operation = operation_for(cfg, backend, phase)
    timings: dict[str, float] = {}
    stage = "graph_api"
    started = time.perf_counter()
    failure: CudnnUnsupported | ProbeFailure | None = None
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
        graph = _new_graph(cudnn, cfg, handle, kernel_cache if dynamic else None)
        desc = Description(cudnn, graph, cfg, features, operation)
        args = describe_backward(desc) if phase is Phase.BACKWARD else describe_forward(desc)
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
        failure = classify_exception(stage, err, timings, cudnn)
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

