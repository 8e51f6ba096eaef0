"""Shape buckets: the one plan form that serves every batch size and sequence length of a problem.

A bucket plan is the ragged (THD) graph of the problem with a padding mask, built at the bucket's
batch size and sequence lengths. It runs any smaller shape held in contiguous BSHD memory (other
layouts are copied into it first): each
sequence is found through a ragged offset (i * s * h * d) and its length through seq_len, and the
unused batch slots get length 0. Measured on an H100 (cuDNN 9.19): exact to bf16 rounding forward
and backward, 1.04-1.5x the GPU time of the exact dense plan, and no build for a new shape.

The ladder: batch sizes and sequence lengths round up to the next power of two, sequence lengths
to at least MIN_SEQLEN; a query length of 1 (a decode step) is its own bucket. Powers of two keep
the plans per problem class at about log2(max batch) x log2(max length) while a shape pays at most
twice its size in the bucket's unused slots (which the kernels skip).
"""

from __future__ import annotations

from dataclasses import dataclass

from fusedattn_select.config import INT32_MAX, AttnConfig
from fusedattn_select.layouts import SEPARATE_LAYOUTS

MIN_SEQLEN = 64
# The largest size whose bucket (the next power of two) stays within INT32_MAX.
_LARGEST_HELD = 2**30
# Bucket plans address the caller's tensors by int32 ragged element offsets (runtime/ragged.py).
RAGGED_OFFSET_LIMIT = 2**31

# The padding form of each mask: the mask the ragged graph runs, with the caller's lengths.
PADDED_MASKS = {
    "no_mask": "padding",
    "padding": "padding",
    "causal": "padding_causal",
    "padding_causal": "padding_causal",
    "causal_bottom_right": "padding_causal_bottom_right",
    "padding_causal_bottom_right": "padding_causal_bottom_right",
}
_RAGGED_LAYOUT = "thd_thd_thd"


def next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def bucket_batch(batch: int) -> int:
    """The batch size of the bucket holding `batch`."""
    return next_power_of_two(batch)


def bucket_seqlen(seqlen: int) -> int:
    """The sequence length of the bucket holding `seqlen` (1 stays 1: a decode step)."""
    return 1 if seqlen == 1 else max(MIN_SEQLEN, next_power_of_two(seqlen))


@dataclass(frozen=True)
class Bucket:
    """Bucket dimensions: batch size and query / key-value lengths."""

    batch: int
    seqlen_q: int
    seqlen_kv: int

    @classmethod
    def of(cls, batch: int, seqlen_q: int, seqlen_kv: int) -> "Bucket":
        return cls(bucket_batch(batch), bucket_seqlen(seqlen_q), bucket_seqlen(seqlen_kv))

    def holds(self, batch: int, seqlen_q: int, seqlen_kv: int) -> bool:
        return batch <= self.batch and seqlen_q <= self.seqlen_q and seqlen_kv <= self.seqlen_kv

    def describe(self) -> str:
        return f"B={self.batch} S_q={self.seqlen_q} S_kv={self.seqlen_kv}"


def why_not_bucketed(cfg: AttnConfig) -> str:
    """Why `cfg` has no bucket form ("" when it has one)."""
    if cfg.qkv_layout not in SEPARATE_LAYOUTS:
        return f"qkv_layout={cfg.qkv_layout!r} is not one of separate Q, K, V tensors"
    if cfg.bias not in ("no_bias", "alibi"):
        return f"bias={cfg.bias!r} has per-position values that ragged offsets do not address"
    if cfg.is_fp8:
        return "FP8 problems run dense plans"
    if cfg.cuda_graph:
        return "cuda_graph=True problems run the plan of their captured shape"
    if max(cfg.batch_size, cfg.seqlen_q, cfg.seqlen_kv) > _LARGEST_HELD:  # its bucket would pass INT32_MAX
        bucket = Bucket.of(cfg.batch_size, cfg.seqlen_q, cfg.seqlen_kv)
        return f"its bucket ({bucket.describe()}) passes the int32 bound a problem's sizes keep to ({INT32_MAX})"
    largest = largest_tensor(cfg)
    if largest >= RAGGED_OFFSET_LIMIT:  # a GPU runs it on its own graphs (runtime/entries.py)
        return f"a tensor of {largest} elements is past the bucket plans' int32 ragged offsets (2**31)"
    return ""


def largest_tensor(cfg: AttnConfig) -> int:
    """The element count of the largest of `cfg`'s Q, K, V and O."""
    dim = max(cfg.head_dim_qk, cfg.resolved_head_dim_v)
    return cfg.batch_size * dim * max(cfg.seqlen_q * cfg.num_heads_q, cfg.seqlen_kv * cfg.num_heads_kv)


def bucket_form(cfg: AttnConfig, bucket: Bucket | None = None) -> AttnConfig | None:
    """The ragged padding-mask problem whose plan runs `cfg` (at `bucket`, default cfg's own bucket),
    or None when `cfg` has no bucket form (see why_not_bucketed)."""
    if why_not_bucketed(cfg):
        return None
    bucket = bucket or Bucket.of(cfg.batch_size, cfg.seqlen_q, cfg.seqlen_kv)
    if max(bucket.batch, bucket.seqlen_q, bucket.seqlen_kv) > INT32_MAX:  # a larger bucket asked for
        return None
    backward = {"do_format": "thd", "dqkv_layout": _RAGGED_LAYOUT} if cfg.is_training else {}
    return cfg.replace(
        batch_size=bucket.batch, seqlen_q=bucket.seqlen_q, seqlen_kv=bucket.seqlen_kv,
        qkv_layout=_RAGGED_LAYOUT, o_format="thd", mask=PADDED_MASKS[cfg.mask],
        bottom_right_diagonal=cfg.resolved_bottom_right_diagonal, **backward,
    )


