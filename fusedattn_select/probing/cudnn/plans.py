"""Serialized cuDNN execution plans in the persistent store: keys, blobs, and load-or-build.

A plan that attention() runs is a cuDNN graph built to ProbeDepth.FULL (a few hundred ms: kernels
are compiled). cudnn-frontend can serialize a built graph and deserialize it in another process
(~20 ms instead of ~250 ms, bit-exact: design.md section 8), so the persistent store keeps one blob
per graph and a later process loads instead of building. This module holds what dispatch and
warmup share; it does not import torch (warmup persists plans without it).

The plan key
------------
`plan_key(cfg, backend, phase, signature)` is the sha256 of everything that makes the graph:

- the blob format version (PLAN_FORMAT) and the build mode ("static": dispatch builds without
  cuDNN's kernel cache, see dispatch_plans.build_plan);
- the problem: `cfg.cache_key()` and every resolved AttnConfig field (`cfg.resolved()`: batch,
  heads, sequence lengths, head dims, dtypes, layouts, mask, window, scale, dropout, bias, softmax,
  training, determinism, CUDA-graph flag ...);
- the backend, the phase and the frontend operation;
- the graph's call signature (`graph_signature`): dims, strides and dtype of every tensor the
  graph binds (the layout attention() conforms the caller's tensors to) and the SDPA operation's
  non-tensor arguments, read from the graph description itself, so a change in how this library
  describes a graph changes the key even without a version bump.

The cuDNN backend and frontend versions, the GPU and the driver are not in the key: the store
files every plan under the Fingerprint (PersistentStore.get_plan(fingerprint, plan_key)), and a
plan from another fingerprint is never read. Dispatch and warmup compute the key from the same
AttnConfig through the same function, which is what makes a warmed plan the one dispatch finds.

The blob
--------
MAGIC, a 4-byte header length, a JSON header, then cudnn-frontend's serialized graph. The header
names the plan key it was built for and, for every named tensor, its uid in the serialized graph,
its dims, strides and cuDNN data type, so a deserialized graph is bound by uid without rebuilding
its description. A blob whose magic, format or plan key does not match is refused like one that
fails to deserialize: dropped with a warning and rebuilt (the rebuilt blob replaces it). The store
checks each blob's sha256 and size and only reads plans from a directory owned by the user and
not writable by others (cache.py), since a plan loads native code.

Load or build: `obtain`
-----------------------
    blob = store.get_plan(fingerprint, key)          -> load it (origin "loaded")
    unusable blob                                    -> warning, then as a miss
    with store.key_lock(fingerprint, "plan-" + key): # one builder per key across processes
        blob = store.get_plan(...)  (a new one)      -> load it: another process built it meanwhile
        build, serialize, store.put_plan(...)        -> origin "built" ("rebuilt" after a bad blob)
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

from fusedattn_select.config import AttnConfig
from fusedattn_select.types import Backend, Phase, ProbeDepth

log = logging.getLogger("fusedattn_select")

PLAN_FORMAT = 1
BUILD_MODE = "static"
MAGIC = b"FASPLAN\x00"
_HEADER_LENGTH = struct.Struct("<I")
LOCK_PREFIX = "plan-"

# Origins reported by obtain().
LOADED, BUILT, REBUILT = "loaded", "built", "rebuilt"

# Layouts attention() runs (separate Q, K, V tensors in BSHD, SBHD or BHSD memory; dispatch.py).
DISPATCH_LAYOUTS = frozenset({
    "bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd", "sbhd_bshd_bshd", "bshd_sbhd_sbhd",
})

T = TypeVar("T")


class PlanBlobError(ValueError):
    """A stored blob that must not be used (wrong magic, format, plan key or header)."""


# ----- the plan key ------------------------------------------------------------------------------
def _canonical(value: Any) -> Any:
    """JSON-stable form of a graph argument: numbers, strings and lists as they are, enums by name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    return str(value)


def _dtype_name(dtype: Any) -> str:
    name = getattr(dtype, "name", None)
    return str(name) if name else str(dtype).rsplit(".", 1)[-1]


@dataclass(frozen=True)
class GraphSignature:
    """The call signature of one graph: what it binds and the SDPA arguments it was given."""

    operation: str
    tensors: Mapping[str, tuple[tuple[int, ...], tuple[int, ...], str]]  # name -> (dims, strides, dtype)
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "operation": self.operation,
            "tensors": {name: [list(d), list(s), t] for name, (d, s, t) in sorted(self.tensors.items())},
            "options": _canonical(dict(self.options)),
        }


def graph_signature(cfg: AttnConfig, backend: Backend, phase: Phase, *, handle: Any = None) -> GraphSignature:
    """The signature of the graph build_graph makes for `phase` of `cfg`, from its description.

    Describing is cheap (well under a millisecond once the frontend is warm) and touches no device
    memory; raises CudnnUnsupported when the installed frontend cannot express the problem.
    """
    from fusedattn_select.probing.cudnn.graphs import describe_graph

    described = describe_graph(cfg, backend, phase, handle=handle)
    tensors = {
        name: (tuple(dims), tuple(strides), _dtype_name(described.data_types[name]))
        for name, (dims, strides) in described.dims_strides.items()
    }
    return GraphSignature(described.operation, tensors, dict(described.options))


