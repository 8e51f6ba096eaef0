"""The compiled lean path built on first use, in the background (FUSEDATTN_SELECT_NATIVE=auto).

`BackgroundBuild.start` runs `fusedattn-select native build` in a child process on a thread of its own;
when the build succeeds, `on_built` lets the next lookup load the module, and lean entries made
before then take it at their next call (`generation`). What calls run meanwhile, another rank's
build, and a failed one: see docs/dispatch.md, 'Compiled lean path (built on first use)'.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from fusedattn_select import settings
from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.store.locks import flock

log = logging.getLogger("fusedattn_select")

OTHERS_WAIT_S, POLL_S = 900.0, 2.0  # how long a process waits on another's build, and how often it looks
# The `native build` flag (hidden) of the build a background build starts: it started because no
# failure was remembered, so one it finds once it holds the lock is the queued-for build's (native.build()).
BACKGROUND_FLAG = "--background"


def private_dirs(directory: Path) -> None:
    """Make `directory` and every missing directory above it, each of mode 700: Path.mkdir(parents=True)
    makes those above with the umask's mode (group-writable under umask 002), and a module below a
    directory others can write is never loaded (trust.py)."""
    missing = []
    while not directory.is_dir() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for each in reversed(missing):
        each.mkdir(mode=0o700, exist_ok=True)


def refusal(module: Path) -> str:
    """Why a module built at `module` would never be loaded ("" when it would be): trust.untrusted_reason
    with the modules' directory as the directory the library owns."""
    from fusedattn_select.trust import untrusted_reason

    return untrusted_reason(module, module.parent.parent)


def lock_path(module: Path) -> Path:
    """The file builds of `module` lock (build() holds it from the compile to the end of the test)."""
    return module.parent.parent / f"{module.parent.name}.lock"


def building_elsewhere(module: Path) -> bool:
    """Whether some process holds the build lock of `module` now."""
    with flock(lock_path(module), time.monotonic()) as acquired:
        return not acquired


