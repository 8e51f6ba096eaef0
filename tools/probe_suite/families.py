"""The suite's families: each adds the problems of one part of the cuDNN support matrix.

The order of the families, and of the additions inside each, is the order of the written suite.
"""

from __future__ import annotations

from fusedattn_select.config import BIAS_SHAPES, MASKS
from fusedattn_select.layouts import LAYOUTS
from tools.probe_suite.entries import Suite, paged

NON_PAGED_LAYOUTS = tuple(name for name, layout in LAYOUTS.items() if not layout.paged)
PAGED_LAYOUTS = tuple(name for name, layout in LAYOUTS.items() if layout.paged)

TRAIN_INFER = (True, False)
HEAD_DIMS_EQUAL = (32, 48, 60, 64, 72, 80, 96, 128, 160, 192, 256)
# (head_dim_qk, head_dim_v) pairs with head_dim_v != head_dim_qk, or beyond 256.
HEAD_DIMS_MIXED = (
    (192, 128),  # DeepSeek MLA (nope 128 + rope 64, v 128)
    (160, 128), (96, 128), (64, 128), (128, 64), (128, 256), (256, 128),
    (320, 320), (256, 320), (512, 512), (576, 512),  # 576/512: MLA absorbed (latent 512 + rope 64)
)

# Decode from a paged KV cache: one query token over 2048 cached ones.
PAGED_DECODE = dict(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding_causal_bottom_right",
                    seqlen_q=1, seqlen_kv=2048, is_training=False, **paged(2, 2048))


def head_dims(s: Suite) -> None:
    """Head dims (bf16 and fp16; causal and no_mask; training and inference)."""
    for d in HEAD_DIMS_EQUAL:
        for train in TRAIN_INFER:
            s.add(head_dim_qk=d, head_dim_v=d, is_training=train)
        s.add(head_dim_qk=d, head_dim_v=d, mask="no_mask", is_training=True)
        s.add(head_dim_qk=d, head_dim_v=d, qkv_dtype="fp16", is_training=True)
    for qk, v in HEAD_DIMS_MIXED:
        for train in TRAIN_INFER:
            s.add(head_dim_qk=qk, head_dim_v=v, is_training=train)
        s.add(head_dim_qk=qk, head_dim_v=v, mask="no_mask", is_training=True)
        s.add(head_dim_qk=qk, head_dim_v=v, qkv_dtype="fp16", is_training=True)


def gqa(s: Suite) -> None:
    """GQA / MQA ratios."""
    for hkv in (16, 8, 4, 2, 1):
        for train in TRAIN_INFER:
            s.add(num_heads_kv=hkv, is_training=train)
        for d in (64, 256):
            s.add(num_heads_kv=hkv, head_dim_qk=d, head_dim_v=d, is_training=True)
    for hq, hkvs in ((8, (8, 4, 1)), (12, (12, 4, 3, 1))):
        for hkv in hkvs:
            for train in TRAIN_INFER:
                s.add(num_heads_q=hq, num_heads_kv=hkv, head_dim_qk=64, head_dim_v=64, is_training=train)
    for hkv in (4, 1):
        s.add(num_heads_kv=hkv, qkv_dtype="fp16", is_training=True)
        s.add(num_heads_kv=hkv, mask="no_mask", is_training=True)
        s.add(num_heads_kv=hkv, mask="padding_causal", is_training=False)
    s.add(num_heads_kv=8, head_dim_qk=192, head_dim_v=128, is_training=True)


def masks(s: Suite) -> None:
    """Every mask."""
    for mask in MASKS:
        for train in TRAIN_INFER:
            s.add(mask=mask, is_training=train)
        s.add(mask=mask, head_dim_qk=64, head_dim_v=64, is_training=True)
        s.add(mask=mask, qkv_dtype="fp16", is_training=True)
        s.add(mask=mask, qkv_dtype="fp16", head_dim_qk=64, head_dim_v=64, is_training=False)
        s.add(mask=mask, num_heads_kv=4, is_training=True)
        s.add(mask=mask, head_dim_qk=256, head_dim_v=256, is_training=True)


