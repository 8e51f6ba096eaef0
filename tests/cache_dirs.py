"""A cache directory that cannot be created, for the degraded-store tests (store and CLI).

Importable because pytest puts tests/ (the folder of the root conftest.py) on sys.path.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import pytest

from fusedattn_select.store import CACHE_DIR_ENV, CACHE_SWITCH_ENV

RUNNING_AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@contextlib.contextmanager
def unusable_cache_dir(parent: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """FUSEDATTN_SELECT_CACHE_DIR set (cache switch unset) to a directory under `parent` that cannot
    be created: under a directory with mode 500, or, as root, under a regular file (root ignores
    permission bits). Yields that path; the mode-500 directory is writable again on exit."""
    if RUNNING_AS_ROOT:
        blocker = parent / "a-file"
        blocker.write_text("")
        target = blocker / "cache"
    else:
        locked = parent / "locked"
        locked.mkdir()
        os.chmod(locked, 0o500)
        target = locked / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(target))
    monkeypatch.delenv(CACHE_SWITCH_ENV, raising=False)
    try:
        yield target
    finally:
        if not RUNNING_AS_ROOT:
            os.chmod(locked, 0o700)
