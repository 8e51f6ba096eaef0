"""Core types: the backend enum, phases, outcomes, per-graph verdicts, and the platform fingerprint
every cached answer is tied to."""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import asdict, dataclass

from fusedattn_select.errors import ConfigError


class TextEnum(str, enum.Enum):
    """An enum of strings whose str() is its value ("F16", not "Backend.F16")."""

    def __str__(self) -> str:
        return self.value


class Backend(TextEnum):
    """A fused attention backend (TransformerEngine's F16_arbitrary_seqlen, FP8, No_Backend)."""

    F16 = "F16"
    FP8 = "FP8"
    NONE = "NONE"


def declare_backend(name: str) -> Backend:
    """The Backend named `name`, made once: how a backend added through the registry (backends.py)
    gets a value that verdicts, selections and the store carry like F16's. Iterating Backend lists
    the built-in backends only."""
    if not isinstance(name, str) or not name.isidentifier() or name != name.upper():
        raise ConfigError("backend", name, "must be an upper-case identifier such as 'TOY'")
    found = Backend._value2member_map_.get(name)
    if found is not None:
        return found
    member = str.__new__(Backend, name)
    member._name_ = member._value_ = name
    Backend._value2member_map_[name] = member  # Backend(name) finds it; the built-in members stay as they are
    return member


class Phase(TextEnum):
    """Which graph of a backend a verdict is about."""

    FORWARD = "forward"
    BACKWARD = "backward"

    @staticmethod
    def of(is_training: bool) -> "tuple[Phase, ...]":
        """The graphs a problem runs: forward, and backward when training."""
        return (Phase.FORWARD, Phase.BACKWARD) if is_training else (Phase.FORWARD,)


class Outcome(TextEnum):
    """What a probe found.

    SUPPORTED and UNSUPPORTED are verdicts about the problem and are cached; FAILED is an incident
    (out of memory, CUDA error, timeout) that says nothing about support and is never cached.
    NO_DATA says the source holds no answer (a problem a snapshot did not record, or no engine at
    all): only a live probe can answer it; it is never stored and never reported as unsupported.
    """

    SUPPORTED = "supported"
    UNSUPPORTED = "unsupported"
    FAILED = "failed"
    NO_DATA = "no_data"


class Provenance(TextEnum):
    """Where an answer came from."""

    RULE = "rule"
    MEMORY_CACHE = "memory_cache"
    PERSISTENT_CACHE = "persistent_cache"
    LIVE_PROBE = "live_probe"
    SNAPSHOT = "snapshot"
    DECLARED = "declared"  # a vendor's declared capability table, not a probe


