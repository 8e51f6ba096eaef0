"""Tiny random-initialised transformers models shared by the CPU and GPU integration tests.

One home for the model families the integration is tested on (their sliding-window, soft-capping
and sinks settings), for which of them "sdpa" computes exactly, and for the padded inputs. Nothing
is downloaded: every model is built from a config. Importable because pytest puts tests/ (the
folder of the root conftest.py) on sys.path; import it after `pytest.importorskip("transformers")`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from transformers import AutoConfig

from fusedattn_select.integrations import transformers as fa_hf
from fusedattn_select.integrations.transformers import tracing

LAYERS = 2
# "sdpa" cannot run attention sinks (gpt-oss) and has no soft-capping (Gemma 2; transformers
# before 5.2x ran it without the cap, later ones refuse): those models are compared with "eager".
SDPA_EXACT = ("llama", "mistral", "qwen2", "gemma3")
FAMILIES = ("llama", "mistral", "qwen2", "gemma2", "gemma3", "gpt_oss")
COMPARISONS = [(name, "eager") for name in FAMILIES] + [(name, "sdpa") for name in SDPA_EXACT]


@dataclass(frozen=True)
class TinyModels:
    """One size of the tiny models: 4 query heads over 2 K/V heads (GQA), LAYERS layers."""

    vocab: int
    seq: int
    window: int  # smaller than seq: the sliding window cuts
    hidden: int
    intermediate: int
    head_dim: int
    init_range: float
    softcap: float  # Gemma 2's attention-logit cap
    experts_per_tok: int  # gpt-oss routing top-k over its 2 experts
    pad: int  # padded positions of row 0 in inputs("left"/"right")

    def spec(self, name: str) -> dict:
        """The config arguments of one family (FAMILIES), model_type included."""
        window = self.window
        return {
            "llama": dict(model_type="llama"),
            "mistral": dict(model_type="mistral", sliding_window=window),
            "qwen2": dict(model_type="qwen2", use_sliding_window=True, sliding_window=window, max_window_layers=1),
            "gemma2": dict(model_type="gemma2", sliding_window=window, attn_logit_softcapping=self.softcap,
                           query_pre_attn_scalar=self.head_dim),
            "gemma3": dict(model_type="gemma3_text", sliding_window=window, query_pre_attn_scalar=self.head_dim,
                           sliding_window_pattern=2),
            "gpt_oss": dict(model_type="gpt_oss", sliding_window=window, num_local_experts=2,
                            num_experts_per_tok=self.experts_per_tok),
        }[name]

    def config(self, name: str, **changes):
        """The transformers config of family `name` at this size, with `changes` applied last."""
        spec = self.spec(name)
        common = dict(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=self.head_dim,
            pad_token_id=0, initializer_range=self.init_range,
        )
        return AutoConfig.for_model(spec.pop("model_type"), **{**common, **spec, **changes})

    def inputs(self, padding: str | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Two token rows of length seq (seeded); `padding` "left"/"right" pads row 0 and gives the mask."""
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(1, self.vocab, (2, self.seq), generator=gen)
        mask = torch.ones(2, self.seq, dtype=torch.long)
        if padding == "left":
            mask[0, :self.pad] = 0
        elif padding == "right":
            mask[0, -self.pad:] = 0
        ids = ids.masked_fill(mask == 0, 0)
        return ids, (None if padding is None else mask)


# The CPU tests' size: a small soft-cap, so soft-capping changes the scores of this tiny model.
CPU_TINY = TinyModels(vocab=61, seq=10, window=4, hidden=32, intermediate=48, head_dim=8, init_range=0.2,
                      softcap=0.5, experts_per_tok=1, pad=3)


# Fixtures for a CPU test module of the integration: import them by name (pytest uses a module's fixtures).
@pytest.fixture(scope="module", autouse=True)
def registered():
    """attn_implementation="fusedattn" registered for the module's tests."""
    assert fa_hf.register() == "fusedattn"


@pytest.fixture(autouse=True)
def fresh_log_once():
    """The integration's log-once memory emptied for each test (tests read what it logs)."""
    tracing._logged.keys.clear()
