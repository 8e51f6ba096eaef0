"""The runtime's settings for this process: one frozen `RuntimeSettings`, read from the environment at first
use (the first attention() call, or the transformers integration's register() on a machine with a GPU) and
fixed after that, as torch's own environment switches are. Tools and tests that need other settings use
`use(...)` or `replace(...)` (checked like the variables), never the runtime's module attributes."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.settings import RuntimeSettings, read_runtime, runtime_with


class RunSettings:
    """The holder: `get()` the settings (read once), `use(**changes)` inside a block, `replace(...)`
    for the rest of the process, `reread()` after the environment changed (tests)."""

    def __init__(self) -> None:
        self._value: RuntimeSettings | None = None
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        self._lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there

    def get(self) -> RuntimeSettings:
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = read_runtime()  # ConfigError naming the variable: nothing is kept
                value = self._value
        return value

    @contextlib.contextmanager
    def use(self, **changes: Any) -> Iterator[RuntimeSettings]:
        """The settings with `changes` inside the block (for the whole process), as before after it."""
        before = self.get()
        changed = runtime_with(before, **changes)
        with self._lock:
            self._value = changed
        try:
            yield changed
        finally:
            with self._lock:
                self._value = before

    def replace(self, **changes: Any) -> RuntimeSettings:
        """Use `changes` for the rest of the process (a tool that runs one setting throughout)."""
        with self._lock:
            current = self._value if self._value is not None else read_runtime()
            self._value = runtime_with(current, **changes)
            return self._value

    def reread(self) -> None:
        """Forget the settings read: the next get() reads the environment again."""
        with self._lock:
            self._value = None


run_settings = RunSettings()