def heads_as_batch(cfg: AttnConfig) -> AttnConfig | None:
    """The problem a decode step (one query row) with keys and values in BHSD memory runs as, or None.

    Each (sequence, KV head) pair becomes a sequence of its own with one head, whose rows are the
    KV head's group of query heads: a head of a BHSD tensor is contiguous memory, so bucket plans
    address the caller's keys and values without copying them into BSHD. The query row sees every
    key (no mask, or a bottom-right causal mask with no window), so the group's rows see the same.
    """
    if cfg.seqlen_q != 1 or cfg.is_training:  # first: select() asks this of every problem it answers
        return None
    if cfg.mask == "no_mask":
        windows = {(-1, -1)}
    elif cfg.mask in ("causal", "causal_bottom_right") and cfg.resolved_bottom_right_diagonal:
        windows = {(-1, -1), (-1, 0)}  # the row is the last query: it sees every key
    else:
        return None
    # why_not_bucketed refuses FP8 and cuda_graph=True problems.
    if (tuple(cfg.window_size) not in windows or cfg.qkv_layout != "bhsd_bhsd_bhsd" or cfg.bias != "no_bias"
            or cfg.softmax != "vanilla" or cfg.dropout or cfg.return_max_logit or cfg.page_size is not None
            or why_not_bucketed(cfg)):
        return None
    if cfg.batch_size * cfg.num_heads_kv > _LARGEST_HELD:  # its batch (or that batch's bucket) passes INT32_MAX
        return None
    return cfg.replace(batch_size=cfg.batch_size * cfg.num_heads_kv, num_heads_q=1, num_heads_kv=1,
                       seqlen_q=cfg.num_heads_q // cfg.num_heads_kv, qkv_layout="bshd_bshd_bshd", o_format=None,
                       mask="no_mask", window_size=(-1, -1), bottom_right_diagonal=None)


def larger_buckets(bucket: Bucket, batch_doublings: int = 3, length_doublings: int = 6) -> list[Bucket]:
    """Buckets above `bucket` on the ladder, smallest first: up to `batch_doublings` larger batch
    sizes times `length_doublings` longer lengths (both lengths for self-attention, where they are
    equal; the key/value length otherwise, as decode steps grow it)."""
    found = []
    for i in range(batch_doublings + 1):
        for j in range(length_doublings + 1):
            if i == j == 0:
                continue
            seqlen_q = bucket.seqlen_q << j if bucket.seqlen_q == bucket.seqlen_kv else bucket.seqlen_q
            found.append(Bucket(bucket.batch << i, seqlen_q, bucket.seqlen_kv << j))
    return sorted(found, key=lambda b: (b.batch * b.seqlen_q * b.seqlen_kv, b.batch))


# How far a recorded ladder reaches by default (snapshot record): batch sizes up to 64 and lengths up
# to 16384, extended to a recorded problem's own bucket where it is larger.
LADDER_MAX_BATCH = 64
LADDER_MAX_SEQLEN = 16384
# The farthest a ladder reaches: its rungs are powers of two, and a bucket past INT32_MAX has no bucket form.
LADDER_REACH_LIMIT = _LARGEST_HELD


def powers_of_two(low: int, high: int) -> list[int]:
    """The powers of two from `low` to `high`, both included (`low` a power of two)."""
    rungs = []
    while low <= high:
        rungs.append(low)
        low <<= 1
    return rungs


def ladder(cfg: AttnConfig, max_batch: int = LADDER_MAX_BATCH, max_seqlen: int = LADDER_MAX_SEQLEN) -> list[Bucket]:
    """The buckets of `cfg`'s problem class and shape kind, smallest first: every batch bucket up to
    `max_batch` times every length bucket up to `max_seqlen` (each extended to cfg's own bucket).

    The lengths follow `cfg`'s kind, as `larger_buckets` does: self-attention (equal lengths) walks
    both lengths together; otherwise the query length stays at cfg's bucket (1 for a decode step) and
    the key/value length walks. Every shape of that kind up to the maxima lands in one of them
    (`Bucket.of`); [] when `cfg` has no bucket form."""
    for field, value in (("max_batch", max_batch), ("max_seqlen", max_seqlen)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}={value!r}: must be a positive integer")
    if why_not_bucketed(cfg):
        return []
    own = Bucket.of(cfg.batch_size, cfg.seqlen_q, cfg.seqlen_kv)
    batches = powers_of_two(1, max(own.batch, bucket_batch(max_batch)))
    lengths = powers_of_two(MIN_SEQLEN, max(own.seqlen_kv, bucket_seqlen(max_seqlen)))
    if own.seqlen_kv == 1:  # one key: a length of its own, outside the ladder's rungs
        lengths = [1]
    self_attention = cfg.seqlen_q == cfg.seqlen_kv
    return [Bucket(b, s if self_attention else own.seqlen_q, s) for b in batches for s in lengths]
