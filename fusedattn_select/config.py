"""AttnConfig: one attention problem, its vocabulary, derived values and validation."""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from fusedattn_select import backends
from fusedattn_select.config_messages import allowed, did_you_mean, number_as_text
from fusedattn_select.dtypes import DTYPES, F16_DTYPES, FP8_DTYPES, from_torch
from fusedattn_select.errors import ConfigError
from fusedattn_select.layouts import FORMATS, LAYOUTS, Layout
from fusedattn_select.problem_classes import SHAPE_FIELDS, ClassKeys, ProblemClasses, digest
from fusedattn_select.types import Backend, Phase

MASKS = (
    "no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
    "padding_causal_bottom_right",
)
PADDING_MASKS = ("padding", "padding_causal", "padding_causal_bottom_right")
CAUSAL_MASKS = ("causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right")
BOTTOM_RIGHT_MASKS = ("causal_bottom_right", "padding_causal_bottom_right")
# A top-left causal mask given bottom_right_diagonal: true is its bottom-right form (AttnConfig.resolved_mask).
TO_BOTTOM_RIGHT = {"causal": "causal_bottom_right", "padding_causal": "padding_causal_bottom_right"}
BIASES = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")
BIAS_SHAPES = ("1hss", "b1ss", "bhss", "11ss")
SOFTMAXES = ("vanilla", "off_by_one", "learnable")
SCALING_MODES = ("delayed", "current", "mxfp8")

# Bounds of the problem description, not of a GPU: each dimension fits an int32 (a chosen bound far
# above any real problem: PyTorch sends no batch size or head dim above 65535 to cuDNN SDPA,
# pytorch/pytorch#180718), and each tensor's element count fits the int64 strides that cuDNN's
# tensor descriptors and torch address it with.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
WINDOW_RULE = f"must be (left, right) integers in [-1, {INT32_MAX}]; -1 = unbounded"


def bad_window(window: object) -> bool:
    """Whether `window` (a config's tuple or attention()'s tuple or list) breaks WINDOW_RULE."""
    return (not isinstance(window, (tuple, list)) or len(window) != 2
            or any(isinstance(w, bool) or not isinstance(w, int) or not -1 <= w <= INT32_MAX for w in window))


def resolved_window(window: tuple[int, int], causal: bool) -> tuple[int, int]:
    """(left, right) as the probe builds it: a causal mask bounds the right side at the diagonal, so a
    right bound 0 under it is -1."""
    return (window[0], -1) if causal and window[1] == 0 else window


def _given(value: Any, derived: Any) -> Any:
    return derived if value is None else value


