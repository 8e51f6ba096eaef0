"""Exception types raised by fusedattn_select."""

from __future__ import annotations


class FusedAttnSelectError(Exception):
    """Base class of every error this library raises."""


class ConfigError(FusedAttnSelectError, ValueError):
    """An attention problem description has a bad field value."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r}: {allowed}")


class PlatformError(FusedAttnSelectError):
    """The platform (GPU, cuDNN, driver) cannot be used for probing or dispatch."""


class ProbeError(FusedAttnSelectError):
    """A probe failed for a reason that is not a support verdict (OOM, CUDA error, timeout)."""


class SnapshotError(FusedAttnSelectError):
    """A recorded snapshot file is missing, unreadable or malformed."""
