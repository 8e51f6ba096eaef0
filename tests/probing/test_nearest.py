"""Nearest recorded problems: which recorded problems are closest to one a snapshot has no data for.

Issue 36, item 2. Snapshots here are recorded with RecordingTestEngine (tests/conftest.py), a test
double that supports every head dim up to 256; the ranking is the library's.
"""

from __future__ import annotations

import random

import pytest

from fusedattn_select import AttnConfig, Backend
from fusedattn_select.errors import ConfigError
from fusedattn_select.probing import nearest as nearest_module
from fusedattn_select.probing.choice import bundled_engine
from fusedattn_select.probing.nearest import DERIVED_FROM, FIELDS, Difference, nearest
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.recorder import record_snapshot, write_snapshot

SUITE = """
name: near
defaults: {batch_size: 2, num_heads_q: 16, num_heads_kv: 4, seqlen_q: 1024, seqlen_kv: 1024, head_dim_qk: 128}
configs:
  - {name: causal-b8, mask: causal, batch_size: 8}
  - {name: causal-gqa8, mask: causal, num_heads_kv: 2}
  - {name: a-long, seqlen_q: 4096, seqlen_kv: 4096}
  - {name: b-short, seqlen_q: 512, seqlen_kv: 512}
  - {name: bias-bf16, bias: pre_scale_bias}
  - {name: fp8-causal-gqa, qkv_dtype: fp8_e4m3, mask: causal, num_heads_kv: 2}
  - {name: infer-causal, mask: causal, is_training: false}
  - {name: infer-window, mask: causal, window_size: [128, 0], is_training: false}
  - {name: d64-explicit-v, head_dim_qk: 64, head_dim_v: 64, mask: causal}
  - {name: too-wide, head_dim_qk: 512, is_training: false}
"""
BASE = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128)


@pytest.fixture
def engine(tmp_path, recording_engine):
    suite = tmp_path / "near.yaml"
    suite.write_text(SUITE)
    return SnapshotEngine.load(write_snapshot(record_snapshot([suite], recording_engine), tmp_path / "near.json"))


def names(found):
    return [near.problem.name for near in found]


def test_the_asked_class_at_another_shape_comes_before_other_classes(engine):
    found = engine.nearest(BASE.replace(mask="causal", batch_size=3))
    assert names(found)[0] == "causal-b8"
    assert found[0].differences == (Difference("batch_size", 3, 8),)


def test_fewer_differing_class_fields_come_first(engine):
    # causal-gqa8 is the asked class (batch differs); causal-b8 differs in one class field
    # (num_heads_kv); d64-explicit-v in two (head_dim_v counts with head_dim_qk), as others do, but
    # in one shape field.
    found = engine.nearest(BASE.replace(mask="causal", batch_size=8, num_heads_kv=2), limit=3)
    assert names(found) == ["causal-gqa8", "causal-b8", "d64-explicit-v"]


def test_a_smaller_size_difference_comes_first_whatever_the_names(engine):
    # a-long (4096, twice as far in log2) sorts before b-short by name; size decides first.
    found = engine.nearest(BASE.replace(seqlen_q=2048, seqlen_kv=2048, batch_size=3), limit=2)
    assert names(found) == ["a-long", "b-short"]
    found = engine.nearest(BASE.replace(seqlen_q=700, seqlen_kv=700, batch_size=3), limit=2)
    assert names(found) == ["b-short", "a-long"]


def test_the_same_backend_comes_before_a_closer_problem_of_another(engine):
    # bias-bf16 differs only in qkv_dtype; the FP8 problem differs in mask, heads and bias.
    found = engine.nearest(BASE.replace(qkv_dtype="fp8_e4m3", bias="pre_scale_bias"))
    assert names(found)[0] == "fp8-causal-gqa"
    assert names(found)[1] == "bias-bf16"
    assert [d.field for d in found[1].differences] == ["qkv_dtype"]


def test_the_same_phases_come_before_a_closer_problem_of_other_phases(engine):
    # infer-window differs only in is_training; causal-b8 in window_size and batch_size; every other
    # training problem in more. The six bf16 training problems come first, then infer-window.
    found = engine.nearest(BASE.replace(mask="causal", window_size=(128, 0)), limit=20)
    assert names(found)[0] == "causal-b8"
    assert names(found).index("infer-window") == 6
    assert [d.field for d in found[6].differences] == ["is_training"]


def test_a_derived_field_both_leave_to_be_derived_is_not_listed(engine):
    found = engine.nearest(BASE.replace(mask="causal", head_dim_qk=96), limit=9)
    by_name = {near.problem.name: near for near in found}
    # head_dim_v and attn_scale are derived from head_dim_qk on both sides: only head_dim_qk differs.
    assert [d.field for d in by_name["causal-b8"].differences] == ["batch_size", "head_dim_qk"]


def test_a_derived_field_given_on_one_side_is_listed_but_counted_with_its_source(engine):
    found = engine.nearest(BASE.replace(mask="causal", head_dim_qk=96, num_heads_kv=2), limit=9)
    d64 = next(near for near in found if near.problem.name == "d64-explicit-v")
    assert d64.differences == (Difference("num_heads_kv", 2, 4), Difference("head_dim_qk", 96, 64),
                               Difference("head_dim_v", 96, 64))
    assert nearest_module.counted(d64.differences) == d64.differences[:2]


