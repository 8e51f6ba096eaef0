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

BY_NAME = {d.name: d for d in TABLE + AUXILIARY}
F16_DTYPES = tuple(d.name for d in TABLE if not d.is_fp8)
FP8_DTYPES = tuple(d.name for d in TABLE if d.is_fp8)
DTYPES = F16_DTYPES + FP8_DTYPES
_BY_ALIAS = {alias: d for d in TABLE + AUXILIARY for alias in (d.name, *d.aliases)}


def fp8_scale(amax: float, name: str) -> float:
    """The power of two that brings a largest magnitude `amax` nearest below FP8 type `name`'s largest
    value (per-tensor scaling: the real value times the scale is what the FP8 tensor holds)."""
    return 2.0 ** math.floor(math.log2(BY_NAME[name].largest / amax))


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
