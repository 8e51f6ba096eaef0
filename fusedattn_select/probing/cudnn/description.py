"""The description of one SDPA graph: its tensors (names, dims, strides, dtypes) and arguments.

Every AttnConfig field that changes the graph is taken as given: logical dims are (batch, heads,
seqlen, head_dim) and the physical layout is expressed only through strides computed from
qkv_layout, o_format, do_format and dqkv_layout. A config field the installed frontend has no
argument for raises CudnnUnsupported at stage "graph_api", naming the field and the frontend
version.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from fusedattn_select.config import AttnConfig
from fusedattn_select.dtypes import cudnn_dtype
from fusedattn_select.layouts import LAYOUTS, format_strides
from fusedattn_select.probing.cudnn.features import FrontendFeatures
from fusedattn_select.probing.cudnn.messages import CudnnUnsupported
from fusedattn_select.types import Phase

# Tensors a graph writes, per phase; every other named tensor is an input the caller or the plan
# provides. O and the softmax stats are outputs of the forward graph and inputs of the backward one.
OUTPUT_NAMES = {
    Phase.FORWARD: frozenset({"o", "stats", "max_logit", "amax_s", "amax_o"}),
    Phase.BACKWARD: frozenset({"dQ", "dK", "dV", "dBias", "dSink_token", "amax_dP", "amax_dQ", "amax_dK", "amax_dV"}),
}


# ----- layouts -------------------------------------------------------------------------------
def _q_packing(layout_name: str) -> str | None:
    packing = LAYOUTS[layout_name].packing
    return packing if packing in ("3hd", "h3d") else None


def _kv_packing(layout_name: str) -> str | None:
    return LAYOUTS[layout_name].packing


def _row_major(dims: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for extent in reversed(dims):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


_SCALAR = (1, 1, 1, 1)


# ----- the graph description -----------------------------------------------------------------
class Description:
    """Builds the tensors and SDPA arguments of one graph, keeping names, dims and strides."""

    def __init__(self, cudnn: Any, graph: Any, cfg: AttnConfig, features: FrontendFeatures, operation: str):
        self.cudnn = cudnn
        self.graph = graph
        self.cfg = cfg
        self.features = features
        self.operation = operation
        self.tensors: dict[str, Any] = {}
        self._offsets: dict[tuple[str, int], Any] = {}
        self._offset_names: set[str] = set()

    # -- errors naming the field the frontend cannot express --
    def unsupported(self, field_name: str, value: object, why: str) -> CudnnUnsupported:
        message = f"{field_name}={value!r}: {why} (cudnn-frontend {self.features.version})"
        return CudnnUnsupported("graph_api", message, message)

    def require(self, argument: str, field_name: str, value: object) -> None:
        if not self.features.accepts(self.operation, argument):
            raise self.unsupported(field_name, value, f"{self.operation}() has no '{argument}' argument")

    def dtype(self, name: str) -> Any:
        """The cudnn.data_type of a fusedattn_select.dtypes name."""
        return cudnn_dtype(name, self.cudnn)

    # -- tensors --
    def input(self, name: str, dims: tuple[int, ...], strides: tuple[int, ...] | None = None,
              dtype: Any = None, **extra: Any) -> Any:
        strides = _row_major(dims) if strides is None else strides
        tensor = self.graph.tensor(name=name, dim=list(dims), stride=list(strides),
                                   data_type=dtype if dtype is not None else self.dtype(self.cfg.qkv_dtype),
                                   **extra)
        self.tensors[name] = tensor
        return tensor

    def scalar(self, name: str, dtype: str = "fp32") -> Any:
        return self.input(name, _SCALAR, _SCALAR, self.dtype(dtype))

    def output(self, name: str, tensor: Any, dims: tuple[int, ...], strides: tuple[int, ...] | None,
               dtype: Any) -> Any:
        if tensor is None:
            raise CudnnUnsupported(
                "graph_api", f"{self.operation}() returned no '{name}' output",
                f"{self.operation}() returned no '{name}' output (cudnn-frontend {self.features.version})",
            )
        strides = _row_major(dims) if strides is None else strides
        tensor.set_output(True).set_dim(list(dims)).set_stride(list(strides)).set_data_type(dtype)
        if hasattr(tensor, "set_name"):
            tensor.set_name(name)
        self.tensors[name] = tensor
        return tensor

    def ragged(self, tensor: Any, name: str, axis: str, token_stride: int) -> None:
        """Attach element offsets of each sequence: one offset tensor per (axis, token stride)."""
        key = (axis, token_stride)
        offsets = self._offsets.get(key)
        if offsets is None:
            base = f"ragged_offset_{axis}"
            offset_name = base if base not in self._offset_names else f"ragged_offset_{name}"
            offsets = self.input(offset_name, (self.cfg.batch_size + 1, 1, 1, 1), _SCALAR, self.dtype("int32"))
            self._offsets[key] = offsets
            self._offset_names.add(base)
            self._offset_names.add(offset_name)
        tensor.set_ragged_offset(offsets)


def _qkv_dims(cfg: AttnConfig) -> dict[str, tuple[int, int, int, int]]:
    b, hq, hk = cfg.batch_size, cfg.num_heads_q, cfg.num_heads_kv
    sq, skv, dqk, dv = cfg.seqlen_q, cfg.seqlen_kv, cfg.head_dim_qk, cfg.resolved_head_dim_v
    return {
        "q": (b, hq, sq, dqk), "k": (b, hk, skv, dqk), "v": (b, hk, skv, dv), "o": (b, hq, sq, dv),
        "stats": (b, hq, sq, 1),
    }


def _qkv_strides(cfg: AttnConfig, layout_name: str) -> dict[str, tuple[int, int, int, int]]:
    """Strides of Q, K, V stored as `layout_name` (qkv_layout, or dqkv_layout for the gradients)."""
    layout = LAYOUTS[layout_name]
    d = _qkv_dims(cfg)
    q = d["q"]
    k, v = d["k"], d["v"]
    return {
        "q": format_strides(layout.q_format, cfg.batch_size, q[1], q[2], q[3], _q_packing(layout_name)),
        "k": format_strides(layout.kv_format, cfg.batch_size, k[1], k[2], k[3], _kv_packing(layout_name)),
        "v": format_strides(layout.kv_format, cfg.batch_size, v[1], v[2], v[3], _kv_packing(layout_name)),
    }


def _stats_strides(cfg: AttnConfig) -> tuple[int, int, int, int]:
    # (B, H, S_q, 1) float32 stored head-major, as TransformerEngine allocates the softmax stats.
    return (cfg.num_heads_q * cfg.seqlen_q, cfg.seqlen_q, 1, 1)


def _bias_dims(cfg: AttnConfig) -> tuple[int, int, int, int]:
    b, h, sq, skv = cfg.batch_size, cfg.num_heads_q, cfg.seqlen_q, cfg.seqlen_kv
    return {
        "1hss": (1, h, sq, skv), "b1ss": (b, 1, sq, skv), "bhss": (b, h, sq, skv), "11ss": (1, 1, sq, skv),
    }[cfg.bias_shape or "1hss"]


def _mask_arguments(desc: Description) -> dict[str, Any]:
    """Causal masks, sliding windows and the diagonal alignment, in TransformerEngine's semantics.

    TE's window_size (left, right), -1 = unbounded, attends key j from query i when
    i - left <= j' <= i + right, with j' aligned to the top-left or bottom-right diagonal. cuDNN's
    diagonal band counts its left bound including the diagonal, so left bound = left + 1 (TE's
    fused_attn_f16_arbitrary_seqlen.cu does the same); a causal mask is a right bound of 0.
    """
    cfg, cudnn = desc.cfg, desc.cudnn
    left, right = cfg.window_size
    left_bound = left + 1 if left != -1 else None
    right_bound = right if right != -1 else None
    if cfg.is_causal:
        right_bound = 0
    bottom_right = cfg.resolved_bottom_right_diagonal
    alignment = cudnn.diagonal_alignment.BOTTOM_RIGHT if bottom_right else cudnn.diagonal_alignment.TOP_LEFT
    op = desc.operation
    left_name = next((n for n in ("diagonal_band_left_bound", "left_bound") if desc.features.accepts(op, n)), None)
    right_name = next((n for n in ("diagonal_band_right_bound", "right_bound") if desc.features.accepts(op, n)), None)
    if left_name and right_name and desc.features.accepts(op, "diagonal_alignment"):
        args: dict[str, Any] = {"diagonal_alignment": alignment}
        if left_bound is not None:
            args[left_name] = left_bound
        if right_bound is not None:
            args[right_name] = right_bound
        return args
    # Older frontends: causal flags and a left-only sliding window, aligned top-left unless the
    # bottom-right causal flag is set.
    args = {}
    if right_bound not in (None, 0):
        raise desc.unsupported("window_size", cfg.window_size, f"{op}() has no diagonal band right bound")
    if right_bound == 0:
        flag = "use_causal_mask_bottom_right" if bottom_right else "use_causal_mask"
        desc.require(flag, "mask", cfg.mask)
        args[flag] = True
    elif bottom_right:
        raise desc.unsupported("bottom_right_diagonal", True, f"{op}() has no diagonal_alignment argument")
    if left_bound is not None:
        name = next((n for n in ("sliding_window_length", "sliding_window") if desc.features.accepts(op, n)), None)
        if name is None:
            raise desc.unsupported("window_size", cfg.window_size, f"{op}() has no sliding window argument")
        args[name] = left_bound
    return args


def _common_arguments(desc: Description, *, backward: bool) -> dict[str, Any]:
    """Arguments shared by every SDPA operation: scale, masks, padding, dropout, sink, bias."""
    cfg = desc.cfg
    args: dict[str, Any] = {"attn_scale": float(cfg.resolved_attn_scale)}
    args.update(_mask_arguments(desc))
    if cfg.has_padding:
        desc.require("use_padding_mask", "mask", cfg.mask)
        b = cfg.batch_size
        args["use_padding_mask"] = True
        args["seq_len_q"] = desc.input("seq_len_q", (b, 1, 1, 1), _SCALAR, desc.dtype("int32"))
        args["seq_len_kv"] = desc.input("seq_len_kv", (b, 1, 1, 1), _SCALAR, desc.dtype("int32"))
    if cfg.dropout > 0.0:
        desc.require("dropout", "dropout", cfg.dropout)
        seed = desc.scalar("seed", "int64")
        offset = desc.scalar("offset", "int64")
        args["dropout"] = (float(cfg.dropout), seed, offset)
    if cfg.bias == "pre_scale_bias":
        raise desc.unsupported("bias", cfg.bias, "cuDNN's SDPA adds the bias after scaling; a pre-scale bias cannot be expressed")
    if cfg.bias == "alibi":
        desc.require("use_alibi_mask", "bias", cfg.bias)
        args["use_alibi_mask"] = True
    if cfg.bias == "post_scale_bias":
        desc.require("bias", "bias", cfg.bias)
        dims = _bias_dims(cfg)
        # The bias is in the 16-bit input type (an FP8 graph's bias, where the FP8 operation has
        # one, is bf16: FP8 is an input encoding, not a bias type).
        bias_dtype = desc.dtype("bf16" if cfg.is_fp8 else cfg.qkv_dtype)
        args["bias"] = desc.input("bias", dims, _row_major(dims), bias_dtype)
        # TransformerEngine computes dBias only for a (1, h, s_q, s_kv) bias: cuDNN has no bias
        # gradient reduction over the batch (TE fused_attn_f16_arbitrary_seqlen.cu).
        if backward and cfg.bias_shape == "1hss":
            desc.require("dBias", "bias", cfg.bias)
            args["dBias"] = desc.input("dBias", dims, _row_major(dims), bias_dtype)
    if cfg.softmax != "vanilla":
        desc.require("sink_token", "softmax", cfg.softmax)
        # off_by_one is softmax with a sink logit fixed at 0 (TE binds a zero softmax offset);
        # learnable trains the per-head sink, so the backward also returns its gradient.
        h = cfg.num_heads_q
        args["sink_token"] = desc.input("sink_token", (1, h, 1, 1), (h, 1, 1, 1), desc.dtype("fp32"))
        if backward and cfg.softmax == "learnable":
            desc.require("dSink_token", "softmax", cfg.softmax)
            args["dSink_token"] = desc.input("dSink_token", (1, h, 1, 1), (h, 1, 1, 1), desc.dtype("fp32"))
    if backward:
        if cfg.deterministic or desc.features.accepts(desc.operation, "use_deterministic_algorithm"):
            desc.require("use_deterministic_algorithm", "deterministic", cfg.deterministic)
            args["use_deterministic_algorithm"] = bool(cfg.deterministic)
        if cfg.layout.ragged and desc.features.accepts(desc.operation, "max_total_seq_len_q"):
            # The packed token capacity: the backward sizes its workspace from it (TE passes it).
            args["max_total_seq_len_q"] = cfg.batch_size * cfg.seqlen_q
            args["max_total_seq_len_kv"] = cfg.batch_size * cfg.seqlen_kv
    return args


def _stats_argument(desc: Description) -> dict[str, Any]:
    cfg, op = desc.cfg, desc.operation
    if desc.features.accepts(op, "generate_stats"):
        return {"generate_stats": bool(cfg.is_training)}
    desc.require("is_inference", "is_training", cfg.is_training)
    return {"is_inference": not cfg.is_training}


def _forward_inputs(desc: Description) -> tuple[Any, Any, Any, dict[str, Any]]:
    """Q, K, V (or paged K/V containers) with strides from qkv_layout, ragged offsets, page tables."""
    cfg = desc.cfg
    dims, strides = _qkv_dims(cfg), _qkv_strides(cfg, cfg.qkv_layout)
    args: dict[str, Any] = {}
    q = desc.input("q", dims["q"], strides["q"])
    if cfg.q_format == "thd":
        desc.ragged(q, "q", "q", strides["q"][2])
    if cfg.layout.paged:
        desc.require("paged_attention_k_table", "qkv_layout", cfg.qkv_layout)
        pages, size, hk = cfg.num_pages, cfg.page_size, cfg.num_heads_kv
        per_seq = math.ceil(cfg.seqlen_kv / size)
        containers = {}
        for name, head_dim in (("k", cfg.head_dim_qk), ("v", cfg.resolved_head_dim_v)):
            # A page container is (num_pages, H, page_size, D) stored as the KV format:
            # BSHD -> [pages, page_size, H, D], SBHD -> [page_size, pages, H, D].
            container_strides = format_strides(cfg.kv_format, pages, hk, size, head_dim)
            containers[name] = desc.input(name, (pages, hk, size, head_dim), container_strides)
        table_dims = (cfg.batch_size, 1, per_seq, 1)
        args["paged_attention_k_table"] = desc.input("page_table_k", table_dims, _row_major(table_dims), desc.dtype("int32"))
        args["paged_attention_v_table"] = desc.input("page_table_v", table_dims, _row_major(table_dims), desc.dtype("int32"))
        args["paged_attention_max_seq_len_kv"] = cfg.seqlen_kv
        return q, containers["k"], containers["v"], args
    k = desc.input("k", dims["k"], strides["k"])
    v = desc.input("v", dims["v"], strides["v"])
    if cfg.kv_format == "thd":
        desc.ragged(k, "k", "kv", strides["k"][2])
        desc.ragged(v, "v", "kv", strides["v"][2])
    return q, k, v, args


def _o_strides(cfg: AttnConfig, fmt: str) -> tuple[int, int, int, int]:
    b, h, s, d = _qkv_dims(cfg)["o"]
    return format_strides(fmt, b, h, s, d)


def _forward_outputs(desc: Description, o: Any, stats: Any) -> None:
    cfg = desc.cfg
    dims = _qkv_dims(cfg)
    o_fmt = cfg.resolved_o_format
    o_strides = _o_strides(cfg, o_fmt)
    desc.output("o", o, dims["o"], o_strides, desc.dtype(cfg.resolved_o_dtype))
    if o_fmt == "thd":
        desc.ragged(o, "o", "o", o_strides[2])
    if cfg.is_training:
        desc.output("stats", stats, dims["stats"], _stats_strides(cfg), desc.dtype("fp32"))


def _max_logit_argument(desc: Description) -> dict[str, Any]:
    cfg = desc.cfg
    if not cfg.return_max_logit:
        return {}
    desc.require("score_max", "return_max_logit", True)
    # The row maxima of the scaled scores, (B, H, S_q, 1) float32; TE reduces them to the
    # per-head max logit (cudnn-frontend's set_logit_max / score_max).
    tensor = desc.graph.tensor(name="max_logit", dim=list(_qkv_dims(cfg)["stats"]),
                               stride=list(_stats_strides(cfg)), data_type=desc.dtype("fp32"))
    tensor.set_output(True)
    desc.tensors["max_logit"] = tensor
    return {"score_max": tensor}


def _fp8_scales(desc: Description, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: desc.scalar(name) for name in names}


def describe_forward(desc: Description) -> dict[str, Any]:
    q, k, v, args = _forward_inputs(desc)
    args.update(_stats_argument(desc))
    args.update(_common_arguments(desc, backward=False))
    args.update(_max_logit_argument(desc))
    op = desc.operation
    if op == "sdpa_fp8":
        args.update(_fp8_scales(desc, ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")))
    elif op == "sdpa_mxfp8":
        args.update(_mxfp8_forward_scales(desc))
    _check_arguments(desc, args)
    outputs = list(getattr(desc.graph, op)(q=q, k=k, v=v, **args))
    o, stats = outputs[0], outputs[1]
    _forward_outputs(desc, o, stats)
    if op == "sdpa_fp8":
        desc.output("amax_s", outputs[2], _SCALAR, _SCALAR, desc.dtype("fp32"))
        desc.output("amax_o", outputs[3], _SCALAR, _SCALAR, desc.dtype("fp32"))
    elif op == "sdpa_mxfp8":
        desc.output("amax_o", outputs[2], _SCALAR, _SCALAR, desc.dtype("fp32"))
    return args


def describe_backward(desc: Description) -> dict[str, Any]:
    cfg, op = desc.cfg, desc.operation
    if cfg.layout.paged:
        raise desc.unsupported("qkv_layout", cfg.qkv_layout, "paged KV caches have no backward graph")
    dims = _qkv_dims(cfg)
    q, k, v, args = _forward_inputs(desc)
    o_fmt, do_fmt = cfg.resolved_o_format, cfg.resolved_do_format
    o_strides, do_strides = _o_strides(cfg, o_fmt), _o_strides(cfg, do_fmt)
    o = None
    if op != "sdpa_mxfp8_backward":  # the MXFP8 backward reads O as o_f16 instead
        o = desc.input("o", dims["o"], o_strides, desc.dtype(cfg.resolved_o_dtype))
        if o_fmt == "thd":
            desc.ragged(o, "o", "o", o_strides[2])
    d_o = desc.input("dO", dims["o"], do_strides, desc.dtype(cfg.resolved_do_dtype))
    if do_fmt == "thd":
        desc.ragged(d_o, "dO", "o", do_strides[2])
    stats = desc.input("stats", dims["stats"], _stats_strides(cfg), desc.dtype("fp32"))
    args.update(_common_arguments(desc, backward=True))
    if op == "sdpa_fp8_backward":
        args.update(_fp8_scales(desc, (
            "descale_q", "descale_k", "descale_v", "descale_o", "descale_dO", "descale_s", "descale_dP",
            "scale_s", "scale_dQ", "scale_dK", "scale_dV", "scale_dP",
        )))
    if op == "sdpa_mxfp8_backward":
        args.update(_mxfp8_backward_inputs(desc, q, k, d_o))
        _check_arguments(desc, args)
        outputs = list(desc.graph.sdpa_mxfp8_backward(q=q, k=k, v=v, stats=stats, **args))
    else:
        _check_arguments(desc, args)
        outputs = list(getattr(desc.graph, op)(q=q, k=k, v=v, o=o, dO=d_o, stats=stats, **args))
    grad_layout = cfg.resolved_dqkv_layout
    grad_strides = _qkv_strides(cfg, grad_layout)
    grad_dtype = desc.dtype(cfg.resolved_dqkv_dtype)
    for index, (name, source) in enumerate((("dQ", "q"), ("dK", "k"), ("dV", "v"))):
        tensor = desc.output(name, outputs[index], dims[source], grad_strides[source], grad_dtype)
        fmt = LAYOUTS[grad_layout].q_format if source == "q" else LAYOUTS[grad_layout].kv_format
        if fmt == "thd":
            desc.ragged(tensor, name, "q" if source == "q" else "kv", grad_strides[source][2])
    if op == "sdpa_fp8_backward":
        for index, name in enumerate(("amax_dQ", "amax_dK", "amax_dV", "amax_dP"), start=3):
            desc.output(name, outputs[index], _SCALAR, _SCALAR, desc.dtype("fp32"))
    elif op == "sdpa_mxfp8_backward":
        for index, name in enumerate(("amax_dQ", "amax_dK", "amax_dV"), start=3):
            desc.output(name, outputs[index], _SCALAR, _SCALAR, desc.dtype("fp32"))
    for name in ("dBias", "dSink_token"):
        if name in args:
            args[name].set_output(True)
    return args


# ----- MXFP8 (block-scaled FP8; cuDNN runs it on Blackwell) ----------------------------------
def _block_scale(desc: Description, name: str, dims: tuple[int, int, int, int], along: str) -> Any:
    """An E8M0 block-scale tensor in F8_128x4 order: one scale per 32 elements along `along`."""
    if "FP8_E8M0" not in desc.features.data_types or "F8_128x4" not in desc.features.reorderings:
        raise desc.unsupported("scaling_mode", "mxfp8", "the frontend has no FP8_E8M0 / F8_128x4 block-scale tensors")
    b, h, s, d = dims
    if along == "d":
        scale_dims = (b, h, _ceil_to(s, 128), _ceil_to(math.ceil(d / 32), 4))
        strides = _row_major(scale_dims)
    else:
        scale_dims = (b, h, _ceil_to(math.ceil(s / 32), 4), _ceil_to(d, 128))
        strides = (h * scale_dims[2] * scale_dims[3], scale_dims[2] * scale_dims[3], 1, scale_dims[2])
    return desc.input(name, scale_dims, strides, desc.dtype("fp8_e8m0"),
                      reordering_type=desc.cudnn.tensor_reordering.F8_128x4)


def _mxfp8_forward_scales(desc: Description) -> dict[str, Any]:
    cfg = desc.cfg
    dims = _qkv_dims(cfg)
    if cfg.layout.paged:
        # A paged cache's block scales are page pools matching its K / V containers (num_pages, H,
        # page_size, D): cudnn-frontend's sdpa_mxfp8 paged_attention_k_table / _v_table.
        pool = (cfg.num_pages, cfg.num_heads_kv, cfg.page_size)
        dims = {**dims, "k": (*pool, cfg.head_dim_qk), "v": (*pool, cfg.resolved_head_dim_v)}
    return {
        "descale_q": _block_scale(desc, "descale_q", dims["q"], "d"),
        "descale_k": _block_scale(desc, "descale_k", dims["k"], "d"),
        "descale_v": _block_scale(desc, "descale_v", dims["v"], "s"),
    }


def _mxfp8_backward_inputs(desc: Description, q: Any, k: Any, d_o: Any) -> dict[str, Any]:
    """The transposed-quantized copies and f16 tensors sdpa_mxfp8_backward reads, with their scales.

    q_T / k_T / dO_T hold the same logical tensors quantized along the sequence axis, so they have
    the dims and strides of Q / K / dO; o_f16 and dO_f16 are O and dO in O's 16-bit type.
    """
    cfg = desc.cfg
    dims, strides = _qkv_dims(cfg), _qkv_strides(cfg, cfg.qkv_layout)
    o_strides = _o_strides(cfg, cfg.resolved_o_format)
    do_strides = _o_strides(cfg, cfg.resolved_do_format)
    # O as the forward wrote it, and the incoming gradient of O in O's type.
    if cfg.resolved_o_dtype not in ("fp16", "bf16"):
        raise desc.unsupported("o_dtype", cfg.resolved_o_dtype, "sdpa_mxfp8_backward reads O in 16 bits (o_f16)")
    f16 = desc.dtype(cfg.resolved_o_dtype)
    args = {
        "q_T": desc.input("q_T", dims["q"], strides["q"]),
        "k_T": desc.input("k_T", dims["k"], strides["k"]),
        "o_f16": desc.input("o_f16", dims["o"], o_strides, f16),
        "dO_f16": desc.input("dO_f16", dims["o"], do_strides, f16),
        "dO": d_o,
        "dO_T": desc.input("dO_T", dims["o"], do_strides, desc.dtype(cfg.resolved_do_dtype)),
    }
    args.update(_mxfp8_forward_scales(desc))
    args["descale_q_T"] = _block_scale(desc, "descale_q_T", dims["q"], "s")
    args["descale_k_T"] = _block_scale(desc, "descale_k_T", dims["k"], "s")
    args["descale_dO"] = _block_scale(desc, "descale_dO", dims["o"], "d")
    args["descale_dO_T"] = _block_scale(desc, "descale_dO_T", dims["o"], "s")
    return args


_FIELD_OF_ARGUMENT = {
    "dropout": "dropout", "use_alibi_mask": "bias", "bias": "bias", "dBias": "bias",
    "use_padding_mask": "mask", "seq_len_q": "mask", "seq_len_kv": "mask",
    "sink_token": "softmax", "dSink_token": "softmax", "score_max": "return_max_logit",
    "use_deterministic_algorithm": "deterministic", "paged_attention_k_table": "qkv_layout",
    "paged_attention_v_table": "qkv_layout", "paged_attention_max_seq_len_kv": "qkv_layout",
    "diagonal_alignment": "bottom_right_diagonal", "generate_stats": "is_training",
    "is_inference": "is_training", "attn_scale": "attn_scale",
}


def _check_arguments(desc: Description, args: Mapping[str, Any]) -> None:
    """Every argument must exist in the installed frontend's operation: never silently dropped."""
    for name in args:
        if not desc.features.accepts(desc.operation, name):
            field_name = _FIELD_OF_ARGUMENT.get(name, "window_size" if "bound" in name or "window" in name else name)
            value = getattr(desc.cfg, field_name, None) if hasattr(desc.cfg, field_name) else None
            raise desc.unsupported(field_name, value, f"{desc.operation}() has no '{name}' argument")
