"""cuDNN's side of persisted plans: a graph's call signature and plan key, and its serialized form.

The plan key and the blob format are plan_store's (keys.py, blob.py); this module fills them from
cudnn-frontend graphs: `graph_signature` reads a graph's description, `serialize_build` packs a
FULL GraphBuild into a blob, and `deserialize_graph` loads a blob into a graph ready to execute.
Torch-free; cudnn-frontend is imported only to describe, serialize and deserialize.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fusedattn_select.config import AttnConfig
from fusedattn_select.plan_store import keys
from fusedattn_select.plan_store.blob import PlanBlobError, PlanHeader, TensorRecord, cudnn_type_name, pack, unpack
from fusedattn_select.plan_store.keys import GraphSignature, PlanKey
from fusedattn_select.probing.cudnn.features import frontend_features
from fusedattn_select.probing.cudnn.graphs import describe_graph
from fusedattn_select.types import Backend, Phase


# ----- the plan key of a problem: what dispatch and warmup both call ------------------------------
def graph_signature(cfg: AttnConfig, backend: Backend, phase: Phase, *, handle: Any = None) -> GraphSignature:
    """The signature of the graph build_graph makes for `phase` of `cfg`, from its description.

    Describing is cheap (well under a millisecond once the frontend is warm) and touches no device
    memory; raises CudnnUnsupported when the installed frontend cannot express the problem.
    """
    described = describe_graph(cfg, backend, phase, handle=handle)
    tensors = {
        name: (tuple(dims), tuple(strides), cudnn_type_name(described.data_types[name]))
        for name, (dims, strides) in described.dims_strides.items()
    }
    return GraphSignature(described.operation, tensors, dict(described.options))


def dispatch_plan_key(cfg: AttnConfig, backend: Backend, phase: Phase, *, handle: Any = None) -> PlanKey:
    """The key attention() looks up, and warmup stores under, for `phase` of `cfg` on `backend`.

    `cfg` is the config attention() runs: `TensorProblem.config()` of the call (warmup gets it from
    plan_store.calls.dispatch_config). Raises CudnnUnsupported when the frontend cannot describe the graph.
    """
    signature = graph_signature(cfg, backend, phase, handle=handle)
    return PlanKey(keys.plan_key(cfg, backend, phase, signature), signature)


# ----- serialize a build, deserialize a blob ---------------------------------------------------
def _uid(tensor: Any) -> int:
    getter = getattr(tensor, "get_uid", None)
    uid = getter() if callable(getter) else getattr(tensor, "uid", None)
    if uid is None or int(uid) < 0:
        raise PlanBlobError(f"graph tensor {tensor!r} has no uid")
    return int(uid)


def graph_bytes(graph: Any) -> bytes:
    """The frontend's serialization of a built graph."""
    try:
        data = graph.serialize(as_bytes=True)
    except TypeError:  # frontends before 1.30: a list of byte values
        data = graph.serialize()
    return bytes(data)


def serialize_build(build: Any, plan_key: str) -> bytes:
    """The blob of a FULL GraphBuild (probing.cudnn.graphs): header + the frontend's serialization."""

    tensors = {}
    for name, tensor in build.tensors.items():
        dims, strides = build.dims_strides[name]
        tensors[name] = TensorRecord(_uid(tensor), tuple(dims), tuple(strides), cudnn_type_name(build.data_types[name]))
    header = PlanHeader(plan_key, str(build.operation), int(build.workspace_size), tensors,
                        frontend_features().version)
    return pack(header, graph_bytes(build.graph))


@dataclass
class StoredGraph:
    """A deserialized graph in the shape runtime.plans.Plan reads from a GraphBuild.

    `tensors` maps each name to its uid (the variant pack of a deserialized graph is keyed by uid).
    """

    graph: Any
    tensors: dict[str, int]
    dims_strides: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
    data_types: dict[str, Any]
    operation: str
    workspace_size: int
    dynamic_shapes: bool = False


def deserialize_graph(blob: bytes, plan_key: str, *, handle: Any) -> StoredGraph:
    """Load a blob into a fresh graph on `handle`'s device (its CUDA context current).

    Raises PlanBlobError for a blob that is not this plan's, or the frontend's own error when
    cuDNN cannot load it (another cuDNN, a damaged graph).
    """
    import cudnn

    header, graph_bytes = unpack(blob, plan_key)
    try:
        data_types = {name: getattr(cudnn.data_type, t.dtype) for name, t in header.tensors.items()}
    except AttributeError as err:
        raise PlanBlobError(f"blob names a data type this frontend lacks ({err})") from None
    graph = cudnn.pygraph(handle=handle)
    try:
        graph.deserialize(handle, graph_bytes)
    except TypeError:  # a frontend that takes the legacy list of byte values
        graph.deserialize(handle, list(graph_bytes))
    workspace = header.workspace_size
    try:
        workspace = max(workspace, int(graph.get_workspace_size()))
    except Exception:  # noqa: BLE001 - the header's size is the build's own answer
        pass
    return StoredGraph(
        graph=graph,
        tensors={name: t.uid for name, t in header.tensors.items()},
        dims_strides={name: (t.dims, t.strides) for name, t in header.tensors.items()},
        data_types=data_types,
        operation=header.operation,
        workspace_size=workspace,
    )
