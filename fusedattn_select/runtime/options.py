"""The options of one attention() call as one frozen value, and its flat form at the custom-op boundary
(the custom ops take scalars, not objects: `schema_arguments`, `flatten` and `unflatten` derive the op
arguments from the fields of CallOptions, so a new option is a new field and nothing else)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Sequence

DEFAULT_LAYOUT = "bshd"


@dataclass(frozen=True)
class CallOptions:
    """The non-tensor arguments of one call; hashable (the hot-path key starts with it)."""

    layout: str
    mask: str
    window_size: tuple[int, int]
    attn_scale: Optional[float]
    dropout: float
    softmax: str
    deterministic: bool
    fp8: bool                 # run FP8 kernels (quantizing fp16/bf16 inputs, or float8 inputs)
    o_dtype: str              # output dtype FP8Scales / FP8History ask for ("fp16", "bf16", "fp8_e4m3"; "" if none)
    training: bool
    bias_grad: bool           # training and the bias requires grad (dBias wanted)
    sink_grad: bool           # training and the sink requires grad (dSink wanted)
    return_lse: bool


class OptionalInputs(NamedTuple):
    """The optional tensors of a call (None where not given), in the order the custom ops take them."""

    bias: Any = None
    alibi_slopes: Any = None
    sink: Any = None
    seqlens_q: Any = None
    seqlens_kv: Any = None


NO_INPUTS = OptionalInputs()  # a call without optional tensors

FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(CallOptions))
_HINTS = typing.get_type_hints(CallOptions)
_SCHEMA_TYPES = {str: "str", bool: "bool", int: "int", float: "float", Optional[float]: "float?",
                 tuple[int, int]: "int[]"}
# Fields the op passes as lists (schema "int[]") and CallOptions holds as tuples (hashable).
_TUPLE_FIELDS = frozenset(name for name in FIELD_NAMES if typing.get_origin(_HINTS[name]) is tuple)


def schema_arguments() -> list[str]:
    """The custom-op schema arguments of the options ("str layout", "float? attn_scale", ...)."""
    return [f"{_SCHEMA_TYPES[_HINTS[name]]} {name}" for name in FIELD_NAMES]


def flatten(options: CallOptions) -> tuple:
    """The options as the custom ops' trailing arguments, in field order."""
    return tuple(getattr(options, name) for name in FIELD_NAMES)


def unflatten(values: Sequence[Any]) -> CallOptions:
    """The CallOptions of the custom ops' trailing arguments (inverse of `flatten`)."""
    return CallOptions(*(tuple(value) if name in _TUPLE_FIELDS else value
                         for name, value in zip(FIELD_NAMES, values)))
