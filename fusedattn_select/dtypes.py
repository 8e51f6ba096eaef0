"""Data types: the names configs use, and their torch and cuDNN counterparts (one table)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fusedattn_select.errors import ConfigError


@dataclass(frozen=True)
class DType:
    """One element type: its config name, torch attribute, cuDNN data_type member and aliases."""

    name: str
    torch_name: str
    cudnn_name: str
    is_fp8: bool = False
    aliases: tuple[str, ...] = ()
    largest: float = 0.0  # the largest finite value (FP8 types, which scaling maps onto)


TABLE: tuple[DType, ...] = (
    DType("fp16", "float16", "HALF", aliases=("float16", "half", "torch.float16")),
    DType("bf16", "bfloat16", "BFLOAT16", aliases=("bfloat16", "torch.bfloat16")),
    DType("fp8_e4m3", "float8_e4m3fn", "FP8_E4M3", is_fp8=True, aliases=("float8_e4m3fn", "torch.float8_e4m3fn"),
          largest=448.0),
    DType("fp8_e5m2", "float8_e5m2", "FP8_E5M2", is_fp8=True, aliases=("float8_e5m2", "torch.float8_e5m2"),
          largest=57344.0),
)
# Tensors of a graph that are not attention data: statistics, scales, offsets and seeds.
AUXILIARY: tuple[DType, ...] = (
    DType("fp32", "float32", "FLOAT", aliases=("float32", "float", "torch.float32")),
    DType("int32", "int32", "INT32"),
    DType("int64", "int64", "INT64"),
    DType("fp8_e8m0", "float8_e8m0fnu", "FP8_E8M0"),
)

# The scale of the softmax probabilities P (in [0, 1]) that cuDNN's FP8 graphs quantize inside the
# kernel: a power of two well below the FP8 types' tops (headroom for kernels that defer the
# running-max rescale, whose P may exceed 1). Dispatch and depth verify bind it as scale_s
# (descale_s its inverse).
FP8_SOFTMAX_SCALE = 64.0
# The top an FP8 backward's dS ("dP") is scaled to: below e4m3's 448, cudnn-frontend's test
# convention (the largest power of two of a 240-max e4m3 variant), leaving headroom.
FP8_INTERNAL_RANGE = 128.0

BY_NAME = {d.name: d for d in TABLE + AUXILIARY}
F16_DTYPES = tuple(d.name for d in TABLE if not d.is_fp8)
FP8_DTYPES = tuple(d.name for d in TABLE if d.is_fp8)
DTYPES = F16_DTYPES + FP8_DTYPES
_BY_ALIAS = {alias: d for d in TABLE + AUXILIARY for alias in (d.name, *d.aliases)}


def fp8_scale(amax: float, name: str, top: float = 0.0) -> float:
    """The power of two that brings a largest magnitude `amax` nearest below `top` (default: FP8 type
    `name`'s largest value). Per-tensor scaling: the real value times the scale is what the FP8
    tensor holds."""
    return 2.0 ** math.floor(math.log2((top or BY_NAME[name].largest) / amax))


def dropout_headroom(dropout: float) -> float:
    """2**floor(log2(1 - dropout)), exactly: the factor an FP8 O's scale takes from V's (dispatch and verify
    bind it alike). Dropout divides the probabilities it keeps by 1 - dropout, so |O| can reach
    amax(V) / (1 - dropout)."""
    return math.ldexp(1.0, math.frexp(1.0 - dropout)[1] - 1)


def fp8_gradient_bounds(attn_scale: Any, keep: Any, rows: Any, amax_q: Any, amax_k: Any, amax_do: Any,
                        do_row_norm: Any, v_row_norm: Any) -> dict[str, Any]:
    """Upper bounds on the magnitudes an FP8 backward writes, from its inputs' real values, which its
    scales are sized for: "dP" (attn_scale x dS, which cuDNN's graph scales by scale_dP and stores in
    dO's type before dQ = dP K and dK = dP^T Q), "dQ", "dK", "dV".

    keep: 1 / (1 - dropout); rows: seqlen_q x query heads per KV head; *_row_norm: the largest L2 norm
    of a row (head_dim vector). Floats or one-element tensors (runtime/fp8.py derives the bounds).
    """
    ds = attn_scale * 2.0 * keep * do_row_norm * v_row_norm  # |dS_ij| <= P_ij (|dO_i.V_j| + |dO_i.O_i|)
    return {"dP": ds, "dQ": amax_k * ds, "dK": amax_q * ds * rows, "dV": keep * amax_do * rows}


def parse(value: Any, field: str = "dtype") -> str:
    """The config name of a dtype given by name, alias ("bfloat16") or torch dtype."""
    found = _BY_ALIAS.get(str(value))
    if found is None or found.name not in DTYPES:
        raise ConfigError(field, value, "must be one of " + ", ".join(repr(n) for n in DTYPES))
    return found.name


def torch_dtype(name: str, torch: ModuleType) -> Any:
    """The torch dtype of a config name (torch passed in: this module never imports it)."""
    return getattr(torch, BY_NAME[name].torch_name)


def from_torch(dtype: Any) -> str | None:
    """The config name of a torch dtype, or None when it has none."""
    found = _BY_ALIAS.get(str(dtype))
    return found.name if found is not None else None


def cudnn_dtype(name: str, cudnn: ModuleType) -> Any:
    """The cudnn.data_type member of a config name."""
    return getattr(cudnn.data_type, BY_NAME[name].cudnn_name)


def from_cudnn(data_type: Any) -> str:
    """The config name of a cudnn.data_type member (or its printed form)."""
    member = getattr(data_type, "name", None) or str(data_type).rsplit(".", 1)[-1]
    for d in TABLE + AUXILIARY:
        if d.cudnn_name == member:
            return d.name
    raise ConfigError("data_type", data_type, "has no counterpart in fusedattn_select.dtypes")
