"""Built cuDNN plans for dispatch: one per (problem, phase), found by dict lookup (`obtain_plan`), run on the caller's
stream with no host sync, so that forward and backward can be captured in a CUDA graph (docs/dispatch.md, 'Plans')."""

from __future__ import annotations

import inspect
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, cast

import torch

from fusedattn_select import dtypes, offpath
from fusedattn_select.config import AttnConfig
from fusedattn_select.plan_store.blob import PlanBlobError, cudnn_type_name
from fusedattn_select.plan_store.keys import GraphSignature, PlanKey
from fusedattn_select.plan_store.persistence import REBUILT, obtain, persists_plans
from fusedattn_select.probing import cudnn as cudnn_probe
from fusedattn_select.probing.cudnn.description import OUTPUT_NAMES
from fusedattn_select.probing.cudnn.plan_graphs import (
    StoredGraph,
    deserialize_graph,
    dispatch_plan_key,
    serialize_build,
)
from fusedattn_select.runtime import native
from fusedattn_select.runtime.dispatcher import PLAN_COUNTERS, dispatcher
from fusedattn_select.runtime.run_settings import run_settings
from fusedattn_select.runtime.streams import loading_stream, persistent
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store.protocol import Store
from fusedattn_select.types import Backend, Fingerprint, Phase, ProbeDepth, Verdict

if TYPE_CHECKING:
    from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine

log = logging.getLogger("fusedattn_select")

# Outputs whose padded rows cuDNN leaves unwritten: allocated zeroed under a padding mask so the
# result matches the float32 reference (padded query rows and padded keys get 0).
ZEROED_WITH_PADDING = frozenset({"o", "dQ", "dK", "dV"})
Launcher = Callable[[tuple, Any, Any], None]  # direct_launcher's launch(buffers, workspace, handle)


def _torch_dtype(data_type: Any) -> torch.dtype:
    """The torch dtype of a cudnn.data_type member."""
    return dtypes.torch_dtype(dtypes.from_cudnn(data_type), torch)


@dataclass(frozen=True)
class TensorSpec:
    """How the graph declared one named tensor (logical dims, element strides, dtype)."""

    dims: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype


# plan_stats() reports each of PLAN_COUNTERS (0 until counted); the *_ms ones sum milliseconds.
def plan_stats() -> dict[str, float]:
    """Counters: plan builds (by dispatch), their ms and failures; plan loads (from the persistent
    store), their ms, and stored plans that did not load (dropped and rebuilt); executes."""
    stats = dispatcher.plan_stats
    with dispatcher.plan_stats_lock:
        return {name: round(float(stats[name]), 3) if name.endswith("_ms") else stats[name] for name in PLAN_COUNTERS}


