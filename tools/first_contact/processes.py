"""Measuring processes: each starts fresh (nothing imported, an empty store of its own) and answers
with JSON lines that start with MARKER on stdout; everything else it prints is ignored.

`run_fresh` runs one to its answer; a `Worker` kept alive is asked for one measurement at a time
(the compiled-code turns, row 7).
"""

from __future__ import annotations

import getpass
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tools.bench.common import ROOT, clean_json, first_line

MARKER = "FIRST_CONTACT_RESULT "
CACHE_ENV = "FUSEDATTN_SELECT_CACHE_DIR"
DIR_ENV = "FUSEDATTN_SELECT_NATIVE_DIR"
STDERR_TAIL = 8000
EXIT_GRACE_S = 20.0


def native_dir() -> str:
    """Where every worker finds (and, with FUSEDATTN_SELECT_NATIVE=auto, builds) the compiled module:
    $FUSEDATTN_SELECT_NATIVE_DIR, else one directory of this user's under the temp directory (mode
    700: the loader refuses one others could write). One for the run, as a user's cache directory is
    one: the first fresh process starts its build, the later ones find it built or queue on it."""
    configured = os.environ.get(DIR_ENV)
    if configured:
        return configured
    return str(private_dir(os.path.join(tempfile.gettempdir(), f"fusedattn-first-contact-native-{getpass.getuser()}")))


def command(part: str, side: str, args: Mapping[str, Any]) -> list[str]:
    """The worker's command line for one part and side."""
    return [sys.executable, "-m", "tools.first_contact.worker", part, side, json.dumps(args)]


def emit(value: Mapping[str, Any]) -> None:
    """Answer the parent (worker side): one MARKER line on stdout."""
    print(MARKER + json.dumps(clean_json(dict(value))), flush=True)


def answer(line: str) -> dict | None:
    """The JSON object a MARKER line carries (None for any other line)."""
    if not line.startswith(MARKER):
        return None
    value = json.loads(line[len(MARKER):])
    return value if isinstance(value, dict) else None


def failure(reason: str, stderr: str = "") -> dict:
    """A side's result when its process gave no answer."""
    out: dict[str, Any] = {"status": "failed: " + first_line(reason, 300)}
    if stderr:
        out["stderr_tail"] = stderr[-STDERR_TAIL:]
    return out


def run_fresh(part: str, side: str, args: Mapping[str, Any], timeout_s: float | None,
              env: Mapping[str, str] | None = None) -> dict:
    """Run `part` for `side` in a fresh process whose store is a new empty directory; its answer,
    with `spawned_at` (time.time() just before the start) and `process_s` (start to exit). A process
    that answered but does not exit within EXIT_GRACE_S (a library thread still busy) is killed and
    keeps its answer. None as `timeout_s` means the budget is spent: the side is skipped."""
    if timeout_s is None:
        return {"status": "skipped: time budget"}
    worker = Worker(part, side, args, env or {})
    try:
        found = worker.wait_answer(timeout_s)
        found["spawned_at"] = worker.spawned_at
        answered = True
    except RuntimeError as err:
        found, answered = failure(str(err), worker.stderr_tail()), False
    exit_code = worker.close(EXIT_GRACE_S if answered else 1.0, ask_to_stop=False)[1]
    if exit_code is None and answered:
        found["exit"] = f"killed: still running {EXIT_GRACE_S:.0f} s after its answer"
    found["process_s"] = worker.process_s
    return found


class Worker:
    """A worker process, started fresh with its own empty store (or the store given). `wait_answer` takes its next MARKER
    line; a long-lived one (row 7) is asked `request(text)` one line at a time."""

    def __init__(self, part: str, side: str, args: Mapping[str, Any], env: Mapping[str, str],
                 store: str | None = None) -> None:
        # Its own empty store, unless given one (row 7's workers share one, so both read the same choices).
        self._own_store = tempfile.TemporaryDirectory(prefix="first-contact-store-") if store is None else None
        store = store if self._own_store is None else self._own_store.name
        # A file, so a chatty worker never blocks on a pipe; closed by close().
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        environment = {**os.environ, DIR_ENV: native_dir(), **env, CACHE_ENV: store}
        self.spawned_at = time.time()
        self.process = subprocess.Popen(command(part, side, args), env=environment, cwd=str(ROOT), text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
        self.process_s: float | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_answer(self, timeout_s: float) -> dict:
        """The next MARKER line's object; RuntimeError when the worker ends or is silent too long."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"no answer within {timeout_s:.0f} s") from None
            if line is None:
                lines = [text for text in self.stderr_tail().splitlines() if text.strip()]
                raise RuntimeError(f"exit code {self.process.wait()}: {lines[-1] if lines else 'no output'}")
            found = answer(line)
            if found is not None:
                return found

    def request(self, text: str, timeout_s: float) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()
        return self.wait_answer(timeout_s)

    def stderr_tail(self, size: int = STDERR_TAIL) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-size:]

    def close(self, timeout_s: float = 30.0, ask_to_stop: bool = True) -> tuple[dict | None, int | None]:
        """Let the worker end (asking it to stop first where `ask_to_stop`): its last answer, or None,
        and its exit code, or None when it had to be killed."""
        last = None
        if ask_to_stop and self.process.poll() is None:
            try:
                last = self.request("stop", timeout_s)
            except (RuntimeError, OSError):
                pass
        try:
            exit_code: int | None = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            exit_code = None
        self.process_s = time.time() - self.spawned_at
        for stream in (self.process.stdin, self._stderr):
            try:
                stream.close()
            except (OSError, AttributeError):
                pass
        if self._own_store is not None:
            self._own_store.cleanup()
        return last, exit_code


def private_dir(path: str) -> Path:
    """`path` made (mode 700, as the compiled module's loader requires) and returned."""
    where = Path(path)
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    return where
