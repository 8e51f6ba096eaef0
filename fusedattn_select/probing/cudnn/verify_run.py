"""Running one problem's cuDNN graphs on seeded data for depth `verify`, bound as dispatch binds them
(an FP8 backward's gradient scales excepted: sized as delayed scaling sizes them, _gradient_bounds).

Every graph tensor is allocated with the dims, strides and dtype the graph declared (as
runtime/plans.Plan allocates and conforms tensors); outputs that dispatch allocates zeroed under a
padding mask (o, dQ, dK, dV) are zeroed, every other output is filled with NaN so a value the graph
should have written and did not shows as a mismatch. Ragged (THD) tensors are bound as
runtime/ragged.py binds a bucket plan: sequence i of contiguous BSHD memory starts at element
i * s * token_stride, the last batch slot is unused (offset at the end, length 0). A paged KV
cache's containers are filled like any input and each sequence's pages are a seeded shuffle of them
(K's and V's apart), so the check reads through the page tables as a decode kernel would.

Imported only when depth verify runs (it imports torch).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fusedattn_select import dtypes
from fusedattn_select.config import AttnConfig
from fusedattn_select.layouts import LAYOUTS
from fusedattn_select.probing.cudnn.description import OUTPUT_NAMES
from fusedattn_select.probing.cudnn.graphs import GraphBuild
from fusedattn_select.reference.chunked_reference import RefProblem
from fusedattn_select.reference.semantics import alibi_slopes
from fusedattn_select.types import Phase

# Outputs dispatch allocates zeroed under a padding mask (runtime/plans.ZEROED_WITH_PADDING).
ZEROED_WITH_PADDING = frozenset({"o", "dQ", "dK", "dV"})
# Tensors whose sequence axis is the query's; every other sequence tensor is on the key/value axis.
QUERY_AXIS = frozenset({"q", "o", "dO", "dQ"})
_OFFSET_PREFIX = "ragged_offset_"
_OFFSET_AXIS_TENSOR = {"q": "q", "kv": "k", "o": "o"}
# Inputs made from seeded random normals (the sink only where it is learned).
_RANDOM_INPUTS = frozenset({"q", "k", "v", "dO", "bias"})
DROPOUT_SEED, DROPOUT_OFFSET = 1234, 0
# Page tables and the container each indexes.
_PAGE_TABLES = {"page_table_k": "k", "page_table_v": "v"}
# The scale tensors of an FP8 forward graph and of its backward graph (per-tensor scaling).
_FP8_SCALARS = frozenset({"descale_q", "descale_k", "descale_v", "scale_s", "descale_s", "scale_o"})
_FP8_BACKWARD_SCALARS = frozenset({"descale_o", "descale_dO", "scale_dP", "descale_dP", "scale_dQ", "scale_dK",
                                   "scale_dV"})


class Unbindable(Exception):
    """The graph has a tensor verify has no data for: its numerics are not checked."""


@dataclass(frozen=True)
class Extent:
    """The batch and sequence extents the check runs inside the graph's (B, S_q, S_kv).

    Ragged graphs run like a bucket plan: `batch` used slots of `seqlen_q` x `seqlen_kv` memory.
    lens_q / lens_kv: each used sequence's length (padding masks), else the full extents.
    """

    batch: int
    seqlen_q: int
    seqlen_kv: int
    lens_q: tuple[int, ...]
    lens_kv: tuple[int, ...]
    ragged: bool


def ragged_tensors(cfg: AttnConfig) -> frozenset[str]:
    """The graph tensors stored as THD (located by ragged offsets) for `cfg`."""
    layout, grads = cfg.layout, LAYOUTS[cfg.resolved_dqkv_layout]
    formats = {"q": layout.q_format, "k": layout.kv_format, "v": layout.kv_format,
               "o": cfg.resolved_o_format, "dO": cfg.resolved_do_format,
               "dQ": grads.q_format, "dK": grads.kv_format, "dV": grads.kv_format}
    return frozenset(name for name, fmt in formats.items() if fmt == "thd")


def extent_for(cfg: AttnConfig, seed: int) -> Extent:
    """The extents and lengths a check of `cfg` runs (deterministic for a seed).

    With padding the first sequence has the full length and the others a seeded length between half
    and all of it; a ragged graph also leaves its last batch slot unused and runs sequences of 3/4
    of the graph's lengths, as a bucket plan runs a shorter call.
    """
    ragged = bool(ragged_tensors(cfg))
    batch = cfg.batch_size - 1 if ragged and cfg.batch_size > 1 else cfg.batch_size
    sq = cfg.seqlen_q - cfg.seqlen_q // 4 if ragged else cfg.seqlen_q
    skv = cfg.seqlen_kv - cfg.seqlen_kv // 4 if ragged else cfg.seqlen_kv
    if not cfg.has_padding:
        return Extent(batch, sq, skv, (sq,) * batch, (skv,) * batch, ragged)
    rng = random.Random(seed)

    def lengths(full: int) -> tuple[int, ...]:
        return (full,) + tuple(rng.randint(max(1, full // 2), full) for _ in range(batch - 1))

    return Extent(batch, sq, skv, lengths(sq), lengths(skv), ragged)


def _torch_dtype(data_type: Any) -> torch.dtype:
    return dtypes.torch_dtype(dtypes.from_cudnn(data_type), torch)


def _span(dims: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements a (dims, strides) tensor reaches from its first."""
    if any(d == 0 for d in dims):
        return 0
    return 1 + sum((d - 1) * abs(s) for d, s in zip(dims, strides))


