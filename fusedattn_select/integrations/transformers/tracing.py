"""Whether tensors are symbolic here, and warnings logged once and never while tracing."""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("fusedattn_select")

_LOGGED: set[Any] = set()
_lock = threading.Lock()


def is_tracing(tensor: Any = None) -> bool:
    """Whether tensors are symbolic here (torch.compile, jit, fx, CUDA graph capture): no host reads."""
    import torch

    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True  # decided before any import: a failing import cannot be traced
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return True
    try:
        from transformers.utils.import_utils import (
            is_tracing as transformers_is_tracing,  # also fx proxies and fake tensors
        )
    except ImportError:  # transformers 4.x
        return False
    return transformers_is_tracing(tensor)


def log_once(key: Any, message: str, *args: Any) -> None:
    """Log `message` as a warning the first time `key` is seen; nothing under tracing."""
    if is_tracing():
        return
    with _lock:
        if key in _LOGGED:
            return
        _LOGGED.add(key)
    log.warning(message, *args)
