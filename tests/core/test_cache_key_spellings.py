"""One cuDNN problem, one cache key: spellings of a problem that the probe builds as one graph key
alike (AttnConfig.resolved_mask / resolved_window_size), and canonical spellings keep their keys.

- A causal mask bounds the right side at the diagonal (the probe sets the right bound 0 for any
  causal mask), so window_size (l, 0) and (l, -1) are one problem with a causal mask.
- `causal` / `padding_causal` with bottom_right_diagonal: true is aligned bottom-right (the probe
  reads resolved_bottom_right_diagonal), the problem of `causal_bottom_right` / `padding_causal_bottom_right`.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fusedattn_select import AttnConfig
from fusedattn_select.selection.local_warmup import distinct_problems

BASE = dict(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=128, seqlen_kv=256, head_dim_qk=64)


def make(**fields):
    return AttnConfig(**BASE, **fields)


SAME = {
    "causal_right_0": (dict(mask="causal"), dict(mask="causal", window_size=(-1, 0))),
    "causal_window_right_0": (dict(mask="causal", window_size=(128, -1)), dict(mask="causal", window_size=(128, 0))),
    "padding_causal_right_0": (dict(mask="padding_causal"), dict(mask="padding_causal", window_size=(-1, 0))),
    "bottom_right_right_0": (dict(mask="causal_bottom_right"), dict(mask="causal_bottom_right", window_size=(-1, 0))),
    "causal_bottom_right_diagonal": (dict(mask="causal_bottom_right"), dict(mask="causal", bottom_right_diagonal=True)),
    "padding_causal_bottom_right_diagonal": (
        dict(mask="padding_causal_bottom_right"), dict(mask="padding_causal", bottom_right_diagonal=True)),
    "both": (dict(mask="causal_bottom_right", window_size=(64, -1)),
             dict(mask="causal", bottom_right_diagonal=True, window_size=(64, 0))),
    "bottom_right_given_true": (dict(mask="causal_bottom_right"), dict(mask="causal_bottom_right",
                                                                        bottom_right_diagonal=True)),
    "causal_given_false": (dict(mask="causal"), dict(mask="causal", bottom_right_diagonal=False)),
}

DIFFERENT = {
    # without a causal mask, a right bound of 0 is a window: another graph
    "no_mask_right_0": (dict(mask="no_mask"), dict(mask="no_mask", window_size=(-1, 0))),
    "padding_right_0": (dict(mask="padding"), dict(mask="padding", window_size=(-1, 0))),
    "top_left_vs_bottom_right": (dict(mask="causal"), dict(mask="causal_bottom_right")),
    # bottom_right_diagonal aligns a window without a causal mask; it makes no causal mask
    "no_mask_window_bottom_right": (dict(mask="no_mask", window_size=(64, 0)),
                                    dict(mask="no_mask", window_size=(64, 0), bottom_right_diagonal=True)),
}


@pytest.mark.parametrize("case", sorted(SAME))
def test_spellings_of_one_problem_have_one_cache_key_and_class_key(case):
    canonical, other = (make(**fields) for fields in SAME[case])
    assert other.cache_key() == canonical.cache_key()
    assert other.shape_class_key() == canonical.shape_class_key()
    assert other.resolved() == canonical.resolved()
    shape = dict(batch_size=4, seqlen_q=256, seqlen_kv=256)  # another shape of each (ClassKeys' text path)
    assert other.replace(**shape).cache_key() == canonical.replace(**shape).cache_key()


@pytest.mark.parametrize("case", sorted(DIFFERENT))
def test_different_problems_keep_different_keys(case):
    a, b = (make(**fields) for fields in DIFFERENT[case])
    assert a.cache_key() != b.cache_key()


def test_canonical_spellings_keep_the_keys_they_had():
    # The keys before spellings were merged: stored entries of canonical problems are still found.
    assert make(mask="causal").cache_key() == "ca3c7e8c204a7dafe56ac2928f3e3964"
    assert make(mask="causal_bottom_right").cache_key() == "0603546464372e62fb3af16392b906d3"


def test_the_fields_keep_their_given_spelling_and_resolved_gives_the_canonical_one():
    cfg = make(mask="causal", bottom_right_diagonal=True, window_size=(64, 0))
    assert (cfg.mask, cfg.window_size, cfg.bottom_right_diagonal) == ("causal", (64, 0), True)
    assert cfg.to_dict()["mask"] == "causal" and cfg.to_dict()["window_size"] == [64, 0]
    assert (cfg.resolved_mask, cfg.resolved_window_size) == ("causal_bottom_right", (64, -1))
    resolved = cfg.resolved()
    assert (resolved["mask"], resolved["window_size"], resolved["bottom_right_diagonal"]) == (
        "causal_bottom_right", [64, -1], True)
    assert cfg.is_causal and cfg.resolved_bottom_right_diagonal


def test_warmup_probes_two_spellings_of_one_problem_once():
    spellings = [make(mask="causal"), make(mask="causal", window_size=(-1, 0)),
                 make(mask="causal_bottom_right"), make(mask="causal", bottom_right_diagonal=True)]
    problems, duplicates = distinct_problems(spellings)
    assert (len(problems), duplicates) == (2, 2)


# ----- the probe builds one graph for the spellings that share a key --------------------------------
class _AllFeatures:
    version = "test"

    def accepts(self, operation, argument):
        return True


class _OldFrontend(_AllFeatures):
    """A frontend without diagonal bands: causal flags and a left-only sliding window."""

    def accepts(self, operation, argument):
        return argument in ("use_causal_mask", "use_causal_mask_bottom_right", "sliding_window_length")


@pytest.mark.parametrize("features", [_AllFeatures(), _OldFrontend()], ids=["diagonal_band", "causal_flags"])
@pytest.mark.parametrize("case", sorted(SAME))
def test_the_cudnn_probe_builds_the_same_mask_arguments_for_one_key(case, features):
    from fusedattn_select.probing.cudnn.description import Description, _mask_arguments

    cudnn = SimpleNamespace(diagonal_alignment=SimpleNamespace(BOTTOM_RIGHT="bottom_right", TOP_LEFT="top_left"))
    canonical, other = (make(**fields) for fields in SAME[case])
    args = [_mask_arguments(Description(cudnn, None, cfg, features, "sdpa")) for cfg in (canonical, other)]
    assert args[0] == args[1]


@pytest.mark.parametrize("case", sorted(SAME))
def test_the_rocm_checks_read_one_mask_kind_for_one_key(case):
    from fusedattn_select.probing.rocm.checks import mask_kind

    canonical, other = (make(**fields) for fields in SAME[case])
    assert mask_kind(canonical) == mask_kind(other)
