"""A forked child for tests of fork safety (the store's, the selector's, the runtime's locks)."""

from __future__ import annotations

import os
import threading
import time


def in_forked_child(action, limit_s: float = 20.0) -> int:
    """Exit status of a forked child that runs action() (0 when it returns True, 3 when False, 1 when
    it raises); -1 when it was still running after `limit_s` (killed)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            code = 0 if action() else 3
        finally:
            os._exit(code)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return -1


def forked_while_held(lock, action, limit_s: float = 10.0) -> int:
    """in_forked_child(action) while another thread of this process holds `lock` (a thread inside a
    short locked region at fork(), the window widened); the lock is released after."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            entered.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    entered.wait(10)
    try:
        return in_forked_child(action, limit_s=limit_s)
    finally:
        release.set()
        thread.join()
