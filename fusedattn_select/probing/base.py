"""The probing-engine protocol and the platform fingerprint every cached answer is tied to."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

from ..backend import Backend, Phase, ProbeDepth, Provenance, Verdict
from ..config import AttnConfig


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


@runtime_checkable
class ProbeEngine(Protocol):
    """A source of ground-truth verdicts for one platform (live cuDNN, a recorded snapshot, ...).

    `probe` answers one backend and one phase of one problem. It returns an UNSUPPORTED verdict
    (with the stage and the engine's own message) when the platform rejects the problem, and a
    FAILED verdict for incidents (out of memory, driver errors); it never raises for either.
    """

    name: str
    provenance: Provenance

    def fingerprint(self) -> Fingerprint: ...

    def probe(self, cfg: AttnConfig, backend: Backend, phase: Phase, depth: ProbeDepth) -> Verdict: ...
