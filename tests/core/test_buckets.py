"""The shape-bucket ladder and the bucket form of a problem."""

from __future__ import annotations

import pytest

from fusedattn_select import AttnConfig
from fusedattn_select.buckets import (
    MIN_SEQLEN,
    Bucket,
    bucket_batch,
    bucket_form,
    bucket_seqlen,
    heads_as_batch,
    larger_buckets,
    why_not_bucketed,
)

BASE = dict(batch_size=3, num_heads_q=32, num_heads_kv=8, seqlen_q=1000, seqlen_kv=1000, head_dim_qk=128)


@pytest.mark.parametrize("n, expected", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (33, 64), (512, 512)])
def test_batch_sizes_round_up_to_powers_of_two(n, expected):
    assert bucket_batch(n) == expected


@pytest.mark.parametrize("s, expected", [(1, 1), (2, MIN_SEQLEN), (63, 64), (64, 64), (65, 128), (129, 256),
                                         (1000, 1024), (1025, 2048), (8192, 8192)])
def test_sequence_lengths_round_up_and_a_decode_step_is_its_own_bucket(s, expected):
    assert bucket_seqlen(s) == expected


def test_a_bucket_holds_every_smaller_shape():
    bucket = Bucket.of(3, 1000, 700)
    assert bucket == Bucket(4, 1024, 1024)
    assert bucket.holds(1, 1, 1) and bucket.holds(4, 1024, 1024)
    assert not bucket.holds(5, 10, 10) and not bucket.holds(1, 1025, 10)


@pytest.mark.parametrize("mask, padded", [("no_mask", "padding"), ("causal", "padding_causal"),
                                          ("causal_bottom_right", "padding_causal_bottom_right"),
                                          ("padding", "padding")])
def test_the_bucket_form_is_the_ragged_padding_problem_at_the_bucket(mask, padded):
    cfg = AttnConfig(**BASE, mask=mask)
    form = bucket_form(cfg)
    assert (form.batch_size, form.seqlen_q, form.seqlen_kv) == (4, 1024, 1024)
    assert form.qkv_layout == "thd_thd_thd" and form.o_format == "thd" and form.dqkv_layout == "thd_thd_thd"
    assert form.mask == padded
    assert form.resolved_bottom_right_diagonal == cfg.resolved_bottom_right_diagonal
    # Everything else reaches the probe as the caller gave it.
    for name in ("num_heads_q", "num_heads_kv", "head_dim_qk", "qkv_dtype", "window_size", "dropout",
                 "is_training", "deterministic", "softmax", "attn_scale"):
        assert getattr(form, name) == getattr(cfg, name)


def test_shapes_of_one_bucket_share_one_form_and_other_buckets_do_not():
    forms = {bucket_form(AttnConfig(**{**BASE, "batch_size": b, "seqlen_q": s, "seqlen_kv": s})).cache_key()
             for b, s in [(3, 1000), (4, 1024), (4, 777), (3, 513)]}
    assert len(forms) == 1
    assert bucket_form(AttnConfig(**{**BASE, "seqlen_q": 1025, "seqlen_kv": 1025})).cache_key() not in forms


@pytest.mark.parametrize("changes, reason", [
    (dict(qkv_layout="thd_thd_thd", o_format="thd", do_format="thd", mask="padding"), "not one of separate"),
    (dict(bias="post_scale_bias", bias_shape="1hss"), "per-position values"),
    (dict(qkv_dtype="fp8_e4m3"), "FP8"),
    (dict(cuda_graph=True), "captured shape"),
])
def test_problems_without_a_bucket_form_say_why(changes, reason):
    cfg = AttnConfig(**{**BASE, **changes})
    assert reason in why_not_bucketed(cfg)
    assert bucket_form(cfg) is None