@dataclass(frozen=True)
class AttnConfig:
    """One attention problem, as a framework would run it.

    Fields left as None are derived (see the `resolved_*` properties); every field that changes
    the cuDNN graph reaches the probe as given. Construction validates and raises ConfigError.
    """

    batch_size: int
    num_heads_q: int
    num_heads_kv: int
    seqlen_q: int
    seqlen_kv: int
    head_dim_qk: int
    head_dim_v: int | None = None
    qkv_dtype: str = "bf16"
    o_dtype: str | None = None
    do_dtype: str | None = None
    dqkv_dtype: str | None = None
    qkv_layout: str = "bshd_bshd_bshd"
    o_format: str | None = None
    do_format: str | None = None
    dqkv_layout: str | None = None
    mask: str = "no_mask"
    bias: str = "no_bias"
    bias_shape: str | None = None
    softmax: str = "vanilla"
    window_size: tuple[int, int] = (-1, -1)
    bottom_right_diagonal: bool | None = None
    dropout: float = 0.0
    attn_scale: float | None = None
    is_training: bool = True
    deterministic: bool = False
    cuda_graph: bool = False
    return_max_logit: bool = False
    scaling_mode: str | None = None
    page_size: int | None = None
    num_pages: int | None = None

    def __post_init__(self) -> None:
        # Accept lists from YAML/JSON for window_size; keep the frozen value a tuple.
        if isinstance(self.window_size, list):
            object.__setattr__(self, "window_size", tuple(self.window_size))
        for name in ("attn_scale", "dropout"):
            value = getattr(self, name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= sys.float_info.max:
                # -0.0 as 0.0: one problem, and a class's key text keeps the first spelling it met; an
                # int beyond any float stays an int, which _validate refuses naming the field
                object.__setattr__(self, name, float(value) + 0.0)
        problem_class = _classes.of(self)
        if problem_class is not None and problem_class in _classes:
            _validate_shape(self)  # every other field was validated with an earlier config of its class
        else:
            _validate(self)
            if problem_class is not None:
                _classes.remember(problem_class, None)
        object.__setattr__(self, "_class", problem_class)

    # ----- derived values -------------------------------------------------------------------
    @property
    def layout(self) -> Layout:
        return LAYOUTS[self.qkv_layout]

    @property
    def candidate(self) -> Backend:
        """The backend this problem asks for: the first registered backend answering its qkv_dtype and
        phases (backends.py): F16 for fp16/bf16 and FP8 for fp8 unless another is registered ahead."""
        entry = backends.candidate(self.qkv_dtype, self.phases)
        return entry.backend if entry is not None else Backend.NONE

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The graphs this problem runs: forward, and backward when training."""
        return Phase.of(self.is_training)

    @property
    def is_fp8(self) -> bool:
        return self.qkv_dtype in FP8_DTYPES

    @property
    def q_format(self) -> str:
        return self.layout.q_format

    @property
    def kv_format(self) -> str:
        return self.layout.kv_format

    # A field left None takes the value it is derived from.
    resolved_head_dim_v = property(lambda self: _given(self.head_dim_v, self.head_dim_qk))
    resolved_o_format = property(lambda self: _given(self.o_format, self.q_format))
    resolved_do_format = property(lambda self: _given(self.do_format, self.resolved_o_format))
    resolved_dqkv_layout = property(lambda self: _given(self.dqkv_layout, self.qkv_layout))

    @property
    def resolved_mask(self) -> str:
        """The mask as the probe builds it: `causal` or `padding_causal` given bottom_right_diagonal: true
        is aligned bottom-right, the graph of its `*_bottom_right` form (one problem, one cache key)."""
        return TO_BOTTOM_RIGHT.get(self.mask, self.mask) if self.bottom_right_diagonal is True else self.mask

    @property
    def resolved_window_size(self) -> tuple[int, int]:
        """window_size as the probe builds it: a causal mask bounds the right side at the diagonal, so
        its right bound 0 is -1 (unbounded but for the mask); (-1, 0) and (-1, -1) are one problem."""
        return resolved_window(tuple(self.window_size), self.is_causal)

    @property
    def resolved_bottom_right_diagonal(self) -> bool:
        if self.bottom_right_diagonal is not None:
            return self.bottom_right_diagonal
        return self.mask in BOTTOM_RIGHT_MASKS

    @property
    def resolved_attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim_qk) if self.attn_scale is None else self.attn_scale

    @property
    def resolved_scaling_mode(self) -> str | None:
        if not self.is_fp8:
            return None
        return "delayed" if self.scaling_mode is None else self.scaling_mode

    @property
    def resolved_o_dtype(self) -> str:
        """F16: qkv_dtype. FP8 delayed scaling: qkv_dtype (FP8 output); current/mxfp8: bf16."""
        if self.o_dtype is not None:
            return self.o_dtype
        if not self.is_fp8 or self.resolved_scaling_mode == "delayed":
            return self.qkv_dtype
        return "bf16"

    @property
    def resolved_do_dtype(self) -> str:
        """F16: qkv_dtype. FP8: fp8_e5m2 (TransformerEngine's HYBRID recipe for gradients)."""
        if self.do_dtype is not None:
            return self.do_dtype
        return "fp8_e5m2" if self.is_fp8 else self.qkv_dtype

    @property
    def resolved_dqkv_dtype(self) -> str:
        """F16: qkv_dtype. FP8: the resolved output dtype of the forward pass."""
        if self.dqkv_dtype is not None:
            return self.dqkv_dtype
        return self.resolved_o_dtype if self.is_fp8 else self.qkv_dtype

    @property
    def has_padding(self) -> bool:
        return self.mask in PADDING_MASKS

    @property
    def is_causal(self) -> bool:
        return self.mask in CAUSAL_MASKS

    def resolved(self) -> dict[str, Any]:
        """Every field with derived values filled in, and one spelling of each problem (resolved_mask,
        resolved_window_size): what the probe is built from and the cache keys are made of."""
        data = self.to_dict(include_defaults=True)
        data.update(
            mask=self.resolved_mask,
            window_size=list(self.resolved_window_size),
            head_dim_v=self.resolved_head_dim_v,
            o_dtype=self.resolved_o_dtype,
            do_dtype=self.resolved_do_dtype if self.is_training else None,
            dqkv_dtype=self.resolved_dqkv_dtype if self.is_training else None,
            o_format=self.resolved_o_format,
            do_format=self.resolved_do_format if self.is_training else None,
            dqkv_layout=self.resolved_dqkv_layout if self.is_training else None,
            bottom_right_diagonal=self.resolved_bottom_right_diagonal,
            attn_scale=self.resolved_attn_scale,
            scaling_mode=self.resolved_scaling_mode,
        )
        return data

    def cache_key(self) -> str:
        """A stable digest of the resolved problem: equal keys mean the same cuDNN graphs.

        Every graph-changing field is part of it, batch size and sequence lengths included, so a
        decision is never reused for another shape; the probe for a new shape is warm (kernels
        compiled for the same problem class are reused by cuDNN), not cold.
        """
        key = self.__dict__.get("_cache_key")
        return key if key is not None else self._keys()[0]

    def shape_class_key(self) -> str:
        """The cache key without batch size and sequence lengths (what a kernel is compiled for)."""
        key = self.__dict__.get("_shape_class_key")
        return key if key is not None else self._keys()[1]

    def _keys(self) -> tuple[str, str]:
        """(cache_key, shape_class_key), computed together once per (immutable) config: dispatch asks
        both of every new shape, and the selector's cache hit is a dict lookup on the first.

        Each is the digest of the resolved fields as sorted JSON (the class's without the shape
        fields). The class's JSON text is made once per class, and a config's is that text with its
        shape values put in (ClassKeys), so a new shape of a known class costs one digest."""
        problem_class = self.__dict__.get("_class")
        keys = _classes.keys(problem_class) if problem_class is not None else None
        if keys is None:
            keys = ClassKeys.of(self.resolved())
            if problem_class is not None:
                _classes.remember(problem_class, keys)
        digests = (digest(keys.text(self)), keys.class_key)
        object.__setattr__(self, "_cache_key", digests[0])
        object.__setattr__(self, "_shape_class_key", digests[1])
        return digests

    def replace(self, **changes: Any) -> "AttnConfig":
        return dataclasses.replace(self, **changes)

    # ----- (de)serialisation ----------------------------------------------------------------
    def to_dict(self, include_defaults: bool = False) -> dict[str, Any]:
        """The fields as plain data; by default only those that differ from their defaults."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            if include_defaults or f.default is dataclasses.MISSING:
                out[f.name] = value
                continue
            default = list(f.default) if isinstance(f.default, tuple) else f.default
            if value != default:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AttnConfig":
        """Build from a mapping of field names; unknown or missing keys raise ConfigError."""
        if not isinstance(data, Mapping):
            raise ConfigError("config", data, "must be a mapping of AttnConfig fields")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names), key=str)
        if unknown:
            suggestion = did_you_mean(unknown[0], names)
            # With a likely intended field, the answer is that name; the full list of 30 buries it.
            rest = f"(AttnConfig has {len(names)} fields; see README 'Config format')" if suggestion else allowed(names)
            raise ConfigError(unknown[0], data[unknown[0]], "unknown field; " + suggestion + rest)
        missing = [
            f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.name not in data
        ]
        if missing:
            also = f" (missing: {', '.join(missing)})" if len(missing) > 1 else ""
            raise ConfigError(missing[0], None, "required field is missing" + also)
        return cls(**dict(data))


# Every field but the shape: what makes a problem class (problem_classes.py).
_classes = ProblemClasses(tuple(f.name for f in dataclasses.fields(AttnConfig) if f.name not in SHAPE_FIELDS))


# ----- validation ---------------------------------------------------------------------------
def is_size(value: Any) -> bool:
    """Whether `value` is what AttnConfig's size fields take: a positive int up to INT32_MAX (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= INT32_MAX


def _check_int(cfg: AttnConfig, name: str, optional: bool = False) -> None:
    value = getattr(cfg, name)
    if (value is None and optional) or is_size(value):
        return
    if isinstance(value, int) and not isinstance(value, bool) and value > INT32_MAX:
        raise ConfigError(name, value, f"must be at most {INT32_MAX} (2**31-1, an int32)")
    raise ConfigError(name, value, "must be a positive integer")


def _check_choice(cfg: AttnConfig, name: str, choices: tuple[str, ...], optional: bool = False) -> None:
    value = getattr(cfg, name)
    if value is None and optional:
        return
    if value not in choices:
        raise ConfigError(name, value, choice_message(name, value, choices))


def choice_message(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """What a field `name` given `value` outside `choices` is told: a suggestion, then the choices."""
    meant = from_torch(value) if name.endswith("_dtype") else None  # 'float16', 'half', torch.float16
    hint = f"did you mean {meant!r}? " if meant in choices else did_you_mean(value, choices)
    return hint + allowed(choices)


def _check_bool(cfg: AttnConfig, name: str, optional: bool = False) -> None:
    value = getattr(cfg, name)
    if value is None and optional:
        return
    if not isinstance(value, bool):
        raise ConfigError(name, value, "must be true or false")


def _validate(cfg: AttnConfig) -> None:
    for name in ("batch_size", "num_heads_q", "num_heads_kv", "seqlen_q", "seqlen_kv", "head_dim_qk"):
        _check_int(cfg, name)
    _check_int(cfg, "head_dim_v", optional=True)
    if cfg.num_heads_q % cfg.num_heads_kv:
        raise ConfigError(
            "num_heads_kv", cfg.num_heads_kv,
            f"must divide num_heads_q={cfg.num_heads_q} (grouped-query attention)",
        )
    _check_choice(cfg, "qkv_dtype", DTYPES)
    for name in ("o_dtype", "do_dtype", "dqkv_dtype"):
        _check_choice(cfg, name, DTYPES, optional=True)
    _check_choice(cfg, "qkv_layout", tuple(LAYOUTS))
    _check_choice(cfg, "o_format", FORMATS, optional=True)
    _check_choice(cfg, "do_format", FORMATS, optional=True)
    _check_choice(cfg, "dqkv_layout", tuple(n for n, lay in LAYOUTS.items() if not lay.paged), optional=True)
    _check_choice(cfg, "mask", MASKS)
    _check_choice(cfg, "bias", BIASES)
    _check_choice(cfg, "bias_shape", BIAS_SHAPES, optional=True)
    _check_choice(cfg, "softmax", SOFTMAXES)
    _check_choice(cfg, "scaling_mode", SCALING_MODES, optional=True)
    for name in ("is_training", "deterministic", "cuda_graph", "return_max_logit"):
        _check_bool(cfg, name)
    _check_bool(cfg, "bottom_right_diagonal", optional=True)
    _check_int(cfg, "page_size", optional=True)
    _check_int(cfg, "num_pages", optional=True)
    if not isinstance(cfg.window_size, tuple) or bad_window(cfg.window_size):
        raise ConfigError("window_size", cfg.window_size, WINDOW_RULE)
    if isinstance(cfg.dropout, bool) or not isinstance(cfg.dropout, float) or not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError("dropout", cfg.dropout, "must be a float in [0, 1)" + number_as_text(cfg.dropout))
    if cfg.attn_scale is not None and (
        isinstance(cfg.attn_scale, bool) or not isinstance(cfg.attn_scale, float)
        or not math.isfinite(cfg.attn_scale) or cfg.attn_scale <= 0
    ):
        raise ConfigError("attn_scale", cfg.attn_scale, "must be a positive finite float, or null for "
                          "1/sqrt(head_dim_qk)" + number_as_text(cfg.attn_scale))
    _validate_cross_fields(cfg)
    _check_extents(cfg)


def _validate_shape(cfg: AttnConfig) -> None:
    """The checks that read the shape fields, in _validate's order: all a config still needs when
    another config of its class (every other field equal) passed _validate."""
    for name in ("batch_size", "seqlen_q", "seqlen_kv"):
        _check_int(cfg, name)
    _check_int(cfg, "num_pages", optional=True)
    _validate_packing(cfg)
    _validate_paging(cfg)
    _check_extents(cfg)


def _check_extents(cfg: AttnConfig) -> None:
    """Each tensor's element count fits int64 strides (each dim alone is at most INT32_MAX)."""
    kv_rows = (cfg.num_pages, cfg.page_size) if cfg.layout.paged else (cfg.batch_size, cfg.seqlen_kv)
    tensors = (
        ("Q", "batch_size*seqlen_q*num_heads_q*head_dim_qk", (cfg.batch_size, cfg.seqlen_q, cfg.num_heads_q, cfg.head_dim_qk)),
        ("O", "batch_size*seqlen_q*num_heads_q*head_dim_v",
         (cfg.batch_size, cfg.seqlen_q, cfg.num_heads_q, cfg.resolved_head_dim_v)),
        ("K", "batch_size*seqlen_kv*num_heads_kv*head_dim_qk", (*kv_rows, cfg.num_heads_kv, cfg.head_dim_qk)),
        ("V", "batch_size*seqlen_kv*num_heads_kv*head_dim_v", (*kv_rows, cfg.num_heads_kv, cfg.resolved_head_dim_v)),
    )
    for tensor, product, dims in tensors:
        elements = math.prod(dims)
        if elements > INT64_MAX:
            if cfg.layout.paged and tensor in "KV":
                product = product.replace("batch_size*seqlen_kv", "num_pages*page_size")
            raise ConfigError(product, elements, f"elements of {tensor}: must be at most {INT64_MAX} (2**63-1), "
                              "the int64 strides cuDNN and torch address a tensor with")


def _validate_cross_fields(cfg: AttnConfig) -> None:
    layout = cfg.layout
    if layout.ragged and not cfg.has_padding:
        raise ConfigError(
            "mask", cfg.mask,
            f"qkv_layout={cfg.qkv_layout!r} is ragged (THD) and needs a padding mask: " + allowed(PADDING_MASKS),
        )
    _validate_packing(cfg)
    _validate_paging(cfg)
    for name in ("o_format", "do_format"):
        value = getattr(cfg, name)
        if value == "thd" and cfg.q_format != "thd" or value not in (None, "thd") and cfg.q_format == "thd":
            raise ConfigError(name, value, f"must be 'thd' exactly when Q is THD (q format {cfg.q_format!r})")
    if cfg.dqkv_layout is not None and LAYOUTS[cfg.dqkv_layout].ragged != layout.ragged:
        raise ConfigError("dqkv_layout", cfg.dqkv_layout, f"must be ragged (THD) exactly when qkv_layout={cfg.qkv_layout!r} is")
    left, right = cfg.window_size
    if cfg.is_causal and right not in (-1, 0):
        raise ConfigError("window_size", cfg.window_size, f"mask={cfg.mask!r} is causal: the right bound must be 0 or -1")
    if cfg.bottom_right_diagonal is False and cfg.mask in BOTTOM_RIGHT_MASKS:
        raise ConfigError("bottom_right_diagonal", False, f"contradicts mask={cfg.mask!r}; leave it null or true")
    if cfg.bias == "post_scale_bias" and cfg.bias_shape is None:
        raise ConfigError("bias_shape", None, "post_scale_bias needs a bias_shape: " + allowed(BIAS_SHAPES))
    if cfg.bias != "post_scale_bias" and cfg.bias_shape is not None:
        raise ConfigError("bias_shape", cfg.bias_shape, f"only allowed with bias='post_scale_bias' (bias={cfg.bias!r})")
    if not cfg.is_fp8:
        if cfg.scaling_mode is not None:
            raise ConfigError("scaling_mode", cfg.scaling_mode, f"only for FP8 qkv_dtype ({allowed(FP8_DTYPES)}); qkv_dtype={cfg.qkv_dtype!r}")
        for name in ("o_dtype", "do_dtype", "dqkv_dtype"):
            value = getattr(cfg, name)
            if value is not None and value not in F16_DTYPES:
                raise ConfigError(name, value, f"qkv_dtype={cfg.qkv_dtype!r} is not FP8: {allowed(F16_DTYPES)}")
    if cfg.is_fp8 and cfg.o_dtype is not None and cfg.o_dtype not in FP8_DTYPES + ("bf16", "fp16"):
        raise ConfigError("o_dtype", cfg.o_dtype, allowed(DTYPES))
    if not cfg.is_training:
        for name in ("do_dtype", "dqkv_dtype", "do_format", "dqkv_layout"):
            if getattr(cfg, name) is not None:
                raise ConfigError(name, getattr(cfg, name), "describes the backward pass; only allowed with is_training: true")


def _validate_packing(cfg: AttnConfig) -> None:
    # dQ, dK, dV interleaved in one tensor (dqkv_layout) need the shapes Q, K, V interleaved do.
    for name in ("qkv_layout", "dqkv_layout"):
        layout_name = getattr(cfg, name)
        packing = None if layout_name is None else LAYOUTS[layout_name].packing
        if packing in ("3hd", "h3d") and (
            cfg.seqlen_q != cfg.seqlen_kv or cfg.num_heads_q != cfg.num_heads_kv
            or cfg.resolved_head_dim_v != cfg.head_dim_qk
        ):
            raise ConfigError(
                name, layout_name,
                "interleaved QKV needs seqlen_q == seqlen_kv, num_heads_q == num_heads_kv and head_dim_v == head_dim_qk",
            )
        if packing in ("2hd", "h2d") and cfg.resolved_head_dim_v != cfg.head_dim_qk:
            raise ConfigError(name, layout_name, "interleaved KV needs head_dim_v == head_dim_qk")


def _validate_paging(cfg: AttnConfig) -> None:
    if cfg.layout.paged:
        if cfg.page_size is None or cfg.num_pages is None:
            raise ConfigError("page_size", cfg.page_size, f"qkv_layout={cfg.qkv_layout!r} (paged KV) needs page_size and num_pages")
        if cfg.is_training:
            raise ConfigError("is_training", True, "paged KV caches are for inference only; set is_training: false")
        if not cfg.has_padding:
            raise ConfigError("mask", cfg.mask, "paged KV needs a padding mask (sequence lengths): " + allowed(PADDING_MASKS))
    elif cfg.page_size is not None or cfg.num_pages is not None:
        field_name = "page_size" if cfg.page_size is not None else "num_pages"
        raise ConfigError(field_name, getattr(cfg, field_name), "only allowed with a paged_kv_* qkv_layout")