@dataclass
class Bound:
    """The tensors of one problem's check: graph tensors by name, the extent and the reference inputs."""

    cfg: AttnConfig
    device: torch.device
    extent: Extent
    generator: torch.Generator
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    ragged: frozenset[str] = frozenset()
    seed: int = 0
    scales: dict[str, float] = field(default_factory=dict)  # FP8 tensors: value = scale x real value
    gradient_bounds: dict[str, float] = field(default_factory=dict)  # an FP8 backward's (_gradient_bounds)
    # The reference gradients' largest real magnitudes (dQ, dK, dV), set before an FP8 backward runs.
    gradient_amax: dict[str, float] = field(default_factory=dict)

    def allocate(self, build: GraphBuild, name: str, fill: str) -> torch.Tensor:
        """`name` as `build` declared it, filled with "randn", "nan" or "zero"."""
        dims, strides = build.dims_strides[name]
        dtype = _torch_dtype(build.data_types[name])
        span = _span(dims, strides)
        if fill == "randn":
            flat = torch.randn(span, generator=self.generator, device=self.device, dtype=torch.float32).to(dtype)
        elif fill == "nan" and dtype.is_floating_point:
            flat = torch.full((span,), float("nan"), device=self.device, dtype=dtype)
        else:
            flat = torch.zeros(span, device=self.device, dtype=dtype)
        return flat.as_strided(dims, strides)

    def view(self, name: str) -> torch.Tensor:
        """Graph tensor `name` (q, k, v, o, dO, dQ, dK, dV) as the (batch, heads, seqlen, dim) the check covers."""
        tensor = self.tensors[name]
        e = self.extent
        seqlen = e.seqlen_q if name in QUERY_AXIS else e.seqlen_kv
        if name in self.ragged:
            _, head, token, element = tensor.stride()
            return tensor.as_strided((e.batch, tensor.shape[1], seqlen, tensor.shape[3]),
                                     (seqlen * token, head, token, element))
        if name in ("k", "v") and self.cfg.layout.paged:
            tensor = self._through_pages(name)
        return tensor[:e.batch, :, :seqlen]

    def dequantized(self, name: str) -> torch.Tensor:
        """`view(name)`, in float32 real values where the tensor is FP8 (divided by its scale)."""
        scale = self.scales.get(name)
        return self.view(name) if scale is None else self.view(name).float() / scale

    def _through_pages(self, name: str) -> torch.Tensor:
        """Paged container `name` (pages, H, page_size, D) read through its page table as (B, H, S, D)."""
        pages = self.tensors[name]
        table = self.tensors[f"page_table_{name}"][:, 0, :, 0].long()  # (B, pages per sequence)
        slots, blocks = table.shape
        heads, size, dim = pages.shape[1:]
        return pages[table].permute(0, 2, 1, 3, 4).reshape(slots, heads, blocks * size, dim)

    def lengths(self, axis: str) -> torch.Tensor:
        values = self.extent.lens_q if axis == "q" else self.extent.lens_kv
        return torch.tensor(values, dtype=torch.long, device=self.device)


