"""How each model family spells its attention in config.json, as data.

Source: the config classes of transformers (`models/<family>/configuration_<family>.py`, read at
5.x): the key names each reads (GPT-2's n_head through its attribute_map, Whisper's
encoder_attention_heads), the default each gives a key that config.json leaves out (Mistral's
sliding_window 4096, Gemma 2's attn_logit_softcapping 50, Llama's max_position_embeddings 2048, Whisper's
1500 encoder and 448 decoder positions), and how `__post_init__` builds `layer_types` when the file has
none. The reader uses these defaults so that a file read as JSON and the same file loaded by
transformers give the same problems.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# Roles of an attention stack: a model's own layers, or one side of an encoder-decoder model.
MODEL, ENCODER, DECODER = "model", "encoder", "decoder"
# How layers alternate when config.json has no layer_types (transformers' __post_init__).
ALL_LAYERS, EVERY_OTHER, PATTERN_KEY, AFTER_MAX_WINDOW_LAYERS = "all", "every_other", "pattern", "after_max"
ODD_BELOW_MAX_WINDOW_LAYERS = "odd_below_max"  # Qwen2-MoE: layers 1, 3, 5, ... (1-based) below max_window_layers
# How a hybrid model (softmax attention between Mamba / linear-attention layers) says which layers attend when
# config.json has no layer_types, as its transformers config class builds them: every n-th layer
# (full_attention_interval, Qwen3-Next), layer i with i % attn_layer_period == attn_layer_offset (Jamba), the
# layers attn_layer_indices lists (Bamba), the "*" of hybrid_override_pattern (Nemotron-H), every other layer
# (MiniMax), or none (GraniteMoeHybrid: its files list layer_types).
HYBRID_INTERVAL, HYBRID_PERIOD, HYBRID_INDICES = "interval", "period", "indices"
HYBRID_PATTERN, HYBRID_ALTERNATE, HYBRID_NONE = "pattern", "alternate", "none"
# Layer type names older files use, as transformers reads them (configuration_utils._LEGACY_LAYER_TYPE_REMAP).
LEGACY_LAYER_TYPES = {"attention": "full_attention", "mamba": "linear_attention",
                      "deepseek_sparse_attention": "indexed_attention", "qwen_sparse_attention": "indexed_attention"}
# Nemotron-H's hybrid_override_pattern letters (NemotronHConfig._pattern_to_list).
PATTERN_LAYER_TYPES = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}


@dataclass(frozen=True)
class Keys:
    """The keys one stack's head count, layer count and length are read from, first found wins."""

    heads: tuple[str, ...]
    layers: tuple[str, ...]
    positions: tuple[str, ...] = ()
    positions_default: int | None = None  # transformers' default for the first of `positions`


@dataclass(frozen=True)
class Family:
    """How one model_type's config.json describes its attention (see the module docstring)."""

    keys: Keys = field(default_factory=lambda: Keys(("num_attention_heads", "n_head", "num_heads"),
                                                    ("num_hidden_layers", "n_layer", "num_layers")))
    encoder_keys: Keys | None = None
    decoder_keys: Keys | None = None
    hidden_keys: tuple[str, ...] = ("hidden_size", "n_embd", "n_embed", "d_model")
    head_dim_keys: tuple[str, ...] = ("head_dim",)
    head_dim_default: int | None = None
    kv_heads_keys: tuple[str, ...] = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
    # transformers' num_key_value_heads default where it is GQA (None: the query heads; Qwen2's 32 = its 32 heads)
    kv_heads_default: int | None = None
    multi_query_default: bool = False
    dropout_keys: tuple[str, ...] = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")
    position_keys: tuple[str, ...] = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")
    # transformers' default max_position_embeddings (None: its config class has none, e.g. BLOOM's ALiBi)
    positions_default: int | None = None
    positions_after_padding: bool = False  # RoBERTa: positions start after pad_token_id
    causal: bool = True
    sliding_pattern: str = ALL_LAYERS
    pattern_default: int | None = None
    max_window_layers_default: int | None = None
    use_sliding_window_default: bool | None = None
    sliding_window_default: int | None = None
    chunked_every: int | None = None  # Llama 4: every n-th layer full, the rest chunked
    hybrid: str = ""  # HYBRID_*: how the attention layers of a hybrid model are placed without layer_types
    chunk_size_default: int | None = None
    query_pre_attn_scalar_default: float | None = None
    # Granite: the softmax scale is config.attention_multiplier (default 1.0), not 1/sqrt(head_dim).
    scale_key: str = ""
    scale_default: float | None = None
    softcap_default: float | None = None
    unscaled: bool = False  # T5: no 1/sqrt(d) on the scores
    yarn_mscale: bool = False  # DeepSeek: YaRN's mscale_all_dim scales the softmax
    alibi: bool = False
    relative_bias: bool = False  # T5: a learned (1, h, s, s) bias added to the scores
    sinks: bool = False
    vision: bool = False
    image_size_default: int | None = None
    patch_size_default: int | None = None
    class_token: bool = False
    encoder_decoder: bool = False
    unsupported: str = ""
    # transformers (5.x) runs the layers' attention in the model's own code, not through its attention
    # interface (whose functions "fusedattn" registers), while the model still makes its masks through it.
    own_attention: bool = False

    def keys_for(self, role: str) -> Keys:
        """The keys of the stack playing `role`."""
        if role == ENCODER and self.encoder_keys is not None:
            return self.encoder_keys
        if role == DECODER and self.decoder_keys is not None:
            return self.decoder_keys
        return self.keys


