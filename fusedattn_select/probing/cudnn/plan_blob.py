"""A plan blob: MAGIC, a 4-byte header length, a JSON header, then cudnn-frontend's serialized graph.

The header names the plan key the blob was built for and, for every named tensor, its uid in the
serialized graph, its dims, strides and cuDNN data type, so a deserialized graph is bound by uid
without rebuilding its description. A blob whose magic, format or plan key does not match is
refused (PlanBlobError) like one that fails to deserialize. The store checks each blob's sha256
and size and only reads plans from a directory owned by the user and not writable by others
(store.sqlite), since a plan loads native code. Torch-free; cudnn-frontend is imported only to
serialize and deserialize.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Mapping

from fusedattn_select.probing.cudnn.features import frontend_features

PLAN_FORMAT = 1
MAGIC = b"FASPLAN\x00"
_HEADER_LENGTH = struct.Struct("<I")


class PlanBlobError(ValueError):
    """A stored blob that must not be used (wrong magic, format, plan key or header)."""


def cudnn_type_name(data_type: Any) -> str:
    """The cudnn.data_type member name ("BFLOAT16") that signatures and blob headers record."""
    name = getattr(data_type, "name", None)
    return str(name) if name else str(data_type).rsplit(".", 1)[-1]


@dataclass(frozen=True)
class TensorRecord:
    uid: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str  # cudnn.data_type member name


@dataclass(frozen=True)
class PlanHeader:
    """What a blob says about its graph besides cuDNN's own bytes."""

    plan_key: str
    operation: str
    workspace_size: int
    tensors: Mapping[str, TensorRecord]
    frontend: str = ""

    def to_dict(self) -> dict:
        return {
            "format": PLAN_FORMAT,
            "plan_key": self.plan_key,
            "operation": self.operation,
            "workspace_size": int(self.workspace_size),
            "frontend": self.frontend,
            "tensors": {
                name: {"uid": int(t.uid), "dims": list(t.dims), "strides": list(t.strides), "dtype": t.dtype}
                for name, t in sorted(self.tensors.items())
            },
        }

    @classmethod
    def from_dict(cls, data: Any) -> "PlanHeader":
        try:
            if data["format"] != PLAN_FORMAT:
                raise PlanBlobError(f"blob format {data['format']!r}, this version reads {PLAN_FORMAT}")
            tensors = {
                str(name): TensorRecord(int(t["uid"]), tuple(int(x) for x in t["dims"]),
                                        tuple(int(x) for x in t["strides"]), str(t["dtype"]))
                for name, t in data["tensors"].items()
            }
            header = cls(str(data["plan_key"]), str(data["operation"]), int(data["workspace_size"]), tensors,
                         str(data.get("frontend", "")))
        except PlanBlobError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise PlanBlobError(f"blob header does not parse ({type(err).__name__}: {err})") from None
        if not header.tensors:
            raise PlanBlobError("blob header names no tensors")
        return header


def pack(header: PlanHeader, graph_bytes: bytes) -> bytes:
    """MAGIC + header length + JSON header + the frontend's serialized graph."""
    text = json.dumps(header.to_dict(), sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + _HEADER_LENGTH.pack(len(text)) + text + bytes(graph_bytes)


def unpack(blob: bytes, plan_key: str | None = None) -> tuple[PlanHeader, bytes]:
    """(header, graph bytes) of a blob; PlanBlobError when it is not a plan for `plan_key`."""
    blob = bytes(blob)
    start = len(MAGIC) + _HEADER_LENGTH.size
    if len(blob) < start or not blob.startswith(MAGIC):
        raise PlanBlobError("not a fusedattn-select plan blob (magic does not match)")
    (length,) = _HEADER_LENGTH.unpack_from(blob, len(MAGIC))
    if length > len(blob) - start:
        raise PlanBlobError(f"blob header claims {length} bytes, {len(blob) - start} follow (truncated)")
    try:
        data = json.loads(blob[start:start + length])
    except ValueError as err:
        raise PlanBlobError(f"blob header is not JSON ({err})") from None
    header = PlanHeader.from_dict(data)
    if plan_key is not None and header.plan_key != plan_key:
        raise PlanBlobError(f"blob was built for plan {header.plan_key[:16]}, not {plan_key[:16]}")
    graph_bytes = blob[start + length:]
    if not graph_bytes:
        raise PlanBlobError("blob holds no serialized graph")
    return header, graph_bytes


# ----- cudnn-frontend: serialize a build, deserialize a blob ------------------------------------
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
