"""What a Hugging Face config.json says about a model's attention: its stacks of attention layers.

A decoder-only language model is one stack (its layers typed full / sliding / chunked attention);
an encoder (BERT, ViT) is one bidirectional stack; T5 and Whisper are three (encoder
self-attention, decoder self-attention, decoder cross-attention); CLIP and multimodal models add a
vision encoder stack to their text model (`text_config`). Reads JSON only: the keys each family
spells (GPT-2's n_head / n_layer / n_embd, T5's num_heads / d_kv, Whisper's encoder_* / decoder_*)
and the defaults transformers' config classes give a key the file leaves out are data in
model_families.py. A field that cannot be read right is a ConfigError naming its JSON key.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from fusedattn_select import dtypes
from fusedattn_select.errors import ConfigError
from fusedattn_select.integrations.transformers import model_families as families
from fusedattn_select.integrations.transformers.config_json import (
    BOOLEAN, COUNT, NAMES, NON_NEGATIVE_NUMBER, POSITIVE_INTEGER, POSITIVE_NUMBER, PROBABILITY, TEXT, Fields,
)

DEFAULT_REPORT_SEQLEN = 4096
# transformers' layer type names for softmax attention; others (mamba, conv, linear_attention,
# ...) are not attention problems and are left out.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


@dataclass(frozen=True)
class AttentionStack:
    """Layers of one kind of attention and what they share.

    `prefix` names the stack in a model of several ("encoder", "decoder", "cross_attention",
    "vision"; "" for a language model's own layers, which are named by their layer type).
    `seqlen_q` / `seqlen_kv` are the lengths read when the caller gives none; `positions` is the
    longest sequence the config says the stack takes (None: it says none).
    """

    prefix: str
    heads_q: int
    heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    layer_types: tuple[str, ...]
    causal: bool
    seqlen_q: int
    seqlen_kv: int
    sliding_window: int | None = None
    chunk_size: int | None = None
    dropout: float = 0.0
    attn_scale: float | None = None
    bias: str = "no_bias"
    bias_shape: str | None = None
    sinks: bool = False
    softcap: float | None = None
    positions: int | None = None
    own_attention: bool = False  # the model's own attention code runs these layers (Family.own_attention)

    def layer_name(self, layer_type: str) -> str:
        """A layer's name: its type for a language model, else the stack's prefix."""
        if not self.prefix:
            return layer_type
        return self.prefix if layer_type == "full_attention" else f"{self.prefix}:{layer_type}"


@dataclass(frozen=True)
class ModelReading:
    """A model config read: its attention stacks, the dtype it is stored in (None when it names
    no fused dtype) and what the reader says about what it did not describe or read another way."""

    model_type: str
    stacks: tuple[AttentionStack, ...]
    dtype: str | None
    notes: tuple[str, ...] = ()


def _count(fields: Fields, keys: tuple[str, ...], what: str) -> tuple[str, int]:
    found = fields.first(keys, POSITIVE_INTEGER)
    if found is None:
        model_type = fields.data.get("model_type")
        typed = f"model_type {model_type!r}" if isinstance(model_type, str) and model_type else "no model_type"
        detail = typed if fields.where == "hf_config" else f"{fields.where}, {typed}"
        others = f", nor {' / '.join(keys[1:])}" if len(keys) > 1 else ""
        raise ConfigError(fields.path(keys[0]), None,
                          f"is not given{others}: {fields.source} ({detail}) has no {what}; "
                          "not a transformer model config this reader knows")
    return found


def _head_dims(fields: Fields, family: families.Family, heads_key: str, heads: int) -> tuple[int, int]:
    rope = fields.get("qk_rope_head_dim", POSITIVE_INTEGER)
    value_dim = fields.get("v_head_dim", POSITIVE_INTEGER)
    if rope is not None and value_dim is not None:
        # Multi-head latent attention (DeepSeek V2/V3): Q and K carry a no-position part and a
        # rotary part; V has its own width.
        return fields.get("qk_nope_head_dim", COUNT, 0) + rope, value_dim
    given = fields.first(family.head_dim_keys, POSITIVE_INTEGER)
    if given is not None:
        return given[1], given[1]
    if family.head_dim_default is not None:
        return family.head_dim_default, family.head_dim_default
    found = fields.first(family.hidden_keys, POSITIVE_INTEGER)
    if found is None:
        raise ConfigError(fields.path(family.hidden_keys[0]), None,
                          f"is needed to derive the head dimension when {'/'.join(family.head_dim_keys)} is not given")
    hidden_key, hidden = found
    if hidden % heads:
        raise ConfigError(fields.path(hidden_key), hidden,
                          f"must be a positive multiple of {heads_key} ({heads}) when head_dim is not given")
    return hidden // heads, hidden // heads


def _kv_heads(fields: Fields, family: families.Family, heads_key: str, heads: int) -> int:
    found = fields.first(family.kv_heads_keys, POSITIVE_INTEGER)
    if fields.get("multi_query", BOOLEAN, family.multi_query_default):
        # Falcon and GPTBigCode: one K/V head unless Falcon's new decoder architecture counts them.
        if not (family.kv_heads_keys and fields.get("new_decoder_architecture", BOOLEAN, False)):
            return 1
    defaulted = found is None and family.kv_heads_default is not None
    if defaulted:  # transformers' config class gives its own default, not the query heads
        found = (family.kv_heads_keys[0], family.kv_heads_default)
    kv_heads = heads if found is None else found[1]
    if heads % kv_heads:
        key = found[0] if found else heads_key
        raise ConfigError(fields.path(key), kv_heads, f"must divide {heads_key} ({heads})"
                          + (" (transformers' default for this model_type: the file gives none)" if defaulted else ""))
    return kv_heads


def _given_layer_types(fields: Fields) -> tuple[str, tuple[str, ...]] | None:
    """(key, types) of the layer types the file lists, in transformers' current names; None if it lists none.
    layers_block_type is the name some hybrid config classes save layer_types under (attribute_map)."""
    found = fields.first(("layer_types", "layers_block_type"), NAMES)
    if found is None:
        return None
    return found[0], tuple(families.LEGACY_LAYER_TYPES.get(name, name) for name in found[1])


def _pattern_layer_types(fields: Fields) -> tuple[str, ...] | None:
    """Nemotron-H's layers from hybrid_override_pattern (one letter a layer), or None when not given."""
    pattern = fields.get("hybrid_override_pattern", TEXT)
    if pattern is None:
        return None
    unknown = sorted(set(pattern) - set(families.PATTERN_LAYER_TYPES))
    if unknown or not pattern:
        raise ConfigError(fields.path("hybrid_override_pattern"), pattern,
                          f"must be one letter a layer, each of {', '.join(families.PATTERN_LAYER_TYPES)}")
    return tuple(families.PATTERN_LAYER_TYPES[letter] for letter in pattern)


def _layer_count(fields: Fields, family: families.Family, keys: families.Keys) -> int:
    """The number of layers: the count key, or (a hybrid file that gives none) the length of its layer list."""
    found = fields.first(keys.layers, POSITIVE_INTEGER)
    if found is not None:
        return found[1]
    listed = _given_layer_types(fields)
    if listed is None and family.hybrid == families.HYBRID_PATTERN:
        listed = ("hybrid_override_pattern", _pattern_layer_types(fields))
    if listed is not None and listed[1]:
        return len(listed[1])
    return _count(fields, keys.layers, "layer count")[1]


def _hybrid_layer_types(fields: Fields, family: families.Family, layers: int) -> tuple[str, ...] | None:
    """Which layers of a hybrid model are softmax attention ("full_attention") and which are not
    ("linear_attention", ...), as its transformers config class places them (families.HYBRID_*)."""
    full, linear = "full_attention", "linear_attention"
    if family.hybrid == families.HYBRID_INTERVAL:
        every = fields.get("full_attention_interval", POSITIVE_INTEGER, 4)
        return tuple(linear if (i + 1) % every else full for i in range(layers))
    if family.hybrid == families.HYBRID_PERIOD:
        period = fields.get("attn_layer_period", POSITIVE_INTEGER, 8)
        offset = fields.get("attn_layer_offset", COUNT, 4)
        if offset >= period:
            raise ConfigError(fields.path("attn_layer_offset"), offset, f"must be below attn_layer_period ({period})")
        return tuple(full if i % period == offset else linear for i in range(layers))
    if family.hybrid == families.HYBRID_INDICES:
        indices = fields.data.get("attn_layer_indices") or []
        if not isinstance(indices, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
            raise ConfigError(fields.path("attn_layer_indices"), indices, "must be a list of layer indices")
        return tuple(full if i in indices else linear for i in range(layers))
    if family.hybrid == families.HYBRID_PATTERN:
        return _pattern_layer_types(fields) or (linear, "moe", full, "mlp")  # NemotronHConfig's default
    if family.hybrid == families.HYBRID_ALTERNATE:
        return tuple(full if (i + 1) % 2 else linear for i in range(layers))
    if family.hybrid == families.HYBRID_NONE:
        return (linear,) * layers
    return None


def _layer_types(fields: Fields, family: families.Family, layers: int, window: int | None) -> tuple[str, ...]:
    given = _given_layer_types(fields)
    if given is not None:
        key, types = given
        if len(types) != layers:
            raise ConfigError(fields.path(key), f"{len(types)} entries",
                              f"must give one type per layer (num_hidden_layers={layers})")
        return types
    hybrid = _hybrid_layer_types(fields, family, layers)
    if hybrid is not None:
        return hybrid
    if family.chunked_every is not None and _chunk_size(fields, family) is not None:
        # Llama 4: layers without RoPE (no_rope_layers[i] == 0) attend fully, the others in chunks.
        given_no_rope = fields.data.get("no_rope_layers") or [
            int((i + 1) % fields.get("no_rope_layer_interval", POSITIVE_INTEGER, family.chunked_every) != 0)
            for i in range(layers)]
        return tuple("chunked_attention" if rope else "full_attention" for rope in given_no_rope)
    if window is None:
        return ("full_attention",) * layers
    pattern = family.sliding_pattern
    if pattern == families.EVERY_OTHER:
        every = 2
    elif pattern == families.PATTERN_KEY:
        every = fields.get("sliding_window_pattern", POSITIVE_INTEGER, family.pattern_default)
    elif pattern == families.AFTER_MAX_WINDOW_LAYERS:
        first = fields.get("max_window_layers", COUNT, family.max_window_layers_default)
        return tuple("sliding_attention" if i >= first else "full_attention" for i in range(layers))
    elif pattern == families.ODD_BELOW_MAX_WINDOW_LAYERS:
        below = fields.get("max_window_layers", COUNT, family.max_window_layers_default)
        return tuple("sliding_attention" if i % 2 == 0 and i < below else "full_attention" for i in range(layers))
    else:
        return ("sliding_attention",) * layers
    # Every `every`-th layer (1-based) is full attention, as transformers' configs build layer_types.
    return tuple("sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers))


def _chunk_size(fields: Fields, family: families.Family) -> int | None:
    return fields.get("attention_chunk_size", POSITIVE_INTEGER, family.chunk_size_default)


def _window(fields: Fields, family: families.Family) -> int | None:
    if fields.get("use_sliding_window", BOOLEAN, family.use_sliding_window_default) is False:
        return None  # Qwen: the window is declared but switched off
    found = fields.data.get("sliding_window", family.sliding_window_default)
    if found is None:
        return None
    if isinstance(found, bool) or not isinstance(found, int) or found < 1:
        # transformers masks keys with kv > q - window: a window of 0 would let no query see any
        # key, so it is no model anyone runs; null is how a config says "no window".
        raise ConfigError(fields.path("sliding_window"), found,
                          "must be a positive integer, or null for no sliding window")
    return found


def _attn_scale(fields: Fields, family: families.Family, head_dim_qk: int) -> float | None:
    if family.scale_key:
        return float(fields.get(family.scale_key, POSITIVE_NUMBER, family.scale_default))
    scalar = fields.get("query_pre_attn_scalar", POSITIVE_NUMBER, family.query_pre_attn_scalar_default)
    if scalar is not None:
        return float(scalar) ** -0.5
    if family.unscaled:
        return 1.0  # T5 folds the scale into its weights
    rope = fields.data.get("rope_scaling") or fields.data.get("rope_parameters")
    if family.yarn_mscale and isinstance(rope, dict):
        # DeepSeek's YaRN: the softmax scale grows by mscale(factor, mscale_all_dim) squared.
        factor, all_dim = rope.get("factor"), rope.get("mscale_all_dim")
        if isinstance(factor, (int, float)) and isinstance(all_dim, (int, float)) and all_dim and factor > 1:
            mscale = 0.1 * all_dim * math.log(factor) + 1.0
            return head_dim_qk ** -0.5 * mscale * mscale
    return None


def _dropout(fields: Fields, family: families.Family) -> float:
    found = fields.first(family.dropout_keys, PROBABILITY)
    return float(found[1]) if found else 0.0


def _positions(fields: Fields, family: families.Family) -> int | None:
    found = fields.first(family.position_keys, POSITIVE_INTEGER)
    positions = family.positions_default if found is None else found[1]
    if positions is None or not family.positions_after_padding:
        return positions
    # RoBERTa's positions start after pad_token_id (transformers' default for the RoBERTa family: 1).
    return positions - (fields.get("pad_token_id", COUNT, 1) + 1)


def _image_tokens(fields: Fields, family: families.Family) -> int:
    image = fields.get("image_size", POSITIVE_INTEGER, family.image_size_default)
    patch = fields.get("patch_size", POSITIVE_INTEGER, family.patch_size_default)
    if image is None or patch is None:
        raise ConfigError(fields.path("image_size"), image, "and patch_size are needed for a vision encoder's length")
    if image % patch:
        raise ConfigError(fields.path("image_size"), image, f"must be a multiple of patch_size ({patch})")
    return (image // patch) ** 2 + (1 if family.class_token else 0)


def _causal(fields: Fields, family: families.Family, role: str) -> bool:
    if role != families.MODEL:
        return role == families.DECODER
    causal = family.causal or fields.get("is_decoder", BOOLEAN, False)
    return causal and fields.get("is_causal", BOOLEAN, True) and not _bidirectional(fields)


def _bidirectional(fields: Fields) -> bool:
    """Whether use_bidirectional_attention makes the text layers bidirectional: true, or Gemma 4's "all";
    its "vision" is bidirectional among image tokens only (an overlay on a causal mask)."""
    value = fields.data.get("use_bidirectional_attention")
    if isinstance(value, str):
        if value not in ("all", "vision"):
            raise ConfigError(fields.path("use_bidirectional_attention"), value, 'must be true, false, "all" or "vision"')
        return value == "all"
    return bool(fields.get("use_bidirectional_attention", BOOLEAN, False))


def _longest(fields: Fields, family: families.Family, keys: families.Keys) -> int | None:
    """The longest sequence the config says the stack takes, or None."""
    if family.vision:
        return _image_tokens(fields, family)
    if keys.positions:
        positions = fields.first(keys.positions, POSITIVE_INTEGER)
        return positions[1] if positions else keys.positions_default
    return _positions(fields, family)


def read_stack(fields: Fields, family: families.Family, prefix: str = "", role: str = families.MODEL) -> AttentionStack:
    """One stack of `fields`: a model's own layers (`role` MODEL), or one side of an
    encoder-decoder model (ENCODER / DECODER pick which keys are read)."""
    keys = family.keys_for(role)
    heads_key, heads = _count(fields, keys.heads, "attention head count")
    layers = _layer_count(fields, family, keys)
    head_dim_qk, head_dim_v = _head_dims(fields, family, heads_key, heads)
    causal = _causal(fields, family, role)
    window = _window(fields, family) if causal and role == families.MODEL else None
    longest = _longest(fields, family, keys)
    seqlen = min(longest or DEFAULT_REPORT_SEQLEN, DEFAULT_REPORT_SEQLEN)
    softcap = fields.get("attn_logit_softcapping", NON_NEGATIVE_NUMBER, family.softcap_default)
    alibi = family.alibi or fields.get("alibi", BOOLEAN, False)
    if not prefix and not causal:
        prefix = "encoder"
    return AttentionStack(
        prefix=prefix, heads_q=heads, heads_kv=_kv_heads(fields, family, heads_key, heads),
        head_dim_qk=head_dim_qk, head_dim_v=head_dim_v,
        layer_types=_layer_types(fields, family, layers, window) if role == families.MODEL
        else ("full_attention",) * layers,
        causal=causal, seqlen_q=seqlen, seqlen_kv=seqlen, sliding_window=window,
        chunk_size=_chunk_size(fields, family), dropout=_dropout(fields, family),
        attn_scale=_attn_scale(fields, family, head_dim_qk),
        bias="alibi" if alibi else "post_scale_bias" if family.relative_bias else "no_bias",
        bias_shape="1hss" if family.relative_bias and not alibi else None,
        sinks=family.sinks, softcap=float(softcap) if softcap else None, positions=longest,
        own_attention=family.own_attention,
    )


def _encoder_decoder(fields: Fields, family: families.Family) -> tuple[AttentionStack, ...]:
    encoder = read_stack(fields, family, "encoder", families.ENCODER)
    decoder = read_stack(fields, family, "decoder", families.DECODER)
    # Cross-attention: decoder queries over the encoder's keys; no mask, and no relative
    # position bias (T5 computes that only for self-attention).
    cross = replace(decoder, prefix="cross_attention", causal=False, seqlen_kv=encoder.seqlen_q, sliding_window=None,
                    layer_types=("full_attention",) * len(decoder.layer_types), bias="no_bias", bias_shape=None)
    return encoder, decoder, cross


def _dtype(fields: Fields, outer: Fields | None) -> tuple[str | None, tuple[str, ...]]:
    for source in (fields, outer):
        if source is None:
            continue
        found = source.first(("dtype", "torch_dtype"), TEXT)
        if found is None:
            continue
        key, value = found
        try:
            name = dtypes.parse(value, source.path(key))
        except ConfigError:
            return None, (f"{source.path(key)}={value!r} is not a dtype fused attention runs (fp16, bf16, fp8); "
                          "the problems are read at bf16 unless you set qkv_dtype",)
        return name, ()
    return None, ()


def _assumed_lengths(stacks: tuple[AttentionStack, ...], family: families.Family, model_type: str) -> list[str]:
    """The note for stacks whose config gives no length and whose family has no default: their length is assumed."""
    unknown = [stack.prefix or "the model's layers" for stack in stacks if stack.positions is None]
    if not unknown:
        return []
    keys = family.encoder_keys.positions if family.encoder_keys is not None else family.position_keys
    resolved = families.resolved_type(model_type)
    default = (f"transformers' {resolved} config sets no default for it" if resolved in families.FAMILIES
               else "this reader knows no default for its model_type")
    return [f"{', '.join(unknown)}: the config gives no maximum length ({' / '.join(keys)}) and {default}: "
            f"seqlen {DEFAULT_REPORT_SEQLEN} is assumed; --set seqlen_q=... --set seqlen_kv=... to ask another"]


def _not_attention(stacks: tuple[AttentionStack, ...]) -> list[str]:
    """The note for layers that are no softmax attention problem (Mamba, linear attention, ...): not answered."""
    notes = []
    for stack in stacks:
        others = Counter(kind for kind in stack.layer_types if kind not in ATTENTION_LAYER_TYPES)
        if others:
            kinds = ", ".join(f"{count} {kind}" for kind, count in others.items())
            where = stack.prefix or "the model's layers"
            notes.append(f"{where}: {sum(others.values())} of {len(stack.layer_types)} layers "
                         f"are no softmax attention ({kinds}) and are not answered; only its "
                         f"{' / '.join(ATTENTION_LAYER_TYPES)} layers are")
    return notes


def _chunked(stacks: tuple[AttentionStack, ...]) -> list[str]:
    """The note for chunked-attention layers (Llama 4): at which lengths the integration runs them fused."""
    notes = []
    for stack in stacks:
        count = stack.layer_types.count("chunked_attention")
        if count and stack.chunk_size is not None:
            size, where = stack.chunk_size, stack.prefix or "the model's layers"
            notes.append(f"{where}: {count} of {len(stack.layer_types)} "
                         f"layers are chunked attention (attention_chunk_size={size}): with fewer than {size} keys "
                         "every key is in its query's chunk, so they are causal attention and the integration runs "
                         f"them through attention() (a batch with padding, or a prefill that continues a cache: on torch "
                         f"SDPA); from {size} keys on they "
                         "run on torch SDPA with a dense mask")
    return notes


def _unknown_type(model_type: str, path: str) -> list[str]:
    """The note for a model_type no family names (read as a causal decoder with the common keys), or one read
    as another's architecture that transformers has no model of (its remote code runs it)."""
    if model_type in families.REMOTE_CODE:
        resolved = families.resolved_type(model_type)
        return [f"{path}={model_type!r} is read as {resolved!r}, the architecture it ships; transformers has no "
                f"{model_type} model, so it loads with trust_remote_code and runs the model's own attention code: "
                "check that attn_implementation='fusedattn' reaches its layers"]
    if model_type in families.FAMILIES:
        return []
    named = f"{path}={model_type!r} is not a model type this reader knows" if model_type else f"{path} is not given"
    return [f"{named}: it is read as a causal decoder with the common keys (num_attention_heads, "
            "num_key_value_heads, head_dim or hidden_size, max_position_embeddings); check its attention against "
            "the model's code"]


def read_model(data: dict[str, Any], source: str = "the config given") -> ModelReading:
    """The attention stacks of a config.json dict (see the module docstring); `source` names it in errors."""
    top = Fields(data, source=source)
    model_type = top.get("model_type", TEXT, "")
    text = top.nested("text_config")
    vision = top.nested("vision_config")
    notes: list[str] = []
    family = families.family(model_type)
    if family.unsupported:
        raise ConfigError(top.path("model_type"), model_type, family.unsupported)
    read_as = (family, model_type)  # the family and type that read the stacks, for the assumed-length note
    if family.encoder_decoder:
        stacks = _encoder_decoder(top, family)
    elif top.get("is_encoder_decoder", BOOLEAN, False):
        raise ConfigError(top.path("is_encoder_decoder"), True,
                          f"model_type {model_type!r}: this reader describes the encoder-decoder models "
                          f"{', '.join(families.ENCODER_DECODER_TYPES)} only; it cannot say which attention is which here")
    elif text is not None and top.first(("num_attention_heads", "n_head"), POSITIVE_INTEGER) is None:
        text_type = families.resolved_type(text.get("model_type", TEXT, ""), inside=model_type)
        read_as = (families.family(text_type), text_type)
        stacks = (read_stack(text, read_as[0]),)
        notes += _unknown_type(text_type, text.path("model_type"))
    else:
        stacks = (read_stack(top, family),)
        remote = model_type if model_type in families.REMOTE_CODE else families.resolved_type(model_type)
        notes += _unknown_type(remote, top.path("model_type"))
    notes += _assumed_lengths(stacks, *read_as)
    if vision is not None and not family.encoder_decoder:
        vision_type = vision.get("model_type", TEXT, "")
        vision_family = families.family(vision_type, inside=model_type, vision=True)
        if vision_family.vision:
            stacks += (read_stack(vision, vision_family, "vision"),)
        else:
            notes.append(f"vision_config (model_type {vision_type!r}) is not described: only the text model is read")
    notes += _not_attention(stacks) + _chunked(stacks)
    dtype, dtype_notes = _dtype(text if text is not None else top, top if text is not None else None)
    return ModelReading(model_type, stacks, dtype, tuple(notes) + dtype_notes)