def _offsets(bound: Bound, build: GraphBuild, name: str) -> torch.Tensor:
    """A ragged offset tensor: each used sequence i at i * s * token_stride, unused slots at the end."""
    suffix = name[len(_OFFSET_PREFIX):]
    tensor = _OFFSET_AXIS_TENSOR.get(suffix, suffix)
    token = build.dims_strides[tensor][1][2]
    seqlen = bound.extent.seqlen_q if tensor in QUERY_AXIS else bound.extent.seqlen_kv
    slots, used = build.dims_strides[name][0][0], bound.extent.batch
    values = [i * seqlen * token for i in range(used)] + [used * seqlen * token] * (slots - used)
    return torch.tensor(values, dtype=torch.int32, device=bound.device).view(slots, 1, 1, 1)


def _lengths_tensor(bound: Bound, build: GraphBuild, name: str) -> torch.Tensor:
    slots = build.dims_strides[name][0][0]
    values = bound.extent.lens_q if name == "seq_len_q" else bound.extent.lens_kv
    values = list(values) + [0] * (slots - len(values))
    return torch.tensor(values, dtype=torch.int32, device=bound.device).view(slots, 1, 1, 1)


def _page_table(bound: Bound, build: GraphBuild, name: str) -> torch.Tensor:
    """Page table `name` (B, 1, pages per sequence, 1): sequence b's blocks are pages of a seeded
    shuffle of its container's, no page shared."""
    slots, _, blocks, _ = build.dims_strides[name][0]
    pages = build.dims_strides[_PAGE_TABLES[name]][0][0]
    if pages < slots * blocks:
        raise Unbindable(f"{pages} pages cannot give {slots} sequences {blocks} pages each without sharing")
    order = list(range(pages))
    random.Random(f"{bound.seed}:{name}").shuffle(order)
    return torch.tensor(order[:slots * blocks], dtype=torch.int32, device=bound.device).view(slots, 1, blocks, 1)


def _quantized(bound: Bound, build: GraphBuild, name: str) -> torch.Tensor:
    """FP8 input `name` quantized from seeded normals as dispatch quantizes (current scaling): times
    the power of two that brings its largest magnitude nearest below the type's largest value."""
    dims, strides = build.dims_strides[name]
    dtype = dtypes.from_cudnn(build.data_types[name])
    flat = torch.randn(_span(dims, strides), generator=bound.generator, device=bound.device, dtype=torch.float32)
    scale = dtypes.fp8_scale(float(flat.abs().max()), dtype)
    bound.scales[name] = scale
    return (flat * scale).to(dtypes.torch_dtype(dtype, torch)).as_strided(dims, strides)


def _gradient_bounds(bound: Bound) -> dict[str, float]:
    """The magnitudes an FP8 backward's scales are sized for (worked out once per check): dS's ("dP")
    from dtypes.fp8_gradient_bounds of the backward's real inputs, whole tensors as dispatch reads
    them; each gradient's from its real largest magnitude (the reference's), as delayed scaling sizes
    it once its amax history holds the step (with a power of two of headroom), or its bound where the
    reference gave none."""
    if not bound.gradient_bounds:
        found = _bounds_of(bound)
        # One power of two of headroom (TransformerEngine's `margin` of 1): the kernel's gradient may
        # exceed the reference's largest by its rounding, and past the type's top it saturates.
        found.update({n: 2.0 * a for n, a in bound.gradient_amax.items() if 0.0 < a < float("inf")})
        bound.gradient_bounds = found
    return bound.gradient_bounds


