"""The project types this package uses, imported in one place, and the `declared` provenance."""

from __future__ import annotations

from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError, FusedAttnSelectError
from fusedattn_select.probing.engine_protocol import ProbeEngine
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, ProbeDepth, Provenance, Verdict

__all__ = [
    "AttnConfig", "Backend", "ConfigError", "DECLARED", "FusedAttnSelectError", "Fingerprint", "Outcome", "Phase", "ProbeDepth",
    "ProbeEngine", "Provenance", "Verdict", "declared_provenance",
]

DECLARED = "declared"


def declared_provenance() -> Provenance:
    """Provenance of answers read from declared tables: `Provenance.DECLARED` ("declared")."""
    try:
        return Provenance(DECLARED)
    except ValueError:
        raise RuntimeError(
            f"Provenance has no member with value {DECLARED!r}; add DECLARED = {DECLARED!r} to "
            "fusedattn_select.types.Provenance"
        ) from None