def test_larger_buckets_climb_the_ladder_smallest_first():
    above = larger_buckets(Bucket(2, 256, 256), batch_doublings=1, length_doublings=2)
    assert above == [Bucket(4, 256, 256), Bucket(2, 512, 512), Bucket(4, 512, 512), Bucket(2, 1024, 1024),
                     Bucket(4, 1024, 1024)]
    decode = larger_buckets(Bucket(1, 1, 256), batch_doublings=0, length_doublings=2)
    assert decode == [Bucket(1, 1, 512), Bucket(1, 1, 1024)]
    assert all(b.holds(2, 256, 256) for b in above)


# ----- heads_as_batch: a decode step with BHSD keys and values -------------------------------------
DECODE = AttnConfig(batch_size=3, num_heads_q=32, num_heads_kv=8, seqlen_q=1, seqlen_kv=233, head_dim_qk=128,
                    qkv_layout="bhsd_bhsd_bhsd", is_training=False)


def test_a_decode_step_runs_one_sequence_per_kv_head_with_its_query_group_as_rows():
    form = heads_as_batch(DECODE)
    assert (form.batch_size, form.num_heads_q, form.num_heads_kv, form.seqlen_q, form.seqlen_kv) == (24, 1, 1, 4, 233)
    assert form.qkv_layout == "bshd_bshd_bshd" and form.mask == "no_mask" and form.head_dim_qk == 128
    assert form.resolved_attn_scale == DECODE.resolved_attn_scale  # the scale of the caller's head dim
    mha = heads_as_batch(DECODE.replace(num_heads_q=8))
    assert (mha.batch_size, mha.seqlen_q) == (24, 1)


@pytest.mark.parametrize("changes", [
    dict(mask="causal_bottom_right"), dict(mask="causal", bottom_right_diagonal=True),
    dict(mask="causal_bottom_right", window_size=(-1, 0)),
])
def test_a_mask_that_lets_the_query_row_see_every_key_is_the_same_problem(changes):
    assert heads_as_batch(DECODE.replace(**changes)) == heads_as_batch(DECODE)


@pytest.mark.parametrize("changes", [
    dict(seqlen_q=2), dict(is_training=True), dict(mask="causal"), dict(mask="padding"),
    dict(window_size=(128, 0), mask="causal_bottom_right"), dict(qkv_layout="bshd_bshd_bshd"),
    dict(bias="post_scale_bias", bias_shape="1hss"), dict(softmax="off_by_one"), dict(dropout=0.1),
    dict(qkv_dtype="fp8_e4m3"), dict(cuda_graph=True),
])
def test_other_problems_keep_their_heads(changes):
    assert heads_as_batch(DECODE.replace(**changes)) is None


@pytest.mark.parametrize("sizes", [dict(seqlen_q=2**31 - 1, seqlen_kv=2**31 - 1), dict(batch_size=2**30 + 1),
                                   dict(seqlen_kv=2**30 + 1)])
def test_a_problem_whose_bucket_passes_the_int32_bound_has_no_bucket_form(sizes):
    cfg = AttnConfig(**dict(BASE, **sizes))
    assert "passes the int32 bound" in why_not_bucketed(cfg) and bucket_form(cfg) is None
    # One head of 1 element: lengths of 2**30 still fit the bucket plans' int32 ragged offsets.
    at_bound = AttnConfig(**dict(BASE, batch_size=1, num_heads_q=1, num_heads_kv=1, head_dim_qk=1,
                                 seqlen_q=2**30, seqlen_kv=2**30))
    assert why_not_bucketed(at_bound) == "" and bucket_form(at_bound).seqlen_kv == 2**30
    assert bucket_form(cfg, Bucket(1, 2**31, 2**31)) is None


def test_select_answers_a_problem_at_the_int32_bound():
    from fusedattn_select.probing.snapshot import SnapshotEngine
    from fusedattn_select.selection.selector import Selector
    from pathlib import Path

    import fusedattn_select

    snapshot = Path(fusedattn_select.__file__).parent / "snapshots" / "h100-configs.json"
    selection = Selector(SnapshotEngine.load(snapshot)).select(AttnConfig(**dict(BASE, seqlen_q=2**31 - 1,
                                                                                seqlen_kv=2**31 - 1)))
    assert selection.message  # an answer (whatever it is), not a ConfigError about the bucket's size
