"""A process forked while another thread of its parent held the backend registry's lock or the CUDA
device lock: the child registers backends and reaches the driver (DataLoader workers, pre-fork servers).

A thread lock held by another thread at fork() stays held in the child for ever (that thread does not
exist there): the child's first register() or cuda_driver() waited for good.
"""

from __future__ import annotations

import os
import sys

import pytest

from fusedattn_select import backends
from fusedattn_select.errors import PlatformError
from fusedattn_select.probing.cudnn import cudnn_device
from fusedattn_select.types import Backend, Phase
from tests.forking import forked_while_held

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                                reason="fork() with threads: POSIX (Linux) only")


def test_a_child_forked_while_a_thread_registers_a_backend_can_change_the_registry():
    def child() -> bool:
        backends.unregister(Backend.FP8)  # in the child only
        return backends.candidate("fp8_e4m3", (Phase.FORWARD,)) is None

    status = forked_while_held(backends.registry._lock, child)  # a thread registering a backend at fork()
    assert status == 0
    assert backends.candidate("fp8_e4m3", (Phase.FORWARD,)) is backends.FP8


def test_a_child_forked_while_a_thread_initialises_the_cuda_driver_reaches_it():
    def child() -> bool:
        try:
            cudnn_device.cuda_driver()
        except PlatformError:  # no cuda-python or no device here: an answer, not a wait
            pass
        return True

    status = forked_while_held(cudnn_device._devices.lock, child)  # a thread initialising the driver at fork()
    assert status == 0