def test_an_explicit_value_equal_to_the_derived_one_is_no_difference(engine):
    # d64-explicit-v gives head_dim_v=64; asked leaves it None with head_dim_qk=64.
    found = engine.nearest(BASE.replace(mask="causal", head_dim_qk=64, batch_size=3))
    assert names(found)[0] == "d64-explicit-v"
    assert found[0].differences == (Difference("batch_size", 3, 2),)


def test_the_problem_asked_is_never_its_own_neighbour(engine):
    asked = BASE.replace(mask="causal", batch_size=8)
    assert "causal-b8" not in names(engine.nearest(asked, limit=20))


def test_the_order_does_not_depend_on_the_order_recorded(engine):
    asked = BASE.replace(batch_size=5, seqlen_q=800, seqlen_kv=800)
    expected = nearest(asked, engine.recorded, limit=20)
    shuffled = list(engine.recorded)
    random.Random(36).shuffle(shuffled)
    assert nearest(asked, shuffled, limit=20) == expected
    assert len(expected) == len(engine.recorded)


def test_each_neighbour_keeps_its_recorded_verdicts(engine):
    found = engine.nearest(BASE.replace(head_dim_qk=384, is_training=False), limit=1)
    assert names(found) == ["too-wide"]
    problem = found[0].problem
    assert problem.backend is Backend.NONE
    assert problem.reasons == ("F16 forward not supported at check_support: head dim above 256",)
    document = found[0].to_dict()
    assert document["recorded_backend"] == "NONE" and document["name"] == "too-wide"
    assert document["differs"][0] == {"field": "head_dim_qk", "asked": 384, "recorded": 512}
    assert "backend" not in document  # never an answer's key


def test_limit_zero_lists_none_and_a_bad_limit_is_an_error_naming_it(engine):
    assert engine.nearest(BASE, limit=0) == ()
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ConfigError, match=r"^limit="):
            engine.nearest(BASE, limit=bad)


def test_every_field_config_resolves_differently_from_its_given_value_is_a_derived_field():
    configs = [
        BASE, BASE.replace(is_training=False, mask="causal_bottom_right"),
        BASE.replace(qkv_dtype="fp8_e4m3", scaling_mode="current"), BASE.replace(qkv_layout="sbhd_sbhd_sbhd"),
    ]
    for cfg in configs:
        given, resolved = cfg.to_dict(include_defaults=True), cfg.resolved()
        changed = {name for name in FIELDS if given[name] != resolved[name]}
        assert changed <= set(DERIVED_FROM), changed - set(DERIVED_FROM)
    for name, sources in DERIVED_FROM.items():
        assert hasattr(AttnConfig, "resolved_" + name) and set(sources) <= set(FIELDS)


def test_bundled_snapshots_list_nearby_llama_problems_for_an_unrecorded_shape():
    engine = bundled_engine("h100")
    asked = AttnConfig(batch_size=7, num_heads_q=32, num_heads_kv=8, seqlen_q=1000, seqlen_kv=1000,
                       head_dim_qk=128, mask="causal")
    found = engine.nearest(asked)
    assert len(found) == 3
    # Llama-3-8B's class (32/8 heads, d128, causal, training) recorded at other shapes comes first: the
    # model suite's llama-3.1-8b (batch 1, length 4096) is closer in size than llama-3-8b.yaml's (2, 8192).
    assert [(near.problem.label, near.problem.file_name) for near in found[:2]] == [
        ("hf-models.yaml/llama-3.1-8b/full_attention/train", "h100-models.json"),
        ("llama-3-8b.yaml/train-bf16", "h100-configs.json"),
    ]
    for near in found[:2]:
        assert {d.field for d in near.differences} == {"batch_size", "seqlen_q", "seqlen_kv"}
    assert {d.field for d in found[2].differences} > {"batch_size", "seqlen_q", "seqlen_kv"}
    assert engine.nearest(asked) == found


@pytest.mark.parametrize("changes", [
    {}, {"qkv_dtype": "fp8_e4m3", "is_training": False}, {"head_dim_qk": 96, "head_dim_v": 64},
    {"mask": "causal_bottom_right", "seqlen_q": 1, "window_size": (256, 0)}, {"num_heads_kv": 1, "dropout": 0.1},
])
def test_the_closest_found_are_the_first_of_every_recorded_problem_sorted_by_closeness(changes):
    # nearest() compares in full only the problems whose cheap bound can still make the list.
    engine = bundled_engine("h100")
    asked = AttnConfig(batch_size=7, num_heads_q=32, num_heads_kv=8, seqlen_q=1000, seqlen_kv=1000,
                       head_dim_qk=128).replace(**changes)
    everything = sorted(
        (nearest_module.closeness(asked, problem, nearest_module.differences(asked, problem)), problem.label)
        for problem in engine.recorded if problem.config.cache_key() != asked.cache_key()
    )
    for limit in (1, 3, 10):
        assert [near.problem.label for near in engine.nearest(asked, limit)] == [label for _, label in everything[:limit]]
