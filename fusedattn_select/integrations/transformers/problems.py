"""The distinct attention problems of a Hugging Face model config, as `AttnConfig`s.

Reads a config.json path (or its directory), a JSON string, a dict, a transformers config object
or a model, always through one JSON reader (model_reading.py): it needs neither torch nor
transformers, and gives the same problems whether transformers is installed or not.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from fusedattn_select import dtypes
from fusedattn_select.config import INT32_MAX, AttnConfig, is_size
from fusedattn_select.errors import ConfigError
from fusedattn_select.integrations.transformers.config_json import config_data, source_name
from fusedattn_select.integrations.transformers.masks import cudnn_window
from fusedattn_select.integrations.transformers.model_families import FAMILIES
from fusedattn_select.integrations.transformers.model_reading import (
    ATTENTION_LAYER_TYPES,
    DEFAULT_REPORT_SEQLEN,
    AttentionStack,
    ModelReading,
    read_model,
)

__all__ = [
    "ATTENTION_LAYER_TYPES", "DEFAULT_REPORT_SEQLEN", "SINK_MODEL_TYPES", "LayerProblem", "ModelReading",
    "configs_from_hf", "hf_config", "layer_problems", "model_problems",
]

# Model types whose every attention layer has learnable sinks (transformers has no config flag).
SINK_MODEL_TYPES = frozenset(name for name, family in FAMILIES.items() if family.sinks)


class LayerProblem(NamedTuple):
    """One attention problem and the layers that share it."""

    name: str
    layer_type: str
    config: AttnConfig
    layers: list[int]
    sliding_window: int | None
    softcap: float | None
    sinks: bool
    integration_reasons: tuple[str, ...]


def hf_config(source: Any) -> ModelReading:
    """The attention stacks of a model config from any accepted source; ConfigError naming the
    JSON key of a field that cannot be read right."""
    return read_model(config_data(source), source_name(source))


def _integration_reasons(stack: AttentionStack, layer_type: str, seqlen_kv: int) -> tuple[str, ...]:
    """Why this integration runs a layer outside cuDNN whatever cuDNN answers for its problem at `seqlen_kv` keys."""
    reasons: list[str] = []
    if stack.own_attention:
        reasons.append("transformers runs this model's attention in the model's own code, not through its attention "
                       "interface: attn_implementation='fusedattn' cannot run these layers (use 'eager')")
    if stack.softcap:
        reasons.append(
            f"attn_logit_softcapping={stack.softcap:g}: cuDNN has no logit soft-capping; runs on the float32 reference"
        )
    if layer_type == "chunked_attention" and stack.chunk_size is not None and seqlen_kv >= stack.chunk_size:
        # Below one chunk of keys transformers' "sdpa" mask function skips the chunked mask (plain causal:
        # masking_utils._ignore_causal_mask_sdpa), and the attention function runs the layer through attention().
        reasons.append(
            f"chunked attention (attention_chunk_size={stack.chunk_size}) at {seqlen_kv} keys has no cuDNN "
            "mask; runs on torch SDPA with a dense mask"
        )
    return tuple(reasons)


def _stack_config(stack: AttentionStack, window: int | None, shape: tuple[int, int, int], is_training: bool,
                  qkv_dtype: str) -> AttnConfig:
    batch_size, seqlen_q, seqlen_kv = shape
    return AttnConfig(
        batch_size=batch_size, num_heads_q=stack.heads_q, num_heads_kv=stack.heads_kv, seqlen_q=seqlen_q,
        seqlen_kv=seqlen_kv, head_dim_qk=stack.head_dim_qk, head_dim_v=stack.head_dim_v, qkv_dtype=qkv_dtype,
        mask="causal" if stack.causal else "no_mask", bias=stack.bias, bias_shape=stack.bias_shape,
        window_size=cudnn_window(window, min(seqlen_q, seqlen_kv)) if stack.causal else (-1, -1),
        softmax="learnable" if stack.sinks else "vanilla", dropout=stack.dropout if is_training else 0.0,
        attn_scale=stack.attn_scale, is_training=is_training,
    )


def check_seqlen(field: str, value: Any) -> None:
    """ConfigError naming the argument `field` unless `value` is None (each stack's own length) or a
    positive integer within AttnConfig's bound: 0 or False is no length, not "the default"."""
    if value is not None and not is_size(value):
        raise ConfigError(field, value, f"must be a positive integer (at most {INT32_MAX}), or None for each "
                                        "attention stack's own length")


def model_problems(reading: ModelReading, batch_size: int, seqlen: int | None, is_training: bool,
                   dtype: Any = None, seqlen_kv: int | None = None) -> list[LayerProblem]:
    """The model's distinct attention problems, stack by stack, in the order of their first layer.

    `seqlen` is the query length and `seqlen_kv` the key length (None: each stack's own, see
    AttentionStack); a stack's window applies only where it cuts at those lengths. `dtype` None
    is the dtype the config names, bf16 when it names no fused one.
    """
    check_seqlen("seqlen", seqlen)
    check_seqlen("seqlen_kv", seqlen_kv)
    qkv_dtype = dtypes.parse(dtype if dtype is not None else reading.dtype or "bf16")
    groups: dict[tuple, LayerProblem] = {}
    for stack in reading.stacks:
        shape = (batch_size, stack.seqlen_q if seqlen is None else seqlen,
                 stack.seqlen_kv if seqlen_kv is None else seqlen_kv)
        for index, layer_type in enumerate(stack.layer_types):
            if layer_type not in ATTENTION_LAYER_TYPES:
                continue
            window = stack.sliding_window if layer_type == "sliding_attention" else None
            config = _stack_config(stack, window, shape, is_training, qkv_dtype)
            name = stack.layer_name(layer_type) + ("+sinks" if stack.sinks else "") + ("+softcap" if stack.softcap else "")
            key = (name, config, window)
            if key not in groups:
                groups[key] = LayerProblem(name, layer_type, config, [], window, stack.softcap, stack.sinks,
                                           _integration_reasons(stack, layer_type, config.seqlen_kv))
            groups[key].layers.append(index)
    return list(groups.values())


def layer_problems(
    config: Any, *, batch_size: int = 1, seqlen: int | None = None, is_training: bool = True, dtype: Any = None,
) -> list[tuple[str, AttnConfig, list[int], tuple[str, ...]]]:
    """Like `configs_from_hf`, plus the reasons this integration cannot run a layer fused at all
    (soft-capping, chunked attention) whatever cuDNN answers for its AttnConfig."""
    reading = hf_config(config)
    return [
        (p.name, p.config, list(p.layers), tuple(p.integration_reasons))
        for p in model_problems(reading, batch_size, seqlen, is_training, dtype, seqlen)
    ]


def configs_from_hf(
    config: Any, *, batch_size: int = 1, seqlen: int | None = None, is_training: bool = True, dtype: Any = None,
) -> list[tuple[str, AttnConfig, list[int]]]:
    """The distinct attention problems of a Hugging Face model config: (layer name, problem, layers).

    `config` is a config.json path (or its directory), a JSON string, a dict, a transformers
    config or a model. `seqlen` (queries and keys) defaults to each stack's own length:
    min(max_position_embeddings, 4096) for a language model, patches + class token for a vision
    encoder, the source and target lengths for Whisper. `dtype` defaults to the config's
    torch_dtype / dtype (bf16 when it names no fused dtype). Layer names are the layer type of a
    language model (plus "+sinks" / "+softcap" where they apply), or the stack: "encoder",
    "decoder", "cross_attention", "vision".
    """
    reading = hf_config(config)
    return [(p.name, p.config, list(p.layers))
            for p in model_problems(reading, batch_size, seqlen, is_training, dtype, seqlen)]
