"""Whether tensors are symbolic here, and warnings logged once and never while tracing."""

from __future__ import annotations

import logging
import threading
from typing import Any

from fusedattn_select.forking import renew_locks_after_fork

log = logging.getLogger("fusedattn_select")


class _Logged:
    """The keys log_once has logged (`keys`), changed under `lock`."""

    def __init__(self) -> None:
        self.keys: set[Any] = set()
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        self.lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there


_logged = _Logged()


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
    with _logged.lock:
        if key in _logged.keys:
            return
        _logged.keys.add(key)
    log.warning(message, *args)
