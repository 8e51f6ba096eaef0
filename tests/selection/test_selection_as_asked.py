"""A cached answer asked for again in another spelling of the same problem (one cache key) carries the
config it was asked with: it carried the first asker's (a causal window (-1, 0) for (-1, -1))."""

from __future__ import annotations

from fusedattn_select import AttnConfig
from fusedattn_select.selection.selector import Selector

SHAPE = dict(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=128, seqlen_kv=128, head_dim_qk=64, mask="causal")


def test_each_spelling_of_a_cached_problem_gets_its_own_config_back(recording_engine):
    selector = Selector(recording_engine)
    first, second = AttnConfig(**SHAPE, window_size=(-1, 0)), AttnConfig(**SHAPE, window_size=(-1, -1))
    assert first.cache_key() == second.cache_key() and first != second
    for ask in (selector.select, selector.select_own, selector.select_dense):
        one, other = ask(first), ask(second)
        assert other.from_cache and other.cache_key == one.cache_key and other.backend is one.backend
        assert one.config == first and other.config == second, ask.__name__


def test_the_same_config_gets_the_cached_answer_itself(recording_engine):
    selector = Selector(recording_engine)
    cfg = AttnConfig(**SHAPE)
    selector.select(cfg)
    assert selector.select(cfg) is selector.select(AttnConfig(**SHAPE))
