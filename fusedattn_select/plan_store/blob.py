"""A plan blob: MAGIC, a 4-byte header length, a JSON header, then cudnn-frontend's serialized graph.

The header names the plan key the blob was built for and, for every named tensor, its uid in the
serialized graph, its dims, strides and cuDNN data type, so a deserialized graph is bound by uid
without rebuilding its description. A blob whose magic, format or plan key does not match is
refused (PlanBlobError) like one that fails to deserialize. The store checks each blob's sha256
and size and only reads plans from a directory owned by the user and not writable by others
(store.sqlite), since a plan loads native code. Torch-free and cuDNN-free: the engine that builds
plans serializes and deserializes cuDNN's part (probing/cudnn/plan_graphs.py).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Mapping

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
