"""BucketIndex: a learned bucket answers every shape of its class it holds, until it is forgotten
(a remembered answer does not outlive the bucket)."""

from __future__ import annotations

from fusedattn_select.buckets import Bucket, bucket_form
from fusedattn_select.config import AttnConfig
from fusedattn_select.planning.bucket_index import BucketIndex
from fusedattn_select.types import Fingerprint


def _cfg(batch: int, seqlen: int) -> AttnConfig:
    return AttnConfig(batch_size=batch, num_heads_q=8, num_heads_kv=2, seqlen_q=seqlen, seqlen_kv=seqlen,
                      head_dim_qk=64, mask="causal")


def test_a_learned_bucket_answers_the_shapes_it_holds_until_forgotten():
    index = BucketIndex(None, Fingerprint(platform="none"))
    cfg = _cfg(2, 100)
    own = index.find(cfg)
    assert (own.batch_size, own.seqlen_q) == (2, 128)
    large = bucket_form(cfg, Bucket(4, 1024, 1024))
    index.remember(large)
    assert index.find(cfg) == large
    assert index.find(_cfg(8, 100)) != large  # a shape it does not hold
    index.forget(large)
    assert index.find(cfg) == own


def test_forms_are_made_once_per_class_and_bucket():
    index = BucketIndex(None, Fingerprint(platform="none"))
    assert index.find(_cfg(2, 100)) is index.find(_cfg(2, 120))
    assert index.find(_cfg(2, 100)) is not index.find(_cfg(2, 200))
