"""heads_as_batch at the int32 bound: a valid decode step whose batch times KV heads would pass the
largest bucket a ladder holds has no heads-as-batch problem (None, answered by its own forms), never
a ConfigError about a batch_size the caller did not give."""

from __future__ import annotations

from fusedattn_select import AttnConfig
from fusedattn_select.buckets import LADDER_REACH_LIMIT, bucket_form, heads_as_batch


def decode(batch_size: int, num_heads_kv: int = 16) -> AttnConfig:
    # One query head per KV head of one element: the fewest elements (the bucket plans' int32 ragged
    # offsets bound tensors to 2**31 elements) for the most sequences.
    return AttnConfig(batch_size=batch_size, num_heads_q=num_heads_kv, num_heads_kv=num_heads_kv, seqlen_q=1,
                      seqlen_kv=1, head_dim_qk=1, qkv_layout="bhsd_bhsd_bhsd", is_training=False)


def test_a_decode_step_whose_heads_as_batch_passes_int32_has_none():
    cfg = decode(2**26 + 2**25)  # x 16 KV heads = 1.5 x 2**30 sequences, 1.5 x 2**30 elements
    assert bucket_form(cfg) is not None  # the step itself is bucketed: only its heads as batch are not
    assert heads_as_batch(cfg) is None
    assert heads_as_batch(decode(2**28)) is None  # 2**32 sequences


def test_a_decode_step_whose_heads_as_batch_passes_the_largest_bucket_has_none():
    # 2**30 + 16 sequences: a valid int32 batch whose bucket (2**31) is not.
    assert heads_as_batch(decode(2**26 + 1)) is None


def test_at_the_largest_bucket_the_heads_as_batch_problem_is_made():
    decode_problem = heads_as_batch(decode(LADDER_REACH_LIMIT // 16))
    assert decode_problem is not None and decode_problem.batch_size == LADDER_REACH_LIMIT
    assert bucket_form(decode_problem) is not None
