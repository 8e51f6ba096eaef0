"""The plan key: the store key of one execution plan, from the problem and its graph's call signature.

`plan_key(cfg, backend, phase, signature)` is the sha256 of everything that makes the graph:

- the blob format version (blob.PLAN_FORMAT) and the build mode ("static": dispatch builds without
  cuDNN's kernel cache, see runtime.plans.build_plan);
- the problem: `cfg.cache_key()` and every resolved AttnConfig field (`cfg.resolved()`: batch,
  heads, sequence lengths, head dims, dtypes, layouts, mask, window, scale, dropout, bias, softmax,
  training, determinism, CUDA-graph flag ...);
- the backend, the phase and the frontend operation;
- the graph's call signature (GraphSignature): dims, strides and dtype of every tensor the graph
  binds (the layout attention() conforms the caller's tensors to) and the SDPA operation's
  non-tensor arguments, read by the engine from the graph description itself, so a change in how
  a graph is described changes the key even without a version bump.

The cuDNN backend and frontend versions, the GPU and the driver are not in the key: the store
files every plan under the Fingerprint (Store.get_plan(fingerprint, plan_key)), and a plan from
another fingerprint is never read. Dispatch and warmup both key a plan from the AttnConfig that
`calls.call_config` builds, which is what makes a warmed plan the one dispatch finds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

from fusedattn_select.config import AttnConfig
from fusedattn_select.plan_store.blob import PLAN_FORMAT
from fusedattn_select.types import Backend, Phase

BUILD_MODE = "static"


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


class PlanKey(NamedTuple):
    """The store key of one plan and the graph call signature it was computed from."""

    key: str
    signature: GraphSignature
