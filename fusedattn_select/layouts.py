"""QKV layouts: the TransformerEngine layout names, what each means in memory, and their strides."""

from __future__ import annotations

from dataclasses import dataclass

from fusedattn_select.errors import ConfigError

FORMATS = ("bshd", "sbhd", "bhsd", "thd")

# Separate Q, K, V tensors in BSHD, SBHD or BHSD memory: the layouts attention() runs.
SEPARATE_LAYOUTS = frozenset({
    "bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd", "sbhd_bshd_bshd", "bshd_sbhd_sbhd",
})


@dataclass(frozen=True)
class Layout:
    """What a TransformerEngine QKV layout name means physically.

    `packing` is how tensors share one allocation: "3hd"/"h3d" (Q, K, V interleaved), "2hd"/"h2d"
    (K and V interleaved), or None (separate tensors).
    """

    name: str
    q_format: str
    kv_format: str
    packing: str | None = None
    paged: bool = False

    @property
    def ragged(self) -> bool:
        return "thd" in (self.q_format, self.kv_format)


_STEMS = {"bshd": "bs", "sbhd": "sb", "thd": "t"}  # a format's dims before h, in packed names


def _layouts() -> dict[str, Layout]:
    table = [Layout(f"{fmt}_{fmt}_{fmt}", fmt, fmt) for fmt in FORMATS]
    for packing in ("3hd", "h3d"):  # q, k and v in one tensor
        table += [Layout(f"{stem}{packing}", fmt, fmt, packing) for fmt, stem in _STEMS.items()]
    for packing in ("2hd", "h2d"):  # k and v in one tensor
        table += [Layout(f"{fmt}_{stem}{packing}", fmt, fmt, packing) for fmt, stem in _STEMS.items()]
    mixed = (("sbhd", "bshd"), ("bshd", "sbhd"), ("thd", "bshd"), ("thd", "sbhd"))  # q's format, k and v's
    table += [Layout(f"{q}_{kv}_{kv}", q, kv) for q, kv in mixed]
    table += [Layout(f"paged_kv_{q}_{kv}_{kv}", q, kv, paged=True) for q in _STEMS for kv in ("bshd", "sbhd")]
    return {layout.name: layout for layout in table}


LAYOUTS: dict[str, Layout] = _layouts()


_PACKED = {None: 1, "3hd": 3, "h3d": 3, "2hd": 2, "h2d": 2}


def format_strides(fmt: str, batch: int, heads: int, seqlen: int, head_dim: int,
                   packing: str | None = None) -> tuple[int, int, int, int]:
    """Strides of the logical (batch, heads, seqlen, head_dim) view of a tensor stored as `fmt`.

    `packing` interleaves n tensors in one allocation: "3hd"/"2hd" put the n tensors between the
    sequence and head axes ([.., n, H, D]); "h3d"/"h2d" between the head and head-dim axes
    ([.., H, n, D]). THD is stored like BSHD (ragged offsets locate each sequence).
    """
    n = _PACKED[packing]
    head = n * head_dim if packing in ("h3d", "h2d") else head_dim
    token = heads * n * head_dim
    if fmt in ("bshd", "thd"):
        return (seqlen * token, head, token, 1)
    if fmt == "sbhd":
        return (token, head, batch * token, 1)
    if fmt == "bhsd":
        if packing is not None:
            raise ConfigError("qkv_layout", f"bhsd+{packing}", "BHSD has no interleaved layouts")
        return (heads * seqlen * head_dim, seqlen * head_dim, head_dim, 1)
    raise ConfigError("format", fmt, "must be one of 'bshd', 'sbhd', 'bhsd', 'thd'")


def dense_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a tensor of `shape` packed densely in the dim order `strides` give (outermost
    first: the largest stride; a tie keeps the dims' own order): the same layout (BSHD, BHSD, a
    transposed view...) with no gaps, e.g. the compact form of a slice of a longer cache."""
    order = sorted(range(len(shape)), key=lambda dim: (-strides[dim], dim))
    dense = [0] * len(shape)
    step = 1
    for dim in reversed(order):
        dense[dim] = step
        step *= max(shape[dim], 1)
    return tuple(dense)