def plan_key(cfg: AttnConfig, backend: Backend | str, phase: Phase | str, signature: GraphSignature, *,
             build: str = BUILD_MODE) -> str:
    """The store key of the plan for `phase` of `cfg` on `backend` (64 hex digits; see the module doc)."""
    payload = {
        "format": PLAN_FORMAT,
        "build": build,
        "cache_key": cfg.cache_key(),
        "config": _canonical(cfg.resolved()),
        "backend": Backend(backend).value,
        "phase": Phase(phase).value,
        "graph": signature.to_dict(),
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# ----- the blob ----------------------------------------------------------------------------------
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


def _graph_bytes(graph: Any) -> bytes:
    try:
        data = graph.serialize(as_bytes=True)
    except TypeError:  # frontends before 1.30: a list of byte values
        data = graph.serialize()
    return bytes(data)


def serialize_build(build: Any, plan_key: str) -> bytes:
    """The blob of a FULL GraphBuild (probing.cudnn_graphs): header + the frontend's serialization."""
    from fusedattn_select.probing.cudnn.graphs import frontend_features

    tensors = {}
    for name, tensor in build.tensors.items():
        dims, strides = build.dims_strides[name]
        tensors[name] = TensorRecord(_uid(tensor), tuple(dims), tuple(strides), _dtype_name(build.data_types[name]))
    header = PlanHeader(plan_key, str(build.operation), int(build.workspace_size), tensors,
                        frontend_features().version)
    return pack(header, _graph_bytes(build.graph))


@dataclass
class StoredGraph:
    """A deserialized graph in the shape dispatch_plans.Plan reads from a GraphBuild.

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


# ----- load or build -----------------------------------------------------------------------------
def persists_plans(store: Any) -> bool:
    """Whether `store` keeps plans for other processes (a MemoryStore does not: nothing to gain)."""
    return store is not None and hasattr(store, "get_plan") and getattr(store, "kind", "") != "memory"


def _get(store: Any, fingerprint: Any, key: str) -> bytes | None:
    try:
        return store.get_plan(fingerprint, key)
    except Exception as err:  # noqa: BLE001 - a store never breaks dispatch
        log.warning("fusedattn_select: reading plan %s from the store raised %s: %s; treated as a miss",
                    key[:16], type(err).__name__, err)
        return None


def _try_load(load: Callable[[bytes], T], blob: bytes, key: str, store: Any) -> tuple[T | None, bool]:
    """(loaded object or None, whether the blob was unusable)."""
    try:
        return load(blob), False
    except Exception as err:  # noqa: BLE001 - any failure to load means: rebuild
        where = getattr(store, "path", None) or type(store).__name__
        log.warning("fusedattn_select: dropped the stored plan %s from %s: it does not load (%s: %s); "
                    "building it again", key[:16], where, type(err).__name__, " ".join(str(err).split())[:300])
        return None, True


def obtain(key: str, *, store: Any, fingerprint: Any, build: Callable[[], T], serialize: Callable[[T], bytes],
           load: Callable[[bytes], T]) -> tuple[T, str]:
    """The object for plan `key`: loaded from `store`, else built and persisted. Returns (object, origin).

    origin is LOADED, BUILT, or REBUILT (a stored blob did not load, was dropped and rebuilt; the
    new blob replaces it). `build` errors propagate (nothing is stored); a `serialize` error or a
    refused write leaves the built object usable, unpersisted. Builds of one key are serialised
    across threads and processes by the store's key lock, so concurrent callers build once and
    the others load the result.
    """
    if not persists_plans(store):
        return build(), BUILT
    bad: bytes | None = None
    blob = _get(store, fingerprint, key)
    if blob is not None:
        loaded, unusable = _try_load(load, blob, key, store)
        if not unusable:
            return loaded, LOADED  # type: ignore[return-value]
        bad = blob
    key_lock = getattr(store, "key_lock", None)
    with key_lock(fingerprint, LOCK_PREFIX + key) if key_lock is not None else _null():
        blob = _get(store, fingerprint, key)
        if blob is not None and blob != bad:  # another process stored it while this one waited
            loaded, unusable = _try_load(load, blob, key, store)
            if not unusable:
                return loaded, LOADED  # type: ignore[return-value]
            bad = blob
        built = build()
        try:
            data = serialize(built)
        except Exception as err:  # noqa: BLE001 - the plan runs; it just is not persisted
            log.warning("fusedattn_select: plan %s was built but cannot be serialized (%s: %s); not persisted",
                        key[:16], type(err).__name__, err)
        else:
            store.put_plan(fingerprint, key, data)
    return built, (REBUILT if bad is not None else BUILT)


class _null:
    def __enter__(self) -> bool:
        return True

    def __exit__(self, *exc: object) -> None:
        return None


# ----- which configs attention() runs ------------------------------------------------------------
def dispatch_config(cfg: AttnConfig) -> AttnConfig | None:
    """The AttnConfig attention() derives from dense tensors of `cfg`'s layout, or None if none.

    The same construction as dispatch._config (which needs torch): the fields a call can express,
    everything else at its default. Plans are warmed only where this equals `cfg` (same cache
    key), since only then does dispatch ask for the same plan keys.
    """
    if cfg.qkv_layout not in DISPATCH_LAYOUTS or cfg.cuda_graph:
        return None
    fields: dict[str, Any] = {}
    if cfg.is_fp8:
        # attention(fp8=...) quantizes with current scaling; its output precision is the input's.
        fields.update(qkv_dtype=cfg.qkv_dtype, o_dtype=cfg.o_dtype, scaling_mode="current")
    else:
        fields.update(qkv_dtype=cfg.qkv_dtype)
    if cfg.bias == "post_scale_bias":
        fields.update(bias="post_scale_bias", bias_shape=cfg.bias_shape)
    elif cfg.bias == "alibi":
        fields.update(bias="alibi")
    elif cfg.bias != "no_bias":
        return None
    try:
        candidate = AttnConfig(
            batch_size=cfg.batch_size, num_heads_q=cfg.num_heads_q, num_heads_kv=cfg.num_heads_kv,
            seqlen_q=cfg.seqlen_q, seqlen_kv=cfg.seqlen_kv, head_dim_qk=cfg.head_dim_qk,
            head_dim_v=cfg.resolved_head_dim_v if cfg.resolved_head_dim_v != cfg.head_dim_qk else None,
            qkv_layout=cfg.qkv_layout, mask=cfg.mask, softmax=cfg.softmax, window_size=tuple(cfg.window_size),
            dropout=cfg.dropout, attn_scale=cfg.attn_scale, is_training=cfg.is_training,
            deterministic=cfg.deterministic, **fields,
        )
    except Exception:  # noqa: BLE001 - a field combination attention() cannot make
        return None
    return candidate if candidate.cache_key() == cfg.cache_key() else None


def not_dispatched_reason(cfg: AttnConfig) -> str:
    """Why attention() never asks for the plans of `cfg` ("" when it does)."""
    if cfg.qkv_layout not in DISPATCH_LAYOUTS:
        return f"qkv_layout={cfg.qkv_layout!r} is not a layout attention() runs"
    if cfg.cuda_graph:
        return "cuda_graph=True: under capture attention() reuses the plans of the eager call"
    if dispatch_config(cfg) is None:
        return "attention() derives a different config from tensors of this problem"
    return ""


def phases(cfg: AttnConfig) -> tuple[Phase, ...]:
    """The graphs dispatch runs for `cfg`: forward, and backward when training."""
    return (Phase.FORWARD, Phase.BACKWARD) if cfg.is_training else (Phase.FORWARD,)


# ----- warmup: build and persist without torch ---------------------------------------------------
@dataclass(frozen=True)
class PersistResult:
    """What persist_plans did for one config: plans built now, plans already stored, and a note."""

    built: int = 0
    stored: int = 0
    note: str = ""
    failure: Any = None  # a Verdict when a plan did not build (UNSUPPORTED or FAILED)


def persist_plans(cfg: AttnConfig, backend: Backend, *, store: Any, fingerprint: Any, device: int) -> PersistResult:
    """Build and store the plans attention() will run for `cfg` on CUDA device `device`, unless stored.

    Plans are built the way dispatch builds them (build_graph, FULL, static, this thread's handle),
    under the store's plan key lock. Needs cudnn-frontend and cuda-python, not torch.
    """
    from fusedattn_select.probing.cudnn import engine as cudnn_probe
    from fusedattn_select.types import Outcome, Verdict
    built = stored = 0
    for phase in phases(cfg):
        with cudnn_probe.device_context(device):
            handle = cudnn_probe.handle_for(device)
            try:
                key = plan_key(cfg, backend, phase, graph_signature(cfg, backend, phase, handle=handle))

                def build(phase: Phase = phase, handle: Any = handle) -> Any:
                    return cudnn_probe.build_graph(cfg, backend, phase, handle=handle, depth=ProbeDepth.FULL)

                _, origin = obtain(key, store=store, fingerprint=fingerprint, build=build,
                                   serialize=lambda b, key=key: serialize_build(b, key),
                                   load=lambda blob, key=key: unpack(blob, key))
            except (cudnn_probe.CudnnUnsupported, cudnn_probe.ProbeFailure) as err:
                unsupported = isinstance(err, cudnn_probe.CudnnUnsupported)
                verdict = Verdict(backend=backend, phase=phase,
                                  outcome=Outcome.UNSUPPORTED if unsupported else Outcome.FAILED,
                                  stage=err.stage, message=err.message, detail=err.detail, depth=ProbeDepth.FULL)
                return PersistResult(built, stored, f"{phase.value} plan did not build: {verdict.reason()}", verdict)
        if origin == LOADED:
            stored += 1
        else:
            built += 1
    return PersistResult(built, stored)
