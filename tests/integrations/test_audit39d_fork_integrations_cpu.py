"""A process forked while another thread of its parent held a lock of the torch or transformers
integration (SDPA routing, the mask patterns confirmed, the warnings logged once): the child routes,
confirms and warns (DataLoader workers, pre-fork servers).

A thread lock held by another thread at fork() stays held in the child for ever (that thread does not
exist there): the child's first routed(), mask or warning waited for good.
"""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from sdpa_state import TORCH_SDPA, F, sdpa, torch_attribute_restored  # noqa: E402,F401 (an autouse fixture)

from fusedattn_select.integrations.transformers import mask_interface, tracing  # noqa: E402
from tests.forking import forked_while_held  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                                reason="fork() with threads: POSIX (Linux) only")


def test_a_child_forked_while_a_thread_enters_a_routed_block_can_route():
    def child() -> bool:
        with sdpa.routed():
            inside = sdpa.is_installed()
        return inside and F.scaled_dot_product_attention is TORCH_SDPA

    status = forked_while_held(sdpa._routing.lock, child)  # a thread entering or leaving routed() at fork()
    assert status == 0


def test_a_child_forked_while_a_thread_confirms_a_mask_confirms_its_own():
    def causal(batch_idx, head_idx, q_idx, kv_idx):  # a mask function not confirmed before (no closure)
        return kv_idx <= q_idx

    pattern = mask_interface._Pattern(True, None)

    def child() -> bool:
        mask_interface._confirm(pattern, causal, "cpu", tracing=False)
        return (causal, pattern) in mask_interface._confirmed.pairs

    status = forked_while_held(mask_interface._confirmed.lock, child)  # a thread confirming a mask at fork()
    assert status == 0


def test_a_child_forked_while_a_thread_logs_a_warning_once_logs_its_own():
    key = ("fork test", os.getpid())

    def child() -> bool:
        tracing.log_once(key, "fusedattn: a warning logged once (fork test)")
        return key in tracing._logged.keys

    status = forked_while_held(tracing._logged.lock, child)  # a thread logging a warning once at fork()
    assert status == 0
