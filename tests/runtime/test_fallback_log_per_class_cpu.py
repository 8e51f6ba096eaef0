"""The fallback warning is said once per problem class and reason, not once per shape: a generate()
loop calls each layer with a new key/value length every token, and each used to log the same warning
again (a tiny Llama in bf16 on the CPU: one warning per generated token)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime.api import attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_platform")


def fallback_messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "fusedattn_select" and "falls back" in r.getMessage()]


def decode_steps(steps: int, head_dim: int = 64, start: int = 10) -> None:
    """One layer's attention as generate() calls it: a prefill, then one query row per token over a
    key/value cache one row longer each time."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        kv = torch.randn(1, start, 2, head_dim, generator=gen).to(torch.bfloat16)
        attention(kv.repeat(1, 1, 2, 1), kv, kv, mask="causal")
        for _ in range(steps):
            kv = torch.cat([kv, torch.randn(1, 1, 2, head_dim, generator=gen).to(torch.bfloat16)], dim=1)
            q = torch.randn(1, 1, 4, head_dim, generator=gen).to(torch.bfloat16)
            attention(q, kv, kv)


def test_decode_steps_of_one_problem_class_warn_once(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    decode_steps(12)
    messages = fallback_messages(caplog)
    # The prefill (causal) and the decode steps (no mask) are two problem classes: one line each.
    assert len(messages) == 2, "\n".join(messages)
    assert all("the tensors are on cpu" in m for m in messages)


def test_another_problem_class_or_reason_still_warns(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    decode_steps(3, head_dim=64)
    decode_steps(3, head_dim=128)  # another class: its own line
    assert len(fallback_messages(caplog)) == 4
