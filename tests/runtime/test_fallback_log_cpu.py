"""The fallback warning (issue 13, item 9): one line, each cause and the install hint once, the first
reason whole; one problem logged once whether attention() or the SDPA drop-in runs it."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.runtime import api as dispatch  # noqa: E402
from fusedattn_select.runtime.api import attention  # noqa: E402
from fusedattn_select.runtime.dispatcher import dispatcher  # noqa: E402
from fusedattn_select.runtime.fallback_log import MAX_REASON_CHARS, short_reason  # noqa: E402

sdpa = pytest.importorskip("fusedattn_select.integrations.sdpa")

INSTALL_HINT = "fusedattn-select[cuda]"


pytestmark = pytest.mark.usefixtures("no_platform")


def fallback_messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "fusedattn_select" and "falls back" in r.getMessage()]


def bhsd(b=1, h=4, s=16, d=64, grad=False):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(b, h, s, d, generator=gen).to(torch.bfloat16).requires_grad_(grad) for _ in range(3)]


def test_one_problem_run_by_attention_and_by_the_sdpa_drop_in_is_logged_once(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    q, k, v = bhsd()
    sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
    attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask="causal")  # BSHD view, same memory
    assert len(dispatcher.entries) == 2  # two call signatures of one problem
    configs = {(e.call_cfg or e.cfg).cache_key() for e in dispatcher.entries.values()}
    assert len(configs) == 1
    assert len(fallback_messages(caplog)) == 1


def test_a_problem_logs_again_after_clear_plans(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    q, k, v = bhsd()
    attention(q, k, v, layout="bhsd", mask="causal")
    dispatch.clear_plans()
    attention(q, k, v, layout="bhsd", mask="causal")
    assert len(fallback_messages(caplog)) == 2


def test_an_fp8_fallback_tried_with_three_recipes_is_one_short_line_with_the_install_hint_once(caplog):
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    q, k, v = bhsd(grad=True)
    attention(q, k, v, layout="bhsd", mask="causal", fp8=True)
    (message,) = fallback_messages(caplog)
    assert "\n" not in message
    assert message.count(INSTALL_HINT) == 1
    assert message.count("no GPU in this test") == 1
    assert len(message) < 700  # was 1,278 characters with the hint three times
    # The first reason whole; the other recipes named as having the same cause.
    assert ("O bf16, dO fp8_e5m2, dQKV bf16: FP8 forward and backward no data at rule:platform: no CUDA device "
            "with cuDNN to probe (no GPU in this test)") in message
    assert message.endswith("(the same for O fp8_e4m3, dO fp8_e5m2, dQKV fp8_e5m2 and for O fp8_e4m3, dO fp8_e4m3, "
                            "dQKV fp8_e4m3)")


def test_short_reason_keeps_distinct_causes_and_names_repeated_ones():
    reason = ("F16 forward not supported at check_support: head dim 512; F16 backward not supported at validate: "
              "no dBias; F16 backward not supported at check_support: head dim 512")
    assert short_reason(reason) == ("F16 forward not supported at check_support: head dim 512; F16 backward not "
                                    "supported at validate: no dBias (the same for F16 backward not supported)")


def test_short_reason_keeps_a_long_first_reason_whole_and_counts_what_it_cuts():
    first = "F16 forward not supported at check_support: " + "x" * 800
    second = "F16 backward not supported at validate: " + "y" * 300
    text = short_reason(f"{first}; {second}")
    assert text == first + f" ... ({len(second) + 2} more characters; select(config).reasons has every reason)"


def test_short_reason_cuts_at_the_limit_after_a_short_first_reason():
    reasons = "; ".join(f"F16 forward not supported at stage{i}: {'z' * 90}" for i in range(10))
    text = short_reason(reasons)
    assert len(text) < MAX_REASON_CHARS + 100
    assert text.startswith("F16 forward not supported at stage0: ") and "more characters;" in text
    assert short_reason("one\nreason  on\tlines") == "one reason on lines"