class ProbeDepth(TextEnum):
    """How far a probe goes: `fast` stops after cuDNN's check_support, `full` also builds plans,
    `verify` also runs the graphs twice on seeded data and compares them with a reference."""

    FAST = "fast"
    FULL = "full"
    VERIFY = "verify"

    def answers(self, asked: "ProbeDepth") -> bool:
        """Whether an answer probed to this depth answers a question at depth `asked`: a deeper
        probe answers every shallower question (a "no" from any depth answers every question;
        callers check that apart)."""
        return _DEPTH_ORDER.index(self) >= _DEPTH_ORDER.index(asked)

    @classmethod
    def parse(cls, value: "str | ProbeDepth", field: str = "probe_depth") -> "ProbeDepth":
        """The depth named by `value`; ConfigError naming `field` otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(field, value, "must be 'fast', 'full' or 'verify'") from None


_DEPTH_ORDER = (ProbeDepth.FAST, ProbeDepth.FULL, ProbeDepth.VERIFY)
# The stage of a verdict decided by running the graphs and comparing their results (depth verify).
NUMERICS_STAGE = "numerics"


_REJECTION_KIND = {
    Outcome.UNSUPPORTED: "not supported",
    Outcome.FAILED: "probe failed",
    Outcome.NO_DATA: "no data",
    Outcome.SUPPORTED: "supported",
}


def rejection_line(backend: Backend, phases: "tuple[Phase, ...] | list[Phase]", outcome: Outcome, stage: str,
                   message: str) -> str:
    """One rejection as users read it: "F16 forward and backward not supported at validate: ..."."""
    kind = _REJECTION_KIND[outcome]
    names = " and ".join(p.value for p in phases)
    return f"{backend.value} {names} {kind} at {stage}: {message}"


@dataclass(frozen=True)
class Verdict:
    """The answer for one backend and one phase (forward or backward) of one problem.

    `stage` names where the answer was decided: a rule's name, the cuDNN step (validate,
    build_operation_graph, create_execution_plans, check_support, build_plans), or "numerics"
    (depth verify: the graphs ran and their results were compared). `message` is one
    cleaned line; `detail` keeps the full original text.
    """

    backend: Backend
    phase: Phase
    outcome: Outcome
    stage: str
    message: str = ""
    detail: str = ""
    provenance: Provenance = Provenance.LIVE_PROBE
    depth: ProbeDepth = ProbeDepth.FAST
    timings_ms: tuple[tuple[str, float], ...] = ()

    @property
    def supported(self) -> bool:
        return self.outcome is Outcome.SUPPORTED

    @property
    def verified(self) -> bool:
        """Supported, and its results were compared with a reference (depth verify, stage numerics)."""
        return self.supported and self.depth is ProbeDepth.VERIFY and self.stage == NUMERICS_STAGE

    @property
    def total_ms(self) -> float:
        return sum(ms for _, ms in self.timings_ms)

    def reason(self) -> str:
        """One line naming backend, phase, stage and the message (empty when supported)."""
        if self.supported:
            return ""
        return rejection_line(self.backend, (self.phase,), self.outcome, self.stage, self.message)

    def with_provenance(self, provenance: Provenance) -> "Verdict":
        return Verdict(
            self.backend, self.phase, self.outcome, self.stage, self.message, self.detail,
            provenance, self.depth, self.timings_ms,
        )

    def to_dict(self) -> dict:
        return {
            "backend": self.backend.value,
            "phase": self.phase.value,
            "outcome": self.outcome.value,
            "stage": self.stage,
            "message": self.message,
            "detail": self.detail,
            "provenance": self.provenance.value,
            "depth": self.depth.value,
            "timings_ms": {name: round(ms, 4) for name, ms in self.timings_ms},
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        """The verdict `to_dict` wrote. KeyError for a missing field; TypeError or ValueError (naming
        the field) for a value of the wrong type, a number out of range or nesting no verdict has."""
        try:
            return cls(
                backend=Backend(data["backend"]),
                phase=Phase(data["phase"]),
                outcome=Outcome(data["outcome"]),
                stage=_text(data, "stage"),
                message=_text(data, "message", ""),
                detail=_text(data, "detail", ""),
                provenance=Provenance(data.get("provenance", Provenance.LIVE_PROBE.value)),
                depth=ProbeDepth(data.get("depth", ProbeDepth.FAST.value)),
                timings_ms=_timings(data.get("timings_ms", {})),
            )
        except RecursionError:
            # Comparing or printing a value nested deeper than Python's recursion limit raises this.
            raise ValueError("a field is nested too deeply for a verdict") from None


def _text(data: dict, name: str, default: str | None = None) -> str:
    value = data[name] if default is None else data.get(name, default)
    if not isinstance(value, str):
        raise TypeError(f"{name}: must be a string, not {type(value).__name__}")
    return value


def _timings(value: object) -> tuple[tuple[str, float], ...]:
    """timings_ms as to_dict writes it: a mapping of step names to milliseconds."""
    if not isinstance(value, dict):
        raise TypeError(f"timings_ms: must be a mapping of step names to milliseconds, not {type(value).__name__}")
    timings = []
    for name, ms in value.items():
        if not isinstance(ms, (int, float)) or isinstance(ms, bool):
            raise TypeError(f"timings_ms[{name!r}]: must be a number, not {type(ms).__name__}")
        try:
            timings.append((str(name), float(ms)))
        except OverflowError:  # an integer beyond any float
            raise ValueError(f"timings_ms[{name!r}]: an integer of {ms.bit_length()} bits is out of range") from None
    return tuple(timings)


@dataclass(frozen=True)
class Fingerprint:
    """What a support answer depends on; an answer from another fingerprint is never reused.

    Versions are integers as the libraries report them (cuDNN backend 91900 = 9.19.0); the
    compute capability is "major.minor".
    """

    platform: str
    device_name: str = ""
    compute_capability: str = ""
    sm_count: int = 0
    cudnn_backend_version: int = 0
    cudnn_frontend_version: str = ""
    driver_version: str = ""
    library_version: str = ""

    @property
    def sm_arch(self) -> int:
        """Compute capability as TransformerEngine writes it (9.0 -> 90); 0 when unknown."""
        if not self.compute_capability:
            return 0
        major, _, minor = self.compute_capability.partition(".")
        return int(major) * 10 + int(minor or 0)

    def key(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Fingerprint":
        return cls(
            platform=str(data["platform"]),
            device_name=str(data.get("device_name", "")),
            compute_capability=str(data.get("compute_capability", "")),
            sm_count=int(data.get("sm_count", 0)),
            cudnn_backend_version=int(data.get("cudnn_backend_version", 0)),
            cudnn_frontend_version=str(data.get("cudnn_frontend_version", "")),
            driver_version=str(data.get("driver_version", "")),
            library_version=str(data.get("library_version", "")),
        )

    def describe(self) -> str:
        if not self.device_name:
            return self.platform
        if self.platform == "rocm":
            return f"{self.device_name} (ROCm declared tables, library {self.library_version})"
        return (
            f"{self.device_name} (sm_{self.sm_arch}, {self.sm_count} SMs), "
            f"cuDNN {format_cudnn_version(self.cudnn_backend_version)}, "
            f"cudnn-frontend {self.cudnn_frontend_version}, driver {self.driver_version}"
        )


def format_cudnn_version(version: int) -> str:
    """91900 -> "9.19.0" (cuDNN >= 9 encodes major*10000 + minor*100 + patch)."""
    if version <= 0:
        return "unknown"
    if version >= 90000:
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return f"{version // 1000}.{version // 100 % 10}.{version % 100}"