GENERIC = Family()
_ENCODER = Family(causal=False, positions_default=512)
_VISION = Family(causal=False, vision=True, class_token=True, image_size_default=224)
_QWEN = Family(sliding_pattern=AFTER_MAX_WINDOW_LAYERS, max_window_layers_default=28,
               use_sliding_window_default=False, sliding_window_default=4096, positions_default=32768)
# T5's positions are relative (a learned bias by distance bucket): its config gives no length unless an older
# file holds n_positions, and transformers' T5Config has no default for one.
_T5_KEYS = dict(
    encoder_keys=Keys(("num_heads",), ("num_layers",), ("n_positions",)),
    decoder_keys=Keys(("num_heads",), ("num_decoder_layers", "num_layers"), ("n_positions",)),
    head_dim_keys=("d_kv",), dropout_keys=("dropout_rate",), kv_heads_keys=(),
)

FAMILIES: dict[str, Family] = {
    # Causal decoders read with the common keys alone: named, so that a model_type listed nowhere is said to be
    # read as one of them (model_reading.read_model).
    # (positions_default: transformers' max_position_embeddings default for each, read at 5.24)
    **{name: replace(GENERIC, positions_default=positions) for name, positions in (
        ("llama", 2048), ("phi", 2048), ("phi3", 4096), ("gpt_neox", 2048), ("opt", 2048),
        ("clip_text_model", 77))},
    "mixtral": replace(GENERIC, kv_heads_default=8, positions_default=131072),
    "gpt2": replace(GENERIC, positions_default=1024),
    "gpt_bigcode": replace(GENERIC, multi_query_default=True, positions_default=1024),
    "gptj": replace(GENERIC, positions_default=2048),
    "falcon": replace(GENERIC, multi_query_default=True, positions_default=2048, own_attention=True),
    "bloom": replace(GENERIC, alibi=True, own_attention=True),  # ALiBi: no length in its config
    "mistral": replace(GENERIC, sliding_window_default=4096, kv_heads_default=8, positions_default=131072),
    "gemma": replace(GENERIC, head_dim_default=256, positions_default=8192),
    "gemma2": replace(GENERIC, sliding_pattern=EVERY_OTHER, sliding_window_default=4096, head_dim_default=256,
                      kv_heads_default=4, query_pre_attn_scalar_default=256, softcap_default=50.0,
                      positions_default=8192),
    "gemma3_text": replace(GENERIC, sliding_pattern=PATTERN_KEY, pattern_default=6, sliding_window_default=4096,
                           head_dim_default=256, kv_heads_default=4, query_pre_attn_scalar_default=256,
                           positions_default=131072),
    "gpt_oss": replace(GENERIC, sliding_pattern=EVERY_OTHER, sliding_window_default=128, sinks=True,
                       head_dim_default=64, kv_heads_default=8, positions_default=131072),
    "llama4_text": replace(GENERIC, chunked_every=4, chunk_size_default=8192, head_dim_default=128,
                           kv_heads_default=8, positions_default=131072),
    "cohere2": replace(GENERIC, sliding_pattern=PATTERN_KEY, pattern_default=4, sliding_window_default=4096,
                       positions_default=8192),
    **{name: replace(GENERIC, scale_key="attention_multiplier", scale_default=1.0, positions_default=2048)
       for name in ("granite", "granitemoe", "granitemoeshared")},
    "granitemoehybrid": replace(GENERIC, scale_key="attention_multiplier", scale_default=1.0, positions_default=2048,
                                hybrid=HYBRID_NONE),
    "qwen3_next": replace(GENERIC, hybrid=HYBRID_INTERVAL, head_dim_default=256, kv_heads_default=2,
                          positions_default=32768),
    "qwen3_5_text": replace(GENERIC, hybrid=HYBRID_INTERVAL, head_dim_default=256, kv_heads_default=4,
                            positions_default=32768),
    "qwen3_5_moe_text": replace(GENERIC, hybrid=HYBRID_INTERVAL, head_dim_default=256, kv_heads_default=2,
                                positions_default=32768),
    "jamba": replace(GENERIC, hybrid=HYBRID_PERIOD, kv_heads_default=8, positions_default=262144),
    "bamba": replace(GENERIC, hybrid=HYBRID_INDICES, kv_heads_default=8, positions_default=262144),
    "nemotron_h": replace(GENERIC, hybrid=HYBRID_PATTERN, head_dim_default=128, kv_heads_default=8,
                          positions_default=4096),
    "minimax": replace(GENERIC, hybrid=HYBRID_ALTERNATE, kv_heads_default=8, positions_default=131072),
    "qwen2": _QWEN,
    # Qwen2-MoE builds layer_types its own way; Qwen3-MoE has none: its window applies to every layer.
    "qwen2_moe": replace(_QWEN, sliding_pattern=ODD_BELOW_MAX_WINDOW_LAYERS),
    "qwen3": replace(_QWEN, head_dim_default=128),
    "qwen3_moe": replace(_QWEN, sliding_pattern=ALL_LAYERS, max_window_layers_default=None, kv_heads_default=4),
    "deepseek_v2": replace(GENERIC, yarn_mscale=True, positions_default=2048),
    "deepseek_v3": replace(GENERIC, yarn_mscale=True, positions_default=4096),
    "bert": _ENCODER,
    "roberta": replace(_ENCODER, positions_after_padding=True),
    "xlm-roberta": replace(_ENCODER, positions_after_padding=True),
    "camembert": replace(_ENCODER, positions_after_padding=True),
    "electra": _ENCODER,
    "vit": replace(_VISION, patch_size_default=16),
    "clip_vision_model": replace(_VISION, patch_size_default=32),
    "t5": replace(GENERIC, encoder_decoder=True, unscaled=True, relative_bias=True, **_T5_KEYS),
    "mt5": replace(GENERIC, encoder_decoder=True, unscaled=True, relative_bias=True, **_T5_KEYS),
    "whisper": replace(
        GENERIC, encoder_decoder=True,
        encoder_keys=Keys(("encoder_attention_heads",), ("encoder_layers",), ("max_source_positions",), 1500),
        decoder_keys=Keys(("decoder_attention_heads",), ("decoder_layers",), ("max_target_positions",), 448),
        kv_heads_keys=(),
    ),
}
ENCODER_DECODER_TYPES = tuple(name for name, family in FAMILIES.items() if family.encoder_decoder)
# The model_type of a nested config that names none, by the model_type around it.
_INNER_TYPES = {("clip", "text"): "clip_text_model", ("clip", "vision"): "clip_vision_model",
                ("gemma3", "text"): "gemma3_text", ("llama4", "text"): "llama4_text",
                ("qwen3_5", "text"): "qwen3_5_text", ("qwen3_5_moe", "text"): "qwen3_5_moe_text",
                ("kimi_k25", "text"): "deepseek_v3"}
# model_types read as another's family: a Gemma 3 text config read directly; Kimi-K2 ships DeepSeek-V3's
# architecture (DeepseekV3ForCausalLM) under its own model_type, which transformers' Kimi-K2.5 config reads as
# deepseek_v3 (Kimi_K25Config.__post_init__), as Moonshot's deploy guide says to do for other frameworks.
_SAME_AS = {"gemma3": "gemma3_text", "kimi_k2": "deepseek_v3"}
# Of those, the ones transformers has no model class for: they load with trust_remote_code, the model's own code.
REMOTE_CODE = frozenset({"kimi_k2"})


def resolved_type(model_type: str, inside: str = "", vision: bool = False) -> str:
    """The model_type whose family reads a config: `model_type`, or for a nested config without one,
    the one its outer model_type implies."""
    if not model_type and inside:
        model_type = _INNER_TYPES.get((inside, "vision" if vision else "text"), "")
    return _SAME_AS.get(model_type, model_type)


def family(model_type: str, inside: str = "", vision: bool = False) -> Family:
    """The family of `model_type` (see `resolved_type`); GENERIC for one not listed: the common keys, causal."""
    return FAMILIES.get(resolved_type(model_type, inside, vision), GENERIC)
