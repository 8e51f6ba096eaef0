"""A call whose tensors are too large for the bucket graphs' int32 ragged offsets runs its own graphs
on a GPU (runtime/entries: offsets_fit), so select() does not answer it by its shape bucket's verdict:
from a snapshot it is no data (its own graphs were not recorded), not the bucket's F16."""

from __future__ import annotations

import json

from fusedattn_select import AttnConfig, buckets
from fusedattn_select.selection.selector import selector_for

MODELS = "fusedattn_select/snapshots/h100-models.json"


def _llama_405b_prefill() -> AttnConfig:
    with open(MODELS) as handle:
        entry = next(e for e in json.load(handle)["entries"] if e["name"] == "llama-3.1-405b/full_attention/infer")
    return AttnConfig.from_dict(entry["config"])  # 128 query heads of 128: 2**14 elements a token


def test_a_call_whose_query_holds_2_31_elements_is_not_answered_by_its_bucket():
    base = _llama_405b_prefill()
    too_large = base.replace(batch_size=8, seqlen_q=16384, seqlen_kv=16384)  # Q: 2**31 elements
    below = base.replace(batch_size=7, seqlen_q=16384, seqlen_kv=16384)       # the same bucket, fits
    selector = selector_for(MODELS)
    answered = selector.select(below)
    assert answered.selected and answered.plan_form.startswith("bucket B=8 S_q=16384 S_kv=16384")
    assert selector.bucket_for(too_large) is None
    assert "int32 ragged offsets" in buckets.why_not_bucketed(too_large)
    refused_form = selector.select(too_large)
    assert refused_form.no_data and not refused_form.plan_form.startswith("bucket")


def test_the_largest_tensor_decides_q_k_v_and_o_alike():
    limit, why = buckets.RAGGED_OFFSET_LIMIT, buckets.why_not_bucketed
    one_head = dict(batch_size=1, num_heads_q=1, num_heads_kv=1, head_dim_qk=128)
    at_bound = AttnConfig(seqlen_q=limit // 128, seqlen_kv=64, **one_head)
    assert why(at_bound) and not why(at_bound.replace(seqlen_q=limit // 128 - 1))
    assert why(AttnConfig(seqlen_q=64, seqlen_kv=limit // 128, **one_head))  # K and V count too
    wide_v = AttnConfig(seqlen_q=64, seqlen_kv=limit // 256, head_dim_v=256, **{**one_head, "head_dim_qk": 64})
    assert why(wide_v) and buckets.bucket_form(wide_v) is None  # V's head dim where it is the larger
    assert buckets.bucket_form(wide_v.replace(seqlen_kv=limit // 256 - 1)) is not None