class PlanBuildError(Exception):
    """A graph that the selector accepted did not build; `verdict` is what to record."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        super().__init__(verdict.reason())


class Plan:
    """One built graph, ready to execute: named inputs in, freshly allocated named outputs back.

    `build` is a probing.cudnn.graphs.GraphBuild (tensors are the graph's tensor objects) or a
    plan_graphs.StoredGraph (a deserialized graph; tensors are uids): both bind the same way.
    """

    def __init__(self, build: Any, phase: Phase, device: torch.device, cfg: AttnConfig) -> None:
        self.phase = phase
        self.device = device
        self.graph = build.graph
        self.workspace_size = int(build.workspace_size)
        self.cudnn_tensors: dict[str, Any] = dict(build.tensors)
        dims_strides: Mapping[str, Any] = build.dims_strides
        data_types: Mapping[str, Any] = build.data_types
        self.specs: dict[str, TensorSpec] = {}
        for name in self.cudnn_tensors:
            dims, strides = dims_strides[name]
            self.specs[name] = TensorSpec(tuple(dims), tuple(strides), _torch_dtype(data_types[name]))
        written = OUTPUT_NAMES[phase]
        self.outputs = tuple(n for n in self.cudnn_tensors if n in written)
        self.inputs = tuple(n for n in self.cudnn_tensors if n not in written)
        # The graph's tensors in execute()'s binding order (inputs, then outputs), and their uids for
        # the frontend's ordered binding (None where this frontend has no uids to give).
        self.order = self.inputs + self.outputs
        self._slots = tuple(self.cudnn_tensors[n] for n in self.order)
        self._uids: Optional[tuple[int, ...]] = _uids(self._slots) if _binds_in_order(self.graph) else None
        self.zeroed = frozenset(ZEROED_WITH_PADDING & set(self.outputs)) if cfg.has_padding else frozenset()
        self.constants: dict[str, torch.Tensor] = {}
        self._ordered_checked = False  # whether an execute with ordered binding has run
        self._direct: Optional[Launcher] = None  # direct_launcher's
        self._direct_proven = False
        self._native: Optional[Any] = None  # run(buffers) through the compiled module (runtime/native)
        # The GraphBuild of a freshly built plan, until obtain_plan has serialized it.
        self.source: Any = build
        # Facts the runtime derives from this plan once and reads at every new call shape (lean.py).
        self.derived: dict[Any, Any] = {}

    # ----- binding ----------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.cudnn_tensors

    def constant(self, name: str, value: float) -> torch.Tensor:
        """A per-plan tensor filled with `value` in the declared shape and dtype (made once)."""
        tensor = self.constants.get(name)
        if tensor is None:
            tensor = self.constants[name] = self.allocate(name).fill_(value)
        return tensor

    def conform(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """`value` as the graph declared `name`: the same memory re-described, or a copy if it must be.

        Strides of size-1 dims do not address memory, so a tensor whose other strides match is
        re-described with `as_strided` (no copy); anything else is copied into the declared
        layout (one allocation, only for callers whose tensors are not in a supported layout).
        """
        spec = self.specs[name]
        if value.dtype != spec.dtype:
            value = value.to(spec.dtype)
        if tuple(value.shape) != spec.dims:
            # (B,) seqlens as (B, 1, 1, 1), a (1,) scale as (1, 1, 1, 1), or a broadcast bias.
            value = value.reshape(spec.dims) if value.numel() == math.prod(spec.dims) else value.expand(spec.dims)
        strides = value.stride()
        if strides == spec.strides:
            return value
        if all(n == 1 or a == b for n, a, b in zip(spec.dims, strides, spec.strides)):
            return value.as_strided(spec.dims, spec.strides)
        out = torch.empty_strided(spec.dims, spec.strides, dtype=spec.dtype, device=value.device)
        out.copy_(value)
        return out

    def allocate(self, name: str) -> torch.Tensor:
        spec = self.specs[name]
        tensor = torch.empty_strided(spec.dims, spec.strides, dtype=spec.dtype, device=self.device)
        return tensor.zero_() if name in self.zeroed else tensor

    # ----- execution --------------------------------------------------------------------------
    def execute(self, feeds: Mapping[str, torch.Tensor], outputs: dict[str, torch.Tensor] | None = None
                ) -> dict[str, torch.Tensor]:
        """Run on the current stream: `feeds` (every input, conformed), `outputs` (others allocated); by name."""
        outs = {} if outputs is None else outputs
        for name in self.outputs:
            if name not in outs:
                outs[name] = self.allocate(name)
        self.run(tuple(feeds[n] for n in self.inputs) + tuple(outs[n] for n in self.outputs))
        return outs

    @property
    def binds_by_declaration(self) -> bool:
        """Whether `run` may be given the declared memory under other dims (ordered binding, 1.32+)."""
        return self._uids is not None

    def run(self, buffers: tuple[Any, ...]) -> None:
        """Run the graph on the current stream, `buffers` in `self.order` (inputs, then outputs) as declared
        or, where `binds_by_declaration`, holding that memory; once bound in order, by the compiled module."""
        if self._native is not None:
            return self._native(buffers)
        handle, stream = _prepare_handle(self.device)
        workspace = workspace_for(self.device, self.workspace_size, stream)
        direct = self._direct
        if direct is not None:
            if self._direct_proven:  # the steady state, inline
                direct(buffers, workspace, handle)
                dispatcher.plan_stats["executes"] += 1
                return
            if self._launch(direct, buffers, workspace, handle):
                return
        uids = self._uids
        if uids is not None:
            try:
                self.graph.execute(buffers, workspace, handle=handle, tensor_uids=uids)
                dispatcher.plan_stats["executes"] += 1  # a benign race under threads: the counter is for tests and logs
                if not self._ordered_checked:
                    self._ordered_checked = True
                    self._native = native.plan_runner(self)
                    self._direct = direct_launcher(self.graph, uids)
                return
            except TypeError as err:  # a frontend without ordered binding (before 1.32): bind by map
                if self._ordered_checked:
                    raise
                log.debug("fusedattn_select: ordered binding unavailable (%s); binding by map", err)
                self._uids = None
        self._ordered_checked = True
        self.graph.execute(dict(zip(self._slots, buffers)), workspace, handle=handle)
        dispatcher.plan_stats["executes"] += 1

    def _launch(self, direct: Launcher, buffers: tuple[Any, ...], workspace: torch.Tensor, handle: Any
                ) -> bool:
        """The direct launcher's first run; False (and never again) when it fails."""
        try:
            direct(buffers, workspace, handle)
        except Exception as err:  # noqa: BLE001 - frontend internals differ: the public execute
            log.debug("fusedattn_select: direct launch unavailable (%s: %s); using execute()",
                      type(err).__name__, err)
            self._direct = None
            return False
        self._direct_proven = True
        dispatcher.plan_stats["executes"] += 1
        return True


def _binds_in_order(graph: Any) -> bool:
    """Whether the graph's execute() takes `tensor_uids` (ordered binding, cudnn-frontend 1.32+)."""
    try:
        return "tensor_uids" in inspect.signature(graph.execute).parameters
    except (TypeError, ValueError):  # a compiled method without a signature: an older frontend
        return False


def _uids(slots: tuple[Any, ...]) -> Optional[tuple[int, ...]]:
    """The uids of graph tensors (a deserialized graph's tensors are uids already); None if any has none."""
    uids = []
    for tensor in slots:
        if isinstance(tensor, int):
            uids.append(tensor)
            continue
        uid = getattr(tensor, "uid", None)
        if uid is None and hasattr(tensor, "get_uid"):
            uid = tensor.get_uid()
        if callable(uid):
            uid = uid()
        if not isinstance(uid, int):
            return None
        uids.append(uid)
    return tuple(uids)


# ----- direct launch: execute() re-decides in Python, per call, what its first call decided (the plan, a Python
# engine or not, the binding schema); the launcher decides it once and makes the two compiled calls execute() ends in.
def direct_launcher(graph: Any, uids: tuple[int, ...]) -> Optional[Launcher]:
    """launch(buffers, workspace, handle) of a built graph the cuDNN backend serves, binding `buffers` in `uids`
    order; None where FUSEDATTN_SELECT_DIRECT_LAUNCH=0 or the graph or frontend lacks what it reads (internals)."""
    if not run_settings.get().direct_launch:  # ConfigError naming a variable when one is invalid
        return None
    try:
        lowered = graph._lowered_graph
        if lowered is None or not graph._is_built or graph.selected_engine is not None:
            return None  # not built yet, or a Python engine of the frontend serves it
        schema = graph._prepare_ordered_binding_schema()
        if schema is None:
            return None
        cpp_index = -1
        if graph._plans:
            placed = graph._materialize_backend_plan(graph._plan_index).cpp_index
            cpp_index = -1 if placed is None else placed
        bindings = graph._data_bindings
        execute_ordered, execute_pack, finish = lowered._execute_ordered, lowered._execute_ordered_pack, \
            graph._finish_ordered
    except AttributeError as err:
        log.debug("fusedattn_select: no direct launch with this cudnn-frontend (%s)", err)
        return None

    def launch(buffers: tuple, workspace: Any, handle: Any) -> None:
        backend_handle = getattr(handle, "backend_handle", handle) or 0
        result = execute_ordered(schema, buffers, uids, bindings, workspace, None, None, None, backend_handle,
                                 cpp_index)
        if result is not None:  # a buffer the compiled reader could not describe: the frontend's completion
            pack = finish(schema, result, workspace, None)
            execute_pack(pack.native, pack.workspace, backend_handle, cpp_index)

    return launch


# ----- handles and streams ----------------------------------------------------------------------

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# Whether this thread's current stream is capturing a CUDA graph (torch's C call: it runs per call).
is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing


def _prepare_handle(device: torch.device) -> tuple[Any, int]:
    """(this thread's cuDNN handle of `device`, pointed at the current torch stream; that stream), remembered per
    thread; `cudnn.set_stream` (several driver queries) runs only when the stream changed."""
    handles = getattr(dispatcher.per_thread, "handles", None)
    if handles is None:
        handles = dispatcher.per_thread.handles = {}
    index = device.index if device.index is not None else torch.cuda.current_device()
    slot = handles.get(index)
    if slot is None:
        slot = handles[index] = [cudnn_probe.handle_for(index), None]
    stream = _raw_stream(index) if _raw_stream is not None else torch.cuda.current_stream(device).cuda_stream
    if slot[1] != stream:
        import cudnn

        cudnn.set_stream(handle=slot[0], stream=stream)
        slot[1] = stream
    return slot[0], stream


# ----- workspace --------------------------------------------------------------------------------
def workspace_for(device: torch.device, size: int, stream: int) -> torch.Tensor:
    """The workspace of (device, `stream`), grown to at least `size` bytes; under CUDA-graph capture a new one from
    the graph's pool, so that no graph holds the address of a buffer other calls reuse."""
    # One per stream: its kernels run in order. The caching allocator keeps a replaced one alive for its stream.
    size = max(size, 1)  # some frontend versions want a buffer even when the plan needs none
    if is_capturing():
        return torch.empty(size, dtype=torch.uint8, device=device)
    key = (device.index if device.index is not None else torch.cuda.current_device(), stream)
    buffer = dispatcher.workspaces.get(key)
    if buffer is None or buffer.numel() < size:
        with dispatcher.workspace_lock:
            buffer = dispatcher.workspaces.get(key)
            if buffer is None or buffer.numel() < size:
                buffer = persistent(lambda: torch.empty(size, dtype=torch.uint8, device=device), device)
                dispatcher.workspaces[key] = buffer
    return buffer


def workspace_bytes() -> int:
    return sum(buffer.numel() for buffer in dispatcher.workspaces.values())


# ----- building ---------------------------------------------------------------------------------
def build_plan(cfg: AttnConfig, backend: Backend, phase: Phase, device: torch.device) -> Plan:
    """Build `phase` of `cfg` for `backend` on `device` (FULL depth); PlanBuildError carries the verdict to record
    (UNSUPPORTED: cuDNN rejects the graph; FAILED: an incident such as out of memory)."""
    # Static, without dynamic shapes and a kernel cache, which gave wrong results (docs/performance.md).
    index = device.index if device.index is not None else torch.cuda.current_device()
    started = time.perf_counter()
    try:
        with torch.cuda.device(index), cudnn_probe.device_context(index):
            build = cudnn_probe.build_graph(cfg, backend, phase, handle=cudnn_probe.handle_for(index),
                                            depth=ProbeDepth.FULL)
        plan = Plan(build, phase, device, cfg)
    except Exception as err:  # noqa: BLE001 - every failure becomes a recorded verdict
        verdict = cudnn_probe.verdict_from_exception(err, backend, phase, ProbeDepth.FULL, "build_plans")
        _count(build_failures=1)
        raise PlanBuildError(verdict) from err
    _count(builds=1, build_ms=(time.perf_counter() - started) * 1e3)
    return plan


def _count(**deltas: float) -> None:
    """Add `deltas` to the plan counters (plan_stats)."""
    with dispatcher.plan_stats_lock:
        dispatcher.plan_stats.update(deltas)


# ----- finding a plan: this process, the persistent store, a build -------------------------------

def obtain_plan(cfg: AttnConfig, backend: Backend, phase: Phase, device: torch.device, *,
                selector: Optional[Selector] = None) -> Plan:
    """The plan for `phase` of `cfg` on `backend` and `device`: this process's, the store's, or built.

    `selector` (the Selector that chose `backend`) provides the persistent store and the
    fingerprint plans are filed under; without one, or when its store keeps no plans (memory) or
    its engine is not live cuDNN on a device like this one, plans are built and kept in this
    process only. A stored plan that does not load is dropped with a warning and rebuilt. Raises
    PlanBuildError like build_plan.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    # Every shape of a bucket asks for the same plans: found by the problem's key, without
    # describing the graph again for its plan key.
    known = dispatcher.plans_by_problem.get((index, cfg.cache_key(), backend, phase))
    if known is not None:
        return known
    offpath.require(f"plans of {cfg.cache_key()}", offpath.STORED)
    try:
        with torch.cuda.device(index), cudnn_probe.device_context(index):
            key, signature = dispatch_plan_key(cfg, backend, phase, handle=cudnn_probe.handle_for(index))
    except Exception as err:  # noqa: BLE001 - a graph the frontend cannot describe will not build
        log.debug("fusedattn_select: no plan key for %s %s (%s: %s); building", cfg.cache_key(), phase.value,
                  type(err).__name__, err)
        return _build(cfg, backend, phase, device)
    plan_key = PlanKey(key, signature)
    plan, _ = dispatcher.plans.get_or_build((index, key),
                                            lambda: _load_or_build(cfg, backend, phase, device, plan_key, selector))
    dispatcher.plans_by_problem[(index, cfg.cache_key(), backend, phase)] = plan
    return plan


def _build(cfg: AttnConfig, backend: Backend, phase: Phase, device: torch.device) -> Plan:
    offpath.require(f"a build of {cfg.cache_key()}'s {phase.value} plan", None)
    return build_plan(cfg, backend, phase, device)


def _load_or_build(cfg: AttnConfig, backend: Backend, phase: Phase, device: torch.device,
                   plan_key: PlanKey, selector: Optional[Selector]) -> Plan:
    key, signature = plan_key
    index = device.index if device.index is not None else torch.cuda.current_device()
    store, fingerprint = _persistence(selector, index)

    def load(blob: bytes) -> Plan:
        started = time.perf_counter()
        with torch.cuda.device(index), cudnn_probe.device_context(index), loading_stream(index):
            handle, _ = _prepare_handle(device)  # pointed at the private stream (runtime/streams.py)
            stored = deserialize_graph(blob, key, handle=handle)
        _check_signature(stored, signature)
        plan = Plan(stored, phase, device, cfg)
        _count(loads=1, load_ms=(time.perf_counter() - started) * 1e3)
        return plan

    plan, origin = obtain(
        key, store=store, fingerprint=fingerprint, build=lambda: _build(cfg, backend, phase, device), load=load,
        serialize=lambda built: serialize_build(built.source, key),
    )
    plan.source = None  # serialized (or not persisted): the plan needs only its graph
    if origin == REBUILT:
        _count(load_failures=1)
    return plan


def _check_signature(stored: StoredGraph, signature: GraphSignature) -> None:
    """A loaded graph must bind exactly the tensors its plan key was computed from."""
    for name, (dims, strides, dtype) in signature.tensors.items():
        if name not in stored.tensors:
            raise PlanBlobError(f"the stored graph has no tensor {name!r}")
        got_dims, got_strides = stored.dims_strides[name]
        got_dtype = cudnn_type_name(stored.data_types[name])
        if (tuple(got_dims), tuple(got_strides), got_dtype) != (tuple(dims), tuple(strides), dtype):
            raise PlanBlobError(
                f"tensor {name!r} is {got_dims}/{got_strides}/{got_dtype} in the stored graph, "
                f"{dims}/{strides}/{dtype} in this one")
    extra = set(stored.tensors) - set(signature.tensors)
    if extra:
        raise PlanBlobError(f"the stored graph binds tensors this one lacks: {sorted(extra)}")


def _persistence(selector: Optional[Selector], index: int) -> tuple[Optional[Store], Optional[Fingerprint]]:
    """(store, fingerprint) to load and persist plans of device `index` with, or (None, None)."""
    if selector is None or not persists_plans(selector.store):
        return None, None
    fingerprint, engine = selector.fingerprint, selector.engine
    if fingerprint.platform != "cuda":
        return None, None
    if engine is None or engine.name != "cudnn":  # a snapshot's fingerprint is not this machine's
        return None, None
    if cast("CudnnEngine", engine).device != index and not _same_kind(fingerprint, index):
        return None, None
    return selector.store, fingerprint


def _same_kind(fingerprint: Fingerprint, index: int) -> bool:
    """Whether device `index` is the kind of GPU the fingerprint describes (name, arch, SM count)."""
    try:
        props = torch.cuda.get_device_properties(index)
    except Exception:  # noqa: BLE001
        return False
    return (props.name == fingerprint.device_name and f"{props.major}.{props.minor}" == fingerprint.compute_capability
            and props.multi_processor_count == fingerprint.sm_count)
