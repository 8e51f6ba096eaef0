"""Serialized cuDNN execution plans in the persistent store: keys, blobs, and load-or-build.

A plan that attention() runs is a cuDNN graph built to ProbeDepth.FULL (kernels are compiled).
cudnn-frontend can serialize a built graph and deserialize it in another process (bit-exact, and
an order of magnitude faster than building: docs/performance.md), so the persistent store keeps one blob per graph and a
later process loads instead of building. This module holds what dispatch and warmup share; it
does not import torch (warmup persists plans without it).

The plan key
------------
`plan_key(cfg, backend, phase, signature)` is the sha256 of everything that makes the graph:

- the blob format version (PLAN_FORMAT) and the build mode ("static": dispatch builds without
  cuDNN's kernel cache, see runtime.plans.build_plan);
- the problem: `cfg.cache_key()` and every resolved AttnConfig field (`cfg.resolved()`: batch,
  heads, sequence lengths, head dims, dtypes, layouts, mask, window, scale, dropout, bias, softmax,
  training, determinism, CUDA-graph flag ...);
- the backend, the phase and the frontend operation;
- the graph's call signature (`graph_signature`): dims, strides and dtype of every tensor the
  graph binds (the layout attention() conforms the caller's tensors to) and the SDPA operation's
  non-tensor arguments, read from the graph description itself, so a change in how this library
  describes a graph changes the key even without a version bump.

The cuDNN backend and frontend versions, the GPU and the driver are not in the key: the store
files every plan under the Fingerprint (Store.get_plan(fingerprint, plan_key)), and a plan from
another fingerprint is never read. Dispatch and warmup both compute the key with
`dispatch_plan_key`, from an AttnConfig built by the same `TensorProblem.config`, which is what
makes a warmed plan the one dispatch finds.

The blob format is in plan_blob.py. A blob that does not load is dropped with a warning and
rebuilt (the rebuilt blob replaces it).

`obtain` loads a stored plan or builds and stores it, once per key across processes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, TypeVar

from fusedattn_select import dtypes
from fusedattn_select.config import AttnConfig
from fusedattn_select.layouts import SEPARATE_LAYOUTS
from fusedattn_select.probing.cudnn.device import device_context, handle_for
from fusedattn_select.probing.cudnn.graphs import build_graph, describe_graph
from fusedattn_select.probing.cudnn.messages import CudnnUnsupported, ProbeFailure, verdict_from_exception
from fusedattn_select.probing.cudnn.plan_blob import PLAN_FORMAT, cudnn_type_name, serialize_build, unpack
from fusedattn_select.single_flight import read_or_make
from fusedattn_select.store.protocol import Store
from fusedattn_select.types import Backend, Fingerprint, Phase, ProbeDepth, Verdict

log = logging.getLogger("fusedattn_select")

BUILD_MODE = "static"
LOCK_PREFIX = "plan-"

# Origins reported by obtain().
LOADED, BUILT, REBUILT = "loaded", "built", "rebuilt"

# Tensors a graph writes, per phase; every other named tensor is an input the caller or the plan
# provides. O and the softmax stats are outputs of the forward graph and inputs of the backward one.
OUTPUT_NAMES = {
    Phase.FORWARD: frozenset({"o", "stats", "max_logit", "amax_s", "amax_o"}),
    Phase.BACKWARD: frozenset({"dQ", "dK", "dV", "dBias", "dSink_token", "amax_dP", "amax_dQ", "amax_dK", "amax_dV"}),
}

T = TypeVar("T")


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

    described = describe_graph(cfg, backend, phase, handle=handle)
    tensors = {
        name: (tuple(dims), tuple(strides), cudnn_type_name(described.data_types[name]))
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


# ----- the plan key of a problem: what dispatch and warmup both call ------------------------------
class PlanKey(NamedTuple):
    """The store key of one plan and the graph call signature it was computed from."""

    key: str
    signature: GraphSignature


def dispatch_plan_key(cfg: AttnConfig, backend: Backend, phase: Phase, *, handle: Any = None) -> PlanKey:
    """The key attention() looks up, and warmup stores under, for `phase` of `cfg` on `backend`.

    `cfg` is the config attention() runs: `TensorProblem.config()` of the call (warmup gets it from
    `dispatch_config`). Raises CudnnUnsupported when the frontend cannot describe the graph.
    """
    signature = graph_signature(cfg, backend, phase, handle=handle)
    return PlanKey(plan_key(cfg, backend, phase, signature), signature)


# ----- load or build -----------------------------------------------------------------------------
def persists_plans(store: Store | None) -> bool:
    """Whether `store` keeps plans for other processes (a memory store does not: nothing to gain)."""
    return store is not None and store.persistent and store.plans_enabled


def _get(store: Store, fingerprint: Fingerprint, key: str) -> bytes | None:
    try:
        return store.get_plan(fingerprint, key)
    except Exception as err:  # noqa: BLE001 - a store never breaks dispatch
        log.warning("fusedattn_select: reading plan %s from the store raised %s: %s; treated as a miss",
                    key[:16], type(err).__name__, err)
        return None


def _try_load(load: Callable[[bytes], T], blob: bytes, key: str, store: Store) -> T | None:
    """The loaded object, or None (with a warning) when the blob does not load."""
    try:
        return load(blob)
    except Exception as err:  # noqa: BLE001 - any failure to load means: rebuild
        where = store.path or type(store).__name__
        log.warning("fusedattn_select: dropped the stored plan %s from %s: it does not load (%s: %s); "
                    "building it again", key[:16], where, type(err).__name__, " ".join(str(err).split())[:300])
        return None


def obtain(key: str, *, store: Store | None, fingerprint: Fingerprint, build: Callable[[], T],
           serialize: Callable[[T], bytes], load: Callable[[bytes], T]) -> tuple[T, str]:
    """The object for plan `key`: loaded from `store`, else built and persisted. Returns (object, origin).

    origin is LOADED, BUILT, or REBUILT (a stored blob did not load, was dropped and rebuilt; the
    new blob replaces it). `build` errors propagate (nothing is stored); a `serialize` error or a
    refused write leaves the built object usable, unpersisted. Builds of one key are serialised
    across threads and processes by the store's key lock, so concurrent callers build once and
    the others load the result.
    """
    if store is None or not persists_plans(store):
        return build(), BUILT
    unusable: list[bytes] = []

    def read() -> T | None:
        blob = _get(store, fingerprint, key)
        if blob is None or blob in unusable:  # the same bad blob is not tried twice
            return None
        loaded = _try_load(load, blob, key, store)
        if loaded is None:
            unusable.append(blob)
        return loaded

    def make() -> T:
        built = build()
        try:
            data = serialize(built)
        except Exception as err:  # noqa: BLE001 - the plan runs; it just is not persisted
            log.warning("fusedattn_select: plan %s was built but cannot be serialized (%s: %s); not persisted",
                        key[:16], type(err).__name__, err)
        else:
            store.put_plan(fingerprint, key, data)
        return built

    value, made = read_or_make(read, make, store.key_lock(fingerprint, LOCK_PREFIX + key))
    if not made:
        return value, LOADED
    return value, (REBUILT if unusable else BUILT)


# ----- which configs attention() runs ------------------------------------------------------------
# The AttnConfig fields a call of attention() sets (read off its tensors and options); every other
# field keeps its default.
CALL_FIELDS = (
    "batch_size", "num_heads_q", "num_heads_kv", "seqlen_q", "seqlen_kv", "head_dim_qk", "head_dim_v",
    "qkv_layout", "qkv_dtype", "o_dtype", "bias", "bias_shape", "mask", "softmax", "window_size", "dropout",
    "attn_scale", "is_training", "deterministic",
)
# Biases a call expresses: none, a post-scale bias tensor, or ALiBi slopes.
CALL_BIASES = ("no_bias", "post_scale_bias", "alibi")


def call_config(fields: Mapping[str, Any]) -> AttnConfig:
    """The AttnConfig attention() selects and runs for a call with these CALL_FIELDS, torch-free, so
    warmup and dispatch make the same one: head_dim_v only where it differs, FP8 calls scaled per
    call ("current"), a bias shape only for a post-scale bias. ConfigError where AttnConfig rejects it.
    """
    given = dict(fields)
    unknown = sorted(set(given) - set(CALL_FIELDS))
    if unknown:
        raise TypeError(f"call_config() got fields a call does not set: {unknown}")
    if given.get("head_dim_v") == given["head_dim_qk"]:
        given["head_dim_v"] = None
    if dtypes.BY_NAME[given["qkv_dtype"]].is_fp8:
        given["scaling_mode"] = "current"
    else:
        given.pop("o_dtype", None)
    if given.get("bias", "no_bias") != "post_scale_bias":
        given.pop("bias_shape", None)
    if given.get("attn_scale") is not None:
        given["attn_scale"] = float(given["attn_scale"])
    given["window_size"] = tuple(given.get("window_size", (-1, -1)))
    return AttnConfig(**given)


def dispatch_config(cfg: AttnConfig) -> AttnConfig | None:
    """The AttnConfig attention() derives from dense tensors of `cfg`'s layout, or None if none.

    Plans are warmed only where this equals `cfg` (same cache key), since only then does dispatch
    ask for the same plan keys.
    """
    if cfg.qkv_layout not in SEPARATE_LAYOUTS or cfg.cuda_graph:
        return None
    if cfg.bias not in CALL_BIASES:
        return None
    fields = {name: getattr(cfg, name) for name in CALL_FIELDS}
    try:
        candidate = call_config(dict(fields, head_dim_v=cfg.resolved_head_dim_v))
    except Exception:  # noqa: BLE001 - a field combination attention() cannot make
        return None
    return candidate if candidate.cache_key() == cfg.cache_key() else None


def not_dispatched_reason(cfg: AttnConfig) -> str:
    """Why attention() never asks for the plans of `cfg` ("" when it does)."""
    if cfg.qkv_layout not in SEPARATE_LAYOUTS:
        return f"qkv_layout={cfg.qkv_layout!r} is not a layout attention() runs"
    if cfg.cuda_graph:
        return "cuda_graph=True: under capture attention() reuses the plans of the eager call"
    if dispatch_config(cfg) is None:
        return "attention() derives a different config from tensors of this problem"
    return ""


# ----- warmup: build and persist without torch ---------------------------------------------------
@dataclass(frozen=True)
class PersistResult:
    """What persist_plans did for one config: plans built now, plans already stored, and a note."""

    built: int = 0
    stored: int = 0
    note: str = ""
    failure: Verdict | None = None  # when a plan did not build (UNSUPPORTED or FAILED)


def persist_plans(cfg: AttnConfig, backend: Backend, *, store: Store, fingerprint: Fingerprint,
                  device: int) -> PersistResult:
    """Build and store the plans attention() will run for `cfg` on CUDA device `device`, unless stored.

    Plans are built the way dispatch builds them (build_graph, FULL, static, this thread's handle),
    under the store's plan key lock. Needs cudnn-frontend and cuda-python, not torch.
    """
    built = stored = 0
    for phase in cfg.phases:
        with device_context(device):
            handle = handle_for(device)
            try:
                key = dispatch_plan_key(cfg, backend, phase, handle=handle).key

                def build(phase: Phase = phase, handle: Any = handle) -> Any:
                    return build_graph(cfg, backend, phase, handle=handle, depth=ProbeDepth.FULL)

                _, origin = obtain(key, store=store, fingerprint=fingerprint, build=build,
                                   serialize=lambda b, key=key: serialize_build(b, key),
                                   load=lambda blob, key=key: unpack(blob, key))
            except (CudnnUnsupported, ProbeFailure) as err:
                verdict = verdict_from_exception(err, backend, phase, ProbeDepth.FULL)
                return PersistResult(built, stored, f"{phase.value} plan did not build: {verdict.reason()}", verdict)
        if origin == LOADED:
            stored += 1
        else:
            built += 1
    return PersistResult(built, stored)
