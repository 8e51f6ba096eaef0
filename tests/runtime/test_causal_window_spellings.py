"""A causal mask with window_size (-1, 0) is plain causal (the mask bounds the right side at the
diagonal): torch's SDPA states it with is_causal, both when the torch rule is asked about a config and
when attention()'s fallback chooses torch's SDPA over the reference. A real window stays a blocker."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.config import AttnConfig  # noqa: E402
from fusedattn_select.probing import torch_rules  # noqa: E402
from fusedattn_select.runtime.fallback import torch_sdpa_blocker  # noqa: E402
from fusedattn_select.runtime.options import CallOptions  # noqa: E402

BASE = dict(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=512, seqlen_kv=512, head_dim_qk=128)


def blocker(mask: str, window: tuple[int, int]) -> str:
    options = CallOptions("bshd", mask, window, None, 0.0, "vanilla", False, False, "", False, False, False, False)
    q = torch.zeros(2, 16, 64, 128)
    return torch_sdpa_blocker(options, q, q[:, :4], False)


@pytest.mark.parametrize("mask", ["causal", "causal_bottom_right"])
def test_a_causal_right_bound_zero_runs_on_torch_sdpa(mask):
    assert blocker(mask, (-1, 0)) == blocker(mask, (-1, -1)) == ""


@pytest.mark.parametrize("mask,window", [("no_mask", (-1, 0)), ("causal", (128, 0)), ("causal", (-1, 4))])
def test_a_real_window_still_blocks_torch_sdpa(mask, window):
    assert blocker(mask, window).startswith("window_size=")


def test_the_torch_rule_states_causal_with_right_bound_zero_as_is_causal():
    plain = torch_rules.sdpa_call(AttnConfig(**BASE, mask="causal"))
    spelled = torch_rules.sdpa_call(AttnConfig(**BASE, mask="causal", window_size=[-1, 0]))
    assert isinstance(spelled, torch_rules.SdpaCall) and spelled == plain
    assert isinstance(torch_rules.sdpa_call(AttnConfig(**BASE, mask="causal", window_size=[128, 0])), str)