def visible_device(index: int) -> str:
    """CUDA_VISIBLE_DEVICES naming only the device this process uses as `index`: the build's test
    then runs there, not on device 0 of a node whose ranks each use their own."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[index] if index < len(visible) else str(index)


def failed_marker(module: Path) -> Path:
    """Where a failed build of `module` leaves its reason."""
    return module.parent.parent / f"{module.parent.name}.failed"


def remember_failure(module: Path, reason: str) -> None:
    """Write why `module` could not be built (best effort: a read-only directory only costs a retry)."""
    try:
        marker = failed_marker(module)
        private_dirs(marker.parent)
        marker.write_text(reason[-2000:], encoding="utf-8")
    except OSError:
        pass


def earlier_failure(module: Path) -> str:
    """The reason an earlier build of `module` failed ("" when none is remembered)."""
    try:
        return failed_marker(module).read_text(encoding="utf-8").strip() or "no reason given"
    except OSError:
        return ""


def cannot_start(module: Path, include_dirs: Callable[[], list]) -> str:
    """Why a build of `module` must not start here ("" when it may): a directory others can write, no
    GPU to use it on, a remembered failure, or something a build needs that is missing (found without
    compiling)."""
    untrusted = refusal(module)
    if untrusted:  # checked first: the build writes its log and its failure there
        return f"{untrusted}: compiled code runs as you, so it is built only where no one else can write (chmod 700)"
    import torch
    from torch.utils import cpp_extension

    if not torch.cuda.is_available():
        return "no CUDA device"
    failure = earlier_failure(module)
    if failure:
        return f"an earlier build failed ({failure.splitlines()[-1]}); `fusedattn-select native build` tries again"
    if cpp_extension.CUDA_HOME is None:
        return "no CUDA toolkit found (set CUDA_HOME)"
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        return f"no C++ compiler {compiler!r} (set CXX)"
    try:
        include_dirs()
    except RuntimeError as err:
        return str(err)
    return ""


class BackgroundBuild:
    """One process's background build: started at most once, and a count of modules it has made
    loadable (lean entries compare it with the count they were made at)."""

    def __init__(self) -> None:
        self._renew_locks()
        renew_locks_after_fork(self)
        self.started = False
        self.generation = 0
        self.thread: Optional[threading.Thread] = None
        self.building = False  # past the check: a build runs, or one of another process is waited on

    def _renew_locks(self) -> None:
        self._lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there

    def start(self, module: Path, include_dirs: Callable[[], list], on_built: Callable[[], None],
              device: Optional[int] = None) -> None:
        """Build `module` in the background where it can be (once per process), testing it on
        `device` (None: this thread's current device). Returns at once: whether a build can start
        is found on the build's own thread, since finding it imports torch's C++ extension tools
        (docs/dispatch.md, 'Compiled lean path (built on first use)')."""
        with self._lock:
            if self.started:
                return
            self.started = True
        import torch

        # Callers name their plans' device: a thread of ours (the preparer) starts on device 0.
        index = device if device is not None else torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        self.thread = threading.Thread(target=self._run, args=(module, include_dirs, on_built, visible_device(index)),
                                       daemon=True, name="fusedattn-select-native-build")
        self.thread.start()

    def _run(self, module: Path, include_dirs: Callable[[], list], on_built: Callable[[], None],
             device: str) -> None:
        try:
            why = cannot_start(module, include_dirs)
        except Exception as err:  # noqa: BLE001 - on a thread of its own: said, and calls stay on Python
            why = f"{type(err).__name__}: {err}"
        if why:
            log.info("fusedattn_select: compiled lean path not built (%s); calls run the Python lean path", why)
            return
        self.building = True
        try:
            self._wait_or_build(module, on_built, device)
        finally:
            self.building = False

    def _wait_or_build(self, module: Path, on_built: Callable[[], None], device: str) -> None:
        started = time.monotonic()
        if building_elsewhere(module):  # another rank or process: wait for its build, start none
            log.info("fusedattn_select: another process is building the compiled lean path; calls take it "
                     "when it is built")
            while building_elsewhere(module) and time.monotonic() - started < OTHERS_WAIT_S:
                time.sleep(POLL_S)
            if module.is_file():
                self._built(on_built, started)
                return
            if earlier_failure(module):
                log.warning("fusedattn_select: the compiled lean path could not be built (%s); calls run the "
                            "Python lean path", earlier_failure(module).splitlines()[-1])
                return
        self._build(module, on_built, device, started)

    def _build(self, module: Path, on_built: Callable[[], None], device: str, started: float) -> None:
        log_path = module.parent.parent / f"{module.parent.name}.log"
        log.info("fusedattn_select: building the compiled lean path in the background (log: %s)", log_path)
        command = [sys.executable, "-m", "fusedattn_select.cli", "native", "build", BACKGROUND_FLAG]
        if shutil.which("nice"):
            command = ["nice", "-n", "19", *command]  # the caller's own work comes first
        # The child neither builds in the background itself nor dies with this process (the next
        # process then finds the module built), and tests the module on this process's device.
        env = dict(os.environ, **{settings.NATIVE: "1"}, CUDA_VISIBLE_DEVICES=device)
        # O_NOFOLLOW: a link planted where the log goes does not make it truncate the file it names.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        try:
            private_dirs(log_path.parent)
            with open(os.open(log_path, flags, 0o600), "w") as out:
                code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env, start_new_session=True, check=False).returncode
        except OSError as err:
            code, detail = None, f"{type(err).__name__}: {err}"
        else:
            detail = f"exit code {code}: {_last_line(log_path)}"
        if code == 0 and module.is_file():
            self._built(on_built, started)
            return
        if not earlier_failure(module):
            remember_failure(module, detail)
        log.warning("fusedattn_select: compiled lean path could not be built in the background (%s; log: %s); "
                    "calls run the Python lean path", detail, log_path)

    def _built(self, on_built: Callable[[], None], started: float) -> None:
        with self._lock:
            self.generation += 1
        on_built()
        log.info("fusedattn_select: compiled lean path built in the background in %.0f s; calls take it "
                 "from their next call", time.monotonic() - started)


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no output"
    return lines[-1][-300:] if lines else "no output"
