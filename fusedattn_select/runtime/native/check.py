"""The built module's test, run in a child process by native.build() before the module is kept.

A module of its own: it calls attention(), so the native package (which attention() imports)
must not import it.
"""

from __future__ import annotations

import dataclasses

import torch

from fusedattn_select.runtime import native
from fusedattn_select.runtime.api import attention
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.run_settings import run_settings


def self_test() -> None:
    """Load the built module and check it: the C++ runtime, and on a GPU a tiny forward and backward
    against the Python path (AssertionError or a crash when it is wrong)."""
    module = native.load()
    assert module is not None, f"no module loads from {native.build_dir() / native.module_name()}"
    assert module.stream_check(7) == "eng7"
    if not torch.cuda.is_available():
        return
    q, k, v = (torch.randn(2, 64, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    got = {}
    # Its own plans at once, from the first call (not torch SDPA first): a table entry.
    with run_settings.use(dense_after=1, dense_builds="inline", first_calls="wait"):
        for label, calls in (("native", 3), ("python", 1)):
            before = native.table_calls()
            for _ in range(calls):  # native: decided and promoted, filed in the table, run from it
                out = attention(q, k, v, mask="causal")
                got[label] = (out, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))
            ran = native.table_calls() - before
            assert ran >= 1 if label == "native" else ran == 0, f"the table ran {ran} of the {label} calls"
            for found in dispatcher.by_call.values():
                if found.lean is not None:
                    assert label == "python" or found.lean.native is not None, "the compiled path did not run"
                    found.lean = dataclasses.replace(found.lean, native=None)
            native.forget_calls()
    for a, b in zip(got["native"], got["python"]):
        assert torch.allclose(a.float(), b.float(), atol=2e-2), "compiled and Python paths differ"
