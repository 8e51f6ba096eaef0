"""Which configs attention() runs: the AttnConfig of a call, made the same way by dispatch and warmup.

Dispatch reads a call's fields off its tensors (runtime/problem.py) and warmup off a config
(`dispatch_config`); both build the AttnConfig with `call_config`, so both ask for the same plan
keys. Torch-free.
"""

from __future__ import annotations

from typing import Any, Mapping

from fusedattn_select import dtypes
from fusedattn_select.config import AttnConfig
from fusedattn_select.layouts import SEPARATE_LAYOUTS

# The AttnConfig fields a call of attention() sets (read off its tensors and options); every other
# field keeps its default.
CALL_FIELDS = (
    "batch_size", "num_heads_q", "num_heads_kv", "seqlen_q", "seqlen_kv", "head_dim_qk", "head_dim_v",
    "qkv_layout", "qkv_dtype", "o_dtype", "bias", "bias_shape", "mask", "softmax", "window_size", "dropout",
    "attn_scale", "is_training", "deterministic",
)
# Biases a call expresses: none, a post-scale bias tensor, or ALiBi slopes.
CALL_BIASES = ("no_bias", "post_scale_bias", "alibi")


def call_config(fields: Mapping[str, Any]) -> AttnConfig:
    """The AttnConfig attention() selects and runs for a call with these CALL_FIELDS, torch-free, so
    warmup and dispatch make the same one: head_dim_v only where it differs, FP8 calls scaled per
    call ("current"), a bias shape only for a post-scale bias. ConfigError where AttnConfig rejects it.
    """
    given = dict(fields)
    unknown = sorted(set(given) - set(CALL_FIELDS))
    if unknown:
        raise TypeError(f"call_config() got fields a call does not set: {unknown}")
    if given.get("head_dim_v") == given["head_dim_qk"]:
        given["head_dim_v"] = None
    if dtypes.BY_NAME[given["qkv_dtype"]].is_fp8:
        given["scaling_mode"] = "current"
    else:
        given.pop("o_dtype", None)
    if given.get("bias", "no_bias") != "post_scale_bias":
        given.pop("bias_shape", None)
    if given.get("attn_scale") is not None:
        given["attn_scale"] = float(given["attn_scale"])
    given["window_size"] = tuple(given.get("window_size", (-1, -1)))
    return AttnConfig(**given)


def dispatch_config(cfg: AttnConfig) -> AttnConfig | None:
    """The AttnConfig attention() derives from dense tensors of `cfg`'s layout, or None if none.

    Plans are warmed only where this equals `cfg` (same cache key), since only then does dispatch
    ask for the same plan keys.
    """
    if cfg.qkv_layout not in SEPARATE_LAYOUTS or cfg.cuda_graph:
        return None
    if cfg.bias not in CALL_BIASES:
        return None
    fields = {name: getattr(cfg, name) for name in CALL_FIELDS}
    try:
        candidate = call_config(dict(fields, head_dim_v=cfg.resolved_head_dim_v))
    except Exception:  # noqa: BLE001 - a field combination attention() cannot make
        return None
    return candidate if candidate.cache_key() == cfg.cache_key() else None


def not_dispatched_reason(cfg: AttnConfig) -> str:
    """Why attention() never asks for the plans of `cfg` ("" when it does)."""
    if cfg.qkv_layout not in SEPARATE_LAYOUTS:
        return f"qkv_layout={cfg.qkv_layout!r} is not a layout attention() runs"
    if cfg.cuda_graph:
        return "cuda_graph=True: under capture attention() reuses the plans of the eager call"
    if dispatch_config(cfg) is None:
        return "attention() derives a different config from tensors of this problem"
    return ""
