"""Importing cudnn-frontend (the optional 'cuda' extra): the one place that says it is missing, read
by the live engine and by the engine choice before it imports the live engine's modules."""

from __future__ import annotations

from typing import Any

from fusedattn_select.errors import PlatformError

# What a user without the cuDNN packages installs (the optional 'cuda' extra), said by every message
# about a missing one.
INSTALL_CUDA = "install 'fusedattn-select[cuda]'"


def import_cudnn() -> Any:
    """The `cudnn` module; PlatformError saying what to install where it is absent or cannot load."""
    try:
        import cudnn
    except ImportError as err:
        raise PlatformError(
            f"cudnn-frontend is not installed ({err}); {INSTALL_CUDA} to probe cuDNN"
        ) from None
    except OSError as err:  # the frontend found but could not load a library it links
        raise PlatformError(f"cudnn-frontend cannot load its libraries ({err})") from None
    return cudnn