def seqlens(s: Suite) -> None:
    """Seqlen_q != seqlen_kv (top-left vs bottom-right diagonals), decode."""
    for sq, skv, modes in ((128, 1024, TRAIN_INFER), (512, 2048, (True,)), (1024, 256, (False,))):
        for mask in MASKS:
            for train in modes:
                s.add(seqlen_q=sq, seqlen_kv=skv, mask=mask, num_heads_kv=4, is_training=train)
    for mask in ("causal_bottom_right", "padding_causal_bottom_right", "no_mask", "padding"):
        s.add(seqlen_q=1, seqlen_kv=2048, mask=mask, num_heads_kv=4, is_training=False)
    for skv in (1024, 129):
        for mask in ("causal_bottom_right", "padding_causal_bottom_right"):
            s.add(seqlen_q=1, seqlen_kv=skv, mask=mask, num_heads_kv=4, is_training=False)
    s.add(seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", head_dim_qk=64, head_dim_v=64, is_training=False)
    s.add(seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", head_dim_qk=256, head_dim_v=256, num_heads_kv=8, is_training=False)
    s.add(seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", num_heads_kv=1, qkv_dtype="fp16", is_training=False)
    for train in TRAIN_INFER:
        s.add(seqlen_q=128, seqlen_kv=1024, mask="causal", bottom_right_diagonal=True, is_training=train)
        s.add(seqlen_q=128, seqlen_kv=1024, mask="causal_bottom_right", bottom_right_diagonal=True, is_training=train)
        s.add(seqlen_q=128, seqlen_kv=1024, mask="causal_bottom_right", qkv_dtype="fp16", is_training=train)
    for sq, skv in ((200, 1000), (1000, 1000), (2048, 2048), (128, 128), (333, 777)):
        for train in TRAIN_INFER:
            mask = "causal" if sq == skv else "causal_bottom_right"
            s.add(seqlen_q=sq, seqlen_kv=skv, mask=mask, is_training=train)
    s.add(batch_size=1, seqlen_q=2048, seqlen_kv=2048, is_training=True)
    s.add(batch_size=4, seqlen_q=1024, seqlen_kv=1024, num_heads_kv=4, is_training=True)


def windows(s: Suite) -> None:
    """Sliding windows."""
    for left in (63, 127, 255, 511, 1023):
        for train in TRAIN_INFER:
            s.add(window_size=[left, 0], is_training=train)
    for train in TRAIN_INFER:
        s.add(window_size=[255, -1], is_training=train)
        s.add(window_size=[127, 0], head_dim_qk=64, head_dim_v=64, num_heads_kv=4, is_training=train)
        s.add(window_size=[255, 0], head_dim_qk=256, head_dim_v=256, num_heads_kv=8, is_training=train)
        s.add(window_size=[255, 0], seqlen_q=128, seqlen_kv=1024, mask="causal_bottom_right", is_training=train)
        s.add(window_size=[255, 0], mask="padding_causal", is_training=train)
        s.add(window_size=[255, 0], seqlen_q=256, seqlen_kv=1024, mask="padding_causal_bottom_right", is_training=train)
        s.add(window_size=[1023, 0], seqlen_q=2048, seqlen_kv=2048, num_heads_kv=4, is_training=train)
        for window in ([128, 128], [128, -1], [-1, 128], [255, 0]):
            s.add(window_size=window, mask="no_mask", is_training=train)
        s.add(window_size=[128, 128], mask="padding", is_training=train)
        s.add(window_size=[128, 128], mask="no_mask", seqlen_q=128, seqlen_kv=1024, bottom_right_diagonal=True, is_training=train)
        s.add(window_size=[128, 128], mask="no_mask", seqlen_q=128, seqlen_kv=1024, bottom_right_diagonal=False, is_training=train)
    for window in ([64, 64], [256, 256], [0, 255]):
        s.add(window_size=window, mask="no_mask", is_training=True)
    s.add(window_size=[1023, 0], seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", num_heads_kv=4, is_training=False)
    s.add(window_size=[511, 0], qkv_dtype="fp16", is_training=True)
    s.add(window_size=[128, 128], mask="no_mask", qkv_dtype="fp16", is_training=True)


def layouts(s: Suite) -> None:
    """Layouts."""
    main_layouts = (
        "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd", "bs3hd", "sb3hd", "bshd_bs2hd", "sbhd_bshd_bshd",
        "thd_thd_thd",
    )
    for layout in NON_PAGED_LAYOUTS:
        ragged = LAYOUTS[layout].ragged
        packing = LAYOUTS[layout].packing
        mask = "padding_causal" if ragged else "causal"
        for train in TRAIN_INFER:
            s.add(qkv_layout=layout, mask=mask, is_training=train)
        if ragged:
            s.add(qkv_layout=layout, mask="padding", is_training=True)
        if packing not in ("3hd", "h3d"):
            s.add(qkv_layout=layout, mask=mask, num_heads_kv=4, is_training=True)
            s.add(qkv_layout=layout, seqlen_q=256, seqlen_kv=1024,
                  mask="padding_causal_bottom_right" if ragged else "causal_bottom_right", is_training=False)
        if layout in main_layouts:
            s.add(qkv_layout=layout, mask=mask, qkv_dtype="fp16", head_dim_qk=64, head_dim_v=64, is_training=True)
            s.add(qkv_layout=layout, mask="padding" if ragged else "no_mask", is_training=True)
    s.add(qkv_layout="thd_thd_thd", mask="padding_causal_bottom_right", seqlen_q=512, seqlen_kv=512, is_training=True)
    s.add(qkv_layout="thd_thd_thd", mask="padding_causal", window_size=[255, 0], is_training=True)
    s.add(qkv_layout="thd_thd_thd", mask="padding_causal", head_dim_qk=192, head_dim_v=128, is_training=True)
    # separate output / gradient formats and dQKV layouts
    s.add(qkv_layout="bshd_bshd_bshd", o_format="sbhd", is_training=True)
    s.add(qkv_layout="sbhd_sbhd_sbhd", o_format="bshd", do_format="bshd", is_training=True)
    s.add(qkv_layout="bhsd_bhsd_bhsd", o_format="bshd", is_training=False)
    s.add(qkv_layout="sbhd_bshd_bshd", o_format="bshd", is_training=True)
    s.add(qkv_layout="bshd_bshd_bshd", dqkv_layout="sbhd_sbhd_sbhd", is_training=True)
    s.add(qkv_layout="bs3hd", dqkv_layout="bshd_bshd_bshd", is_training=True)
    s.add(qkv_layout="thd_thd_thd", mask="padding_causal", o_format="thd", dqkv_layout="t3hd", is_training=True)
    # paged KV caches: inference only, padding masks
    for layout in PAGED_LAYOUTS:
        s.add(qkv_layout=layout, mask="padding_causal", num_heads_kv=4, is_training=False, **paged(2, 512))
        s.add(qkv_layout=layout, mask="padding_causal_bottom_right", seqlen_q=1, seqlen_kv=2048,
              num_heads_kv=4, is_training=False, **paged(2, 2048))
    for page_size in (16, 32, 128, 256):
        s.add(qkv_layout="paged_kv_bshd_bshd_bshd", mask="padding_causal_bottom_right", seqlen_q=1,
              seqlen_kv=2048, num_heads_kv=4, is_training=False, **paged(2, 2048, page_size))
    s.add(**PAGED_DECODE, head_dim_qk=64, head_dim_v=64)
    s.add(**PAGED_DECODE, head_dim_qk=256, head_dim_v=256, num_heads_kv=8)
    s.add(**PAGED_DECODE, num_heads_kv=1, qkv_dtype="fp16")
    s.add(**PAGED_DECODE, num_heads_kv=4, window_size=[1023, 0])
    s.add(**{**PAGED_DECODE, "mask": "padding"}, num_heads_kv=4)
    s.add(**{**PAGED_DECODE, "seqlen_q": 128}, num_heads_kv=4)  # chunked prefill
    s.add(**{**PAGED_DECODE, "num_pages": 128}, num_heads_kv=4)  # pool larger than needed
    s.add(**PAGED_DECODE, num_heads_kv=4, cuda_graph=True)


def fp8(s: Suite) -> None:
    """FP8."""
    e4m3 = dict(qkv_dtype="fp8_e4m3")
    for mode in ("delayed", "current"):
        for d in (64, 128, 192, 256):
            for train in TRAIN_INFER:
                s.add(**e4m3, scaling_mode=mode, head_dim_qk=d, head_dim_v=d, is_training=train)
        for train in TRAIN_INFER:
            s.add(**e4m3, scaling_mode=mode, mask="no_mask", is_training=train)
            s.add(**e4m3, scaling_mode=mode, mask="padding_causal", is_training=train)
            s.add(**e4m3, scaling_mode=mode, num_heads_kv=4, is_training=train)
            s.add(qkv_dtype="fp8_e5m2", scaling_mode=mode, is_training=train)
        s.add(**e4m3, scaling_mode=mode, num_heads_kv=1, is_training=False)
        s.add(**e4m3, scaling_mode=mode, deterministic=True, is_training=True)
        s.add(**e4m3, scaling_mode=mode, head_dim_qk=192, head_dim_v=128, is_training=True)
        s.add(**e4m3, scaling_mode=mode, seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right",
              num_heads_kv=4, is_training=False)
    for train in TRAIN_INFER:
        s.add(**e4m3, scaling_mode="mxfp8", is_training=train)
        s.add(**e4m3, scaling_mode="current", window_size=[255, 0], is_training=train)
        s.add(**e4m3, scaling_mode="current", qkv_layout="thd_thd_thd", mask="padding_causal", is_training=train)
    s.add(**e4m3, scaling_mode="current", head_dim_qk=48, head_dim_v=48, is_training=True)
    s.add(**e4m3, scaling_mode="current", head_dim_qk=80, head_dim_v=80, is_training=True)
    # output and gradient dtypes
    s.add(**e4m3, scaling_mode="current", o_dtype="fp8_e4m3", is_training=True)  # FP8 MHA (fp8 O)
    s.add(**e4m3, scaling_mode="current", o_dtype="bf16", do_dtype="bf16", dqkv_dtype="bf16", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", o_dtype="bf16", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", dqkv_dtype="bf16", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", o_dtype="fp16", is_training=False)
    s.add(**e4m3, scaling_mode="delayed", do_dtype="fp8_e4m3", is_training=True)
    # layouts, seqlens, features
    s.add(**e4m3, scaling_mode="delayed", qkv_layout="sbhd_sbhd_sbhd", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", qkv_layout="bs3hd", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", seqlen_q=256, seqlen_kv=1024, mask="causal_bottom_right", is_training=False)
    s.add(**e4m3, scaling_mode="delayed", seqlen_q=2048, seqlen_kv=2048, num_heads_kv=4, is_training=True)
    s.add(**e4m3, scaling_mode="current", dropout=0.1, is_training=True)
    s.add(**e4m3, scaling_mode="current", return_max_logit=True, is_training=True)
    s.add(**e4m3, scaling_mode="current", softmax="off_by_one", is_training=True)
    s.add(**e4m3, scaling_mode="delayed", **PAGED_DECODE, num_heads_kv=4)


def deterministic(s: Suite) -> None:
    """Deterministic backward."""
    for dtype in ("bf16", "fp16"):
        for d in (64, 128, 256):
            for mask in ("causal", "no_mask"):
                s.add(qkv_dtype=dtype, head_dim_qk=d, head_dim_v=d, mask=mask, deterministic=True)
    s.add(deterministic=True, num_heads_kv=4)
    s.add(deterministic=True, dropout=0.1)
    s.add(deterministic=True, bias="post_scale_bias", bias_shape="1hss", mask="no_mask")
    s.add(deterministic=True, window_size=[255, 0])
    s.add(deterministic=True, qkv_layout="thd_thd_thd", mask="padding_causal")
    s.add(deterministic=True, head_dim_qk=192, head_dim_v=128)
    s.add(deterministic=True, seqlen_q=2048, seqlen_kv=2048)


def dropout(s: Suite) -> None:
    """Dropout."""
    for p in (0.1, 0.2):
        for d in (64, 128):
            for mask in ("causal", "no_mask", "padding"):
                s.add(dropout=p, head_dim_qk=d, head_dim_v=d, mask=mask, is_training=True)
    s.add(dropout=0.1, qkv_dtype="fp16", head_dim_qk=64, head_dim_v=64, num_heads_q=12, num_heads_kv=12, mask="padding")
    s.add(dropout=0.1, qkv_layout="thd_thd_thd", mask="padding", head_dim_qk=64, head_dim_v=64)
    s.add(dropout=0.1, qkv_layout="sbhd_sbhd_sbhd")
    s.add(dropout=0.1, num_heads_kv=4)
    s.add(dropout=0.1, head_dim_qk=256, head_dim_v=256)
    s.add(dropout=0.1, window_size=[255, 0])
    s.add(dropout=0.1, is_training=False)


def bias(s: Suite) -> None:
    """Bias."""
    for shape in BIAS_SHAPES:
        for mask in ("no_mask", "causal"):
            for train in TRAIN_INFER:
                s.add(bias="post_scale_bias", bias_shape=shape, mask=mask, is_training=train)
        s.add(bias="post_scale_bias", bias_shape=shape, mask="padding", head_dim_qk=64, head_dim_v=64,
              qkv_dtype="fp16", is_training=True)
    s.add(bias="post_scale_bias", bias_shape="1hss", seqlen_q=128, seqlen_kv=1024, mask="causal_bottom_right")
    s.add(bias="post_scale_bias", bias_shape="bhss", num_heads_kv=4)
    for mask in ("no_mask", "causal"):
        for train in TRAIN_INFER:
            s.add(bias="pre_scale_bias", mask=mask, is_training=train)
    for mask in ("no_mask", "causal", "padding_causal"):
        for train in TRAIN_INFER:
            s.add(bias="alibi", mask=mask, is_training=train)
    s.add(bias="alibi", seqlen_q=128, seqlen_kv=1024, mask="causal_bottom_right", is_training=False)
    s.add(bias="alibi", num_heads_kv=4)
    s.add(bias="alibi", head_dim_qk=64, head_dim_v=64, qkv_dtype="fp16")


def softmax(s: Suite) -> None:
    """Softmax variants (attention sinks)."""
    for softmax in ("off_by_one", "learnable"):
        for train in TRAIN_INFER:
            s.add(softmax=softmax, is_training=train)
            s.add(softmax=softmax, mask="no_mask", is_training=train)
            s.add(softmax=softmax, window_size=[127, 0], num_heads_kv=4, is_training=train)
        s.add(softmax=softmax, mask="padding_causal", is_training=True)
        s.add(softmax=softmax, head_dim_qk=64, head_dim_v=64, num_heads_kv=2, is_training=True)
        s.add(softmax=softmax, qkv_layout="thd_thd_thd", mask="padding_causal", is_training=True)
        s.add(softmax=softmax, seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", num_heads_kv=4, is_training=False)
        s.add(softmax=softmax, qkv_dtype="fp16", is_training=True)


def max_logit(s: Suite) -> None:
    """Return_max_logit (QK-clip style training)."""
    for d in (64, 128):
        for mask in ("causal", "no_mask"):
            for train in TRAIN_INFER:
                s.add(return_max_logit=True, head_dim_qk=d, head_dim_v=d, mask=mask, is_training=train)
    s.add(return_max_logit=True, num_heads_kv=4)
    s.add(return_max_logit=True, window_size=[255, 0])
    s.add(return_max_logit=True, qkv_layout="thd_thd_thd", mask="padding_causal")
    s.add(return_max_logit=True, qkv_dtype="fp16")


def misc(s: Suite) -> None:
    """Misc: explicit softmax scale, CUDA graphs."""
    for train in TRAIN_INFER:
        s.add(attn_scale=0.125, head_dim_qk=192, head_dim_v=128, is_training=train)
        s.add(attn_scale=1.0, is_training=train)
        s.add(cuda_graph=True, is_training=train)
    s.add(attn_scale=0.0625, head_dim_qk=256, head_dim_v=256, num_heads_kv=8, window_size=[1023, 0])
    s.add(cuda_graph=True, seqlen_q=1, seqlen_kv=2048, mask="causal_bottom_right", num_heads_kv=4, is_training=False)


FAMILIES = (head_dims, gqa, masks, seqlens, windows, layouts, fp8, deterministic, dropout, bias, softmax,
            max_logit, misc)


def build() -> Suite:
    """Every family's problems, each tagged with the family (its section) that added it."""
    s = Suite()
    for family in FAMILIES:
        s.section = family.__name__
        family(s)
    return s
