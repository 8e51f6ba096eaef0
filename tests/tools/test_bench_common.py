"""tools/bench/common.py helpers that read the library's own state (CPU: every call falls back)."""

from __future__ import annotations

import pytest

from tools.bench import common


def test_call_entry_finds_the_decision_of_that_call_not_the_latest_one():
    torch = pytest.importorskip("torch")
    from fusedattn_select.runtime.api import attention, clear_plans

    clear_plans()
    q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))  # CPU: each signature is decided to fall back
    with torch.no_grad():
        attention(q, k, v, mask="causal")
        assert common.call_entry(q, k, v, False) is None  # no call with the default mask yet
        attention(q, k, v)
        attention(q, k, v, layout="bshd", mask="causal", fp8=False)
    first, second = common.call_entry(q, k, v, False, mask="causal"), common.call_entry(q, k, v, False)
    assert first is not None and second is not None and first is not second
    assert first.opts.mask == "causal" and second.opts.mask == "no_mask"
    assert common.call_entry(q, k, v, True, mask="causal") is None  # the training signature was never called
    clear_plans()
