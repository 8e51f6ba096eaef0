"""The mask mapping rules of the transformers integration (CPU): which cuDNN mask description
`cudnn_mask` gives a transformers mask (causal diagonals, padding runs, sliding windows), and which
masks it refuses (MaskNotExpressible: they run densely on torch SDPA).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fusedattn_select.integrations import transformers as fa_hf  # noqa: E402


def padded(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def test_causal_without_padding_is_top_left_causal():
    assert fa_hf.cudnn_mask(q_length=6, kv_length=6) == fa_hf.CudnnMask("causal", (-1, -1), 6, 6)


def test_decode_step_is_bottom_right_causal():
    mask = fa_hf.cudnn_mask(q_length=1, kv_length=7, q_offset=6)
    assert (mask.mask, mask.seqlens_q, mask.seqlens_kv) == ("causal_bottom_right", None, None)


def test_prefill_after_a_cache_is_bottom_right_causal():
    assert fa_hf.cudnn_mask(q_length=3, kv_length=8, q_offset=5).mask == "causal_bottom_right"


def test_an_all_ones_padding_mask_is_no_padding():
    mask = fa_hf.cudnn_mask(q_length=4, kv_length=4, padding_mask=torch.ones(2, 4, dtype=torch.bool))
    assert mask == fa_hf.CudnnMask("causal", (-1, -1), 4, 4)


def test_an_all_ones_padding_mask_in_decode_is_bottom_right_causal_without_lengths():
    # generate() hands the whole (B, positions) mask each step; a decode step reads its last query row.
    ones = torch.ones(2, 12, dtype=torch.bool)
    step = fa_hf.cudnn_mask(q_length=1, kv_length=12, q_offset=11, kv_offset=0, padding_mask=ones)
    assert step == fa_hf.CudnnMask("causal_bottom_right", (-1, -1), 1, 12)
    ones[1, 0] = False  # one left-padded sequence: lengths again
    step = fa_hf.cudnn_mask(q_length=1, kv_length=12, q_offset=11, kv_offset=0, padding_mask=ones)
    assert step.mask == "padding_causal_bottom_right" and step.seqlens_kv.tolist() == [12, 11]


def test_right_padding_gives_key_lengths_and_no_roll():
    mask = fa_hf.cudnn_mask(q_length=5, kv_length=5, padding_mask=padded([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    assert mask.mask == "padding_causal"
    # the two padding query rows see the 3 keys, as with "sdpa": they are not padding rows for cuDNN
    assert mask.seqlens_q.tolist() == [5, 5] and mask.seqlens_kv.tolist() == [3, 5]
    assert mask.seqlens_q.dtype == torch.int32 and mask.seqlens_kv.dtype == torch.int32
    assert mask.q_start is None and mask.kv_start is None


def test_left_padding_gives_sequence_lengths_and_roll_starts():
    mask = fa_hf.cudnn_mask(q_length=5, kv_length=5, padding_mask=padded([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]))
    assert mask.mask == "padding_causal"
    assert mask.seqlens_q.tolist() == [3, 5] and mask.seqlens_kv.tolist() == [3, 5]
    assert mask.q_start.tolist() == [2, 0] and mask.kv_start.tolist() == [2, 0]


def test_left_padded_decode_step_is_padding_bottom_right():
    mask = fa_hf.cudnn_mask(q_length=1, kv_length=6, q_offset=5,
                            padding_mask=padded([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]))
    assert mask.mask == "padding_causal_bottom_right"
    assert mask.seqlens_q.tolist() == [1, 1] and mask.seqlens_kv.tolist() == [4, 6]
    assert mask.q_start is None and mask.kv_start.tolist() == [2, 0]


def test_sliding_window_w_is_window_size_w_minus_1_left_and_0_right():
    # transformers: key j visible from query i iff j > i - w: w keys including the query's own.
    assert fa_hf.cudnn_mask(q_length=10, kv_length=10, sliding_window=4).window_size == (3, 0)


def test_sliding_window_that_cannot_cut_is_dropped():
    assert fa_hf.cudnn_mask(q_length=4, kv_length=4, sliding_window=4).window_size == (-1, -1)
    # a rolling sliding-window cache: one query and w keys, bottom-right
    decode = fa_hf.cudnn_mask(q_length=1, kv_length=4, q_offset=11, kv_offset=8, sliding_window=4)
    assert (decode.mask, decode.window_size) == ("causal_bottom_right", (-1, -1))


def test_sliding_window_on_a_bottom_right_diagonal_keeps_its_size():
    mask = fa_hf.cudnn_mask(q_length=4, kv_length=12, q_offset=8, sliding_window=4)
    assert (mask.mask, mask.window_size) == ("causal_bottom_right", (3, 0))


def test_empty_static_cache_slots_become_key_padding():
    mask = fa_hf.cudnn_mask(q_length=1, kv_length=16, q_offset=5, batch_size=2)
    assert mask.mask == "padding_causal_bottom_right"
    assert mask.seqlens_q.tolist() == [1, 1] and mask.seqlens_kv.tolist() == [6, 6]


def test_bidirectional_padding_is_a_padding_mask():
    mask = fa_hf.cudnn_mask(q_length=4, kv_length=4, causal=False, padding_mask=padded([[1, 1, 1, 0], [1, 1, 1, 1]]))
    assert (mask.mask, mask.seqlens_kv.tolist(), mask.seqlens_q.tolist()) == ("padding", [3, 4], [4, 4])


def test_a_mask_with_holes_is_not_expressible():
    with pytest.raises(fa_hf.MaskNotExpressible, match="holes"):
        fa_hf.cudnn_mask(q_length=4, kv_length=4, padding_mask=padded([[1, 0, 1, 1], [1, 1, 1, 1]]))


def test_a_fully_padded_sequence_is_not_expressible():
    with pytest.raises(fa_hf.MaskNotExpressible, match="no unmasked token"):
        fa_hf.cudnn_mask(q_length=4, kv_length=4, padding_mask=padded([[0, 0, 0, 0], [1, 1, 1, 1]]))


def test_a_diagonal_outside_the_keys_is_not_expressible():
    with pytest.raises(fa_hf.MaskNotExpressible, match="diagonal"):
        fa_hf.cudnn_mask(q_length=4, kv_length=6, q_offset=5)


def test_right_padded_query_rows_of_a_prefill_after_a_cache_are_not_expressible():
    # "sdpa" gives a query row after a sequence's tokens the keys before it; on the bottom-right diagonal
    # cuDNN could only give it zeros, so the mask runs densely (a chunked prefill, row 0 ends at position 6).
    with pytest.raises(fa_hf.MaskNotExpressible, match="right padding"):
        fa_hf.cudnn_mask(q_length=4, kv_length=8, q_offset=4,
                         padding_mask=padded([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]]))
    # rows padded on the left still map: they see no key, and come out zero as with "sdpa"
    left = fa_hf.cudnn_mask(q_length=4, kv_length=8, q_offset=4,
                            padding_mask=padded([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]]))
    assert left.mask == "padding_causal_bottom_right" and left.seqlens_q.tolist() == [4, 4]