def _bounds_of(bound: Bound) -> dict[str, float]:
    cfg = bound.cfg

    def real(name: str) -> torch.Tensor:
        tensor = bound.tensors[name].float()
        return tensor / bound.scales[name] if name in bound.scales else tensor

    def row_norm(name: str) -> float:
        return float(torch.linalg.vector_norm(real(name), dim=-1).max())

    return dtypes.fp8_gradient_bounds(
        float(cfg.resolved_attn_scale), 1.0 / (1.0 - cfg.dropout), cfg.seqlen_q * (cfg.num_heads_q // cfg.num_heads_kv),
        float(real("q").abs().max()), float(real("k").abs().max()), float(real("dO").abs().max()),
        row_norm("dO"), row_norm("v"))


def _fp8_backward_scalar(bound: Bound, build: GraphBuild, name: str) -> float:
    """A backward graph's scale: O's and dO's descales (1 where they are not FP8), dS's scale sized
    from its bound for e4m3 at dtypes.FP8_INTERNAL_RANGE (as runtime/fp8.backward_feeds binds it), and
    each FP8 gradient's scale sized from its real largest magnitude (1 where it is not FP8)."""
    if name in ("scale_dP", "descale_dP"):
        _input(bound, build, "dO")
        scale = dtypes.fp8_scale(_gradient_bounds(bound)["dP"], "fp8_e4m3", dtypes.FP8_INTERNAL_RANGE)
        return scale if name == "scale_dP" else 1.0 / scale
    if name.startswith("scale_"):
        gradient = name[len("scale_"):]
        grad_type = dtypes.from_cudnn(build.data_types[gradient])
        if not dtypes.BY_NAME[grad_type].is_fp8:
            return 1.0
        _input(bound, build, "dO")
        scale = bound.scales[gradient] = dtypes.fp8_scale(_gradient_bounds(bound)[gradient], grad_type)
        return scale
    scaled = name[len("descale_"):]
    _input(bound, build, scaled)  # O: the forward's output, already bound
    return 1.0 / bound.scales[scaled] if scaled in bound.scales else 1.0


def _fp8_scalar(bound: Bound, build: GraphBuild, name: str) -> torch.Tensor:
    """An FP8 graph's scale tensor: as dispatch binds it (runtime/fp8.py) the inputs' descales, P's
    fixed scale, and O's scale where O is FP8: sized for O's type from V's largest real value (O is a
    convex combination of V's rows; V's own scale when they share a type), else 1; the backward's
    (_fp8_backward_scalar, whose gradient scales are verify's own)."""
    if name in _FP8_BACKWARD_SCALARS:
        value = _fp8_backward_scalar(bound, build, name)
    elif name == "scale_s":
        value = dtypes.FP8_SOFTMAX_SCALE
    elif name == "descale_s":
        value = 1.0 / dtypes.FP8_SOFTMAX_SCALE
    elif name == "scale_o":
        value = 1.0
        o_type = dtypes.from_cudnn(build.data_types["o"])
        if dtypes.BY_NAME[o_type].is_fp8:
            v = _input(bound, build, "v")
            largest_v = float(v.float().abs().max()) / bound.scales["v"]
            # With dropout's headroom, as dispatch binds it (runtime/fp8.explicit_state).
            value = bound.scales["o"] = dtypes.fp8_scale(largest_v, o_type) * dtypes.dropout_headroom(bound.cfg.dropout)
    else:
        quantized = name[len("descale_"):]
        _input(bound, build, quantized)
        value = 1.0 / bound.scales[quantized]
    dims, _ = build.dims_strides[name]
    return torch.full(dims, value, dtype=_torch_dtype(build.data_types[name]), device=bound.device)


def _input(bound: Bound, build: GraphBuild, name: str) -> torch.Tensor:
    """The tensor bound to graph input `name`, made (and kept in `bound`) on first use."""
    if name in bound.tensors:
        return bound.tensors[name]
    cfg = bound.cfg
    if name in _RANDOM_INPUTS and dtypes.BY_NAME[dtypes.from_cudnn(build.data_types[name])].is_fp8:
        made = _quantized(bound, build, name)
    elif name in _RANDOM_INPUTS or (name == "sink_token" and cfg.softmax == "learnable"):
        made = bound.allocate(build, name, "randn")
    elif name == "sink_token":  # off_by_one: the extra logit is 0
        made = bound.allocate(build, name, "zero")
    elif name in ("seq_len_q", "seq_len_kv"):
        made = _lengths_tensor(bound, build, name)
    elif name.startswith(_OFFSET_PREFIX):
        made = _offsets(bound, build, name)
    elif name in _PAGE_TABLES:
        made = _page_table(bound, build, name)
    elif name in _FP8_SCALARS or name in _FP8_BACKWARD_SCALARS:
        made = _fp8_scalar(bound, build, name)
    elif name in ("seed", "offset"):
        value = DROPOUT_SEED if name == "seed" else DROPOUT_OFFSET
        made = torch.full((1, 1, 1, 1), value, dtype=torch.int64, device=bound.device)
    else:
        raise Unbindable(f"no verify binding for graph tensor {name!r}")
    bound.tensors[name] = made
    return made


def execute(bound: Bound, build: GraphBuild, phase: Phase, handle: Any,
            after_execute: Callable[[Phase, dict], None] | None = None) -> dict[str, torch.Tensor]:
    """Run `build` once on the current stream with `bound`'s tensors; its outputs by name (kept in `bound`).

    `after_execute(phase, outputs)` (tests only) may change the outputs before they are compared.
    """
    written = OUTPUT_NAMES[phase]
    outputs: dict[str, torch.Tensor] = {}
    pack = {}
    for name, graph_tensor in build.tensors.items():
        if name in written:
            zeroed = bound.cfg.has_padding and name in ZEROED_WITH_PADDING or name in ("dBias", "dSink_token")
            outputs[name] = bound.allocate(build, name, "zero" if zeroed else "nan")
            pack[graph_tensor] = outputs[name]
        else:
            pack[graph_tensor] = _input(bound, build, name)
    workspace = torch.empty(max(int(build.workspace_size), 1), dtype=torch.uint8, device=bound.device)
    build.graph.execute(pack, workspace, handle=handle)
    torch.cuda.synchronize(bound.device)
    if after_execute is not None:
        after_execute(phase, outputs)
    bound.tensors.update(outputs)
    return outputs


def reference_problem(bound: Bound, dropout_sample: bool = False) -> RefProblem:
    """The reference's view of `bound` (after the forward ran, so every input exists)."""
    cfg = bound.cfg
    left, right = cfg.window_size
    alibi = None
    if cfg.bias == "alibi":
        alibi = torch.tensor(alibi_slopes(cfg.num_heads_q), dtype=torch.float32, device=bound.device)
    bias = bound.tensors.get("bias")
    if bias is not None:
        bias = bias[:bound.extent.batch] if bias.shape[0] > 1 else bias
        bias = bias[..., :bound.extent.seqlen_q, :bound.extent.seqlen_kv]
    sink = bound.tensors["sink_token"].reshape(-1) if cfg.softmax == "learnable" else None
    return RefProblem(
        q=bound.dequantized("q"), k=bound.dequantized("k"), v=bound.dequantized("v"),
        lens_q=bound.lengths("q"), lens_kv=bound.lengths("kv"), scale=float(cfg.resolved_attn_scale),
        causal=cfg.is_causal, bottom_right=cfg.resolved_bottom_right_diagonal, left=left,
        right=right, bias=bias, alibi=alibi, softmax=cfg.softmax,
        sink=sink, dropout=cfg.dropout, dropout_seed=DROPOUT_SEED + 1 if dropout_sample else None,
    )


def bind_input(bound: Bound, build: GraphBuild, name: str) -> torch.Tensor:
    """Graph input `name` bound ahead of an execution (the reference reads it first)."""
    return _input(bound, build, name)


def new_bound(cfg: AttnConfig, device: torch.device, seed: int) -> Bound:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return Bound(cfg, device, extent_for(cfg, seed), generator, ragged=ragged_tensors(cfg), seed=seed)


def stats_rows(bound: Bound) -> torch.Tensor:
    """The forward's stats output as (batch, heads, seqlen_q) over the checked extent."""
    stats = bound.tensors["stats"]
    return stats[:bound.extent.batch, :, :bound.extent.seqlen_q, 0].float()
