"""The distinct attention problems of a Hugging Face model config, as `AttnConfig`s.

Reads a PretrainedConfig, a model, a path to config.json (or its directory), a JSON string or a
dict; needs neither torch nor transformers for the last three (transformers, when installed,
derives the fields a config's __init__ computes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import numbers
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple

from fusedattn_select import dtypes
from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError, short_text
from fusedattn_select.integrations.transformers.masks import cudnn_window

# Model types whose every attention layer has learnable sinks (transformers has no config flag).
SINK_MODEL_TYPES = frozenset({"gpt_oss"})
# Softmax-attention layer types of transformers' `config.layer_types`; others (mamba, conv,
# linear_attention, ...) are not attention problems and are left out of the report.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
DEFAULT_REPORT_SEQLEN = 4096

# The fields of a model config this module reads, and what each must hold when present (None
# or absent means "not given"): a bad value is a ConfigError naming the field, never a traceback
# from arithmetic on it.
POSITIVE_INTEGER, COUNT, POSITIVE_NUMBER, NON_NEGATIVE_NUMBER, PROBABILITY, BOOLEAN, NAMES = (
    "must be a positive integer", "must be a non-negative integer", "must be a positive finite number",
    "must be a non-negative finite number", "must be a number in [0, 1)", "must be true or false",
    "must be a list of layer type names (strings)",
)
FIELD_RULES: dict[str, str] = {
    "num_attention_heads": POSITIVE_INTEGER, "num_hidden_layers": POSITIVE_INTEGER,
    "num_key_value_heads": POSITIVE_INTEGER, "hidden_size": POSITIVE_INTEGER, "head_dim": POSITIVE_INTEGER,
    "qk_nope_head_dim": COUNT, "qk_rope_head_dim": POSITIVE_INTEGER, "v_head_dim": POSITIVE_INTEGER,
    "max_position_embeddings": POSITIVE_INTEGER, "sliding_window": POSITIVE_INTEGER,
    "attention_chunk_size": POSITIVE_INTEGER, "query_pre_attn_scalar": POSITIVE_NUMBER,
    "attn_logit_softcapping": NON_NEGATIVE_NUMBER, "attention_dropout": PROBABILITY,
    "is_causal": BOOLEAN, "use_bidirectional_attention": BOOLEAN, "use_sliding_window": BOOLEAN,
    "layer_types": NAMES,
}


def _follows(rule: str, value: Any) -> bool:
    if rule == BOOLEAN:
        return isinstance(value, bool)
    if rule == NAMES:
        return isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    if rule in (POSITIVE_INTEGER, COUNT):
        return isinstance(value, numbers.Integral) and value >= (1 if rule == POSITIVE_INTEGER else 0)
    if not math.isfinite(value):
        return False
    return value > 0 if rule == POSITIVE_NUMBER else value >= 0 if rule == NON_NEGATIVE_NUMBER else value < 1


def _check_fields(read: Any, where: str) -> None:
    """ConfigError naming the first field (`where`.field) `read(field)` returns that breaks its rule."""
    for name, rule in FIELD_RULES.items():
        value = read(name)
        if value is not None and not _follows(rule, value):
            raise ConfigError(f"{where}.{name}", value, rule)


class ConfigView:
    """Attribute access over a PretrainedConfig or a plain dict; None reads as missing."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def get(self, name: str, default: Any = None) -> Any:
        if isinstance(self._source, Mapping):
            value = self._source.get(name, default)
        else:
            value = getattr(self._source, name, default)
        return default if value is None else value


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


class _ModelFacts(NamedTuple):
    """What every attention layer of a model shares."""

    heads_q: int
    heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    attn_scale: float | None
    causal: bool
    sinks: bool
    softcap: float | None


def _json_source(text: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError("hf_config", text[:60], f"is neither a config.json path nor JSON ({err.msg})") from None
    except (ValueError, RecursionError) as err:  # an integer of thousands of digits; nesting too deep
        raise ConfigError("hf_config", text[:60], f"is JSON this reader cannot hold ({short_text(str(err))})") from None
    if not isinstance(data, dict):
        raise ConfigError("hf_config", text[:60], "must be a JSON object")
    return data


def _as_dict_source(source: Any) -> Any:
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        path = Path(source)
        try:
            if path.is_dir():
                path = path / "config.json"
            found = path.is_file()
        except OSError as err:  # a name too long, a directory that cannot be searched
            raise ConfigError("hf_config", str(source), f"cannot be read ({err.strerror or err})") from None
        if not found:
            raise ConfigError("hf_config", str(source), "no such config.json file or directory")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError("hf_config", str(source), f"cannot be read ({getattr(err, 'strerror', None) or err})") from None
        return _json_source(text)
    if isinstance(source, str):
        return _json_source(source)
    return source


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


@contextlib.contextmanager
def _quiet_first_import() -> Iterator[None]:
    """Silence what transformers says while it is first imported: without torch it logs "PyTorch
    was not found. Models won't be available ..." at import, which is noise when only its config
    classes are used here. Errors still show; nothing is silenced once it is imported."""
    if "transformers" in sys.modules:
        yield
        return
    quiet = _BelowError()
    logger = logging.getLogger("transformers")
    logger.addFilter(quiet)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.removeFilter(quiet)


def hf_config(source: Any) -> ConfigView:
    """A view of the text-model config from any accepted source; ConfigError naming the field
    when one this module reads holds a value it cannot be (FIELD_RULES)."""
    source = _as_dict_source(source)
    if isinstance(source, Mapping):
        # Checked before transformers sees them: its config classes divide by them at __init__.
        _check_fields(source.get, "hf_config")
        if isinstance(source.get("text_config"), Mapping):
            _check_fields(source["text_config"].get, "hf_config.text_config")
        try:
            # transformers derives fields in __init__ (layer_types, per-layer sliding windows);
            # it is an optional dependency.
            with _quiet_first_import():
                from transformers import AutoConfig
            source = AutoConfig.for_model(**source)
        except (ImportError, ValueError, KeyError, TypeError):
            # No transformers, or a model type it does not know: read the dict as it is.
            source = dict(source.get("text_config") or source) if "num_attention_heads" not in source else source
        except Exception as err:  # noqa: BLE001 - transformers' own checks of fields this module never reads
            raise ConfigError("hf_config", source.get("model_type"), "transformers cannot build this config: "
                              + short_text(f"{type(err).__name__}: {' '.join(str(err).split())}")) from None
    if not isinstance(source, Mapping):
        if hasattr(source, "config") and not hasattr(source, "num_attention_heads"):
            source = source.config  # a model
        if hasattr(source, "get_text_config"):
            source = source.get_text_config()
    view = ConfigView(source)
    if view.get("num_attention_heads") is None or view.get("num_hidden_layers") is None:
        raise ConfigError(
            "hf_config", type(source).__name__,
            "has no num_attention_heads / num_hidden_layers (not a transformer language-model config)",
        )
    _check_fields(view.get, "hf_config")  # what transformers derived, or a config object as given
    return view


def _layer_types(view: ConfigView) -> list[str]:
    types = view.get("layer_types")
    layers = int(view.get("num_hidden_layers"))
    if types:
        return list(types)
    sliding = view.get("sliding_window") is not None and view.get("use_sliding_window", True) is not False
    return ["sliding_attention" if sliding else "full_attention"] * layers


def _model_facts(view: ConfigView) -> _ModelFacts:
    heads_q = int(view.get("num_attention_heads"))  # checked by hf_config (FIELD_RULES)
    heads_kv = int(view.get("num_key_value_heads", heads_q))
    if heads_q % heads_kv:
        raise ConfigError("hf_config.num_key_value_heads", heads_kv,
                          f"must divide num_attention_heads ({heads_q})")
    if view.get("qk_rope_head_dim") is not None and view.get("v_head_dim") is not None:
        # Multi-head latent attention (DeepSeek): Q/K carry a no-position and a rotary part.
        head_dim_qk = int(view.get("qk_nope_head_dim", 0)) + int(view.get("qk_rope_head_dim"))
        head_dim_v = int(view.get("v_head_dim"))
    elif view.get("head_dim") is not None:
        head_dim_qk = head_dim_v = int(view.get("head_dim"))
    else:
        hidden = view.get("hidden_size")
        if hidden is None or hidden % heads_q:
            raise ConfigError("hf_config.hidden_size", hidden, "must be a positive multiple of num_attention_heads "
                              f"({heads_q}) when head_dim is not given")
        head_dim_qk = head_dim_v = int(hidden) // heads_q
    scalar = view.get("query_pre_attn_scalar")
    softcap = view.get("attn_logit_softcapping")
    return _ModelFacts(
        heads_q, heads_kv, head_dim_qk, head_dim_v,
        attn_scale=float(scalar) ** -0.5 if scalar is not None else None,
        causal=view.get("is_causal", True) is not False and not view.get("use_bidirectional_attention", False),
        sinks=view.get("model_type") in SINK_MODEL_TYPES,
        softcap=float(softcap) if softcap else None,
    )


def _integration_reasons(view: ConfigView, layer_type: str, softcap: float | None) -> tuple[str, ...]:
    """Why this integration runs a layer outside cuDNN whatever cuDNN answers for its problem."""
    reasons: list[str] = []
    if softcap:
        reasons.append(
            f"attn_logit_softcapping={softcap:g}: cuDNN has no logit soft-capping; runs on the float32 reference"
        )
    if layer_type == "chunked_attention":
        reasons.append(
            f"chunked attention (attention_chunk_size={view.get('attention_chunk_size')}) has no cuDNN "
            "mask; runs on torch SDPA with a dense mask"
        )
    return tuple(reasons)


def model_problems(view: ConfigView, batch_size: int, seqlen: int | None, is_training: bool,
                   dtype: Any) -> list[LayerProblem]:
    """The model's distinct attention problems, in the order of their first layer."""
    facts = _model_facts(view)
    if seqlen is None:
        seqlen = min(int(view.get("max_position_embeddings", DEFAULT_REPORT_SEQLEN)), DEFAULT_REPORT_SEQLEN)
    dropout = float(view.get("attention_dropout", 0.0)) if is_training else 0.0
    qkv_dtype = dtypes.parse(dtype)

    groups: dict[tuple, LayerProblem] = {}
    for index, layer_type in enumerate(_layer_types(view)):
        if layer_type not in ATTENTION_LAYER_TYPES:
            continue
        window = view.get("sliding_window") if layer_type == "sliding_attention" else None
        window = int(window) if window is not None else None
        config = AttnConfig(
            batch_size=batch_size, num_heads_q=facts.heads_q, num_heads_kv=facts.heads_kv, seqlen_q=seqlen,
            seqlen_kv=seqlen, head_dim_qk=facts.head_dim_qk, head_dim_v=facts.head_dim_v, qkv_dtype=qkv_dtype,
            mask="causal" if facts.causal else "no_mask",
            window_size=cudnn_window(window, seqlen) if facts.causal else (-1, -1),
            softmax="learnable" if facts.sinks else "vanilla", dropout=dropout, attn_scale=facts.attn_scale,
            is_training=is_training,
        )
        name = layer_type + ("+sinks" if facts.sinks else "") + ("+softcap" if facts.softcap else "")
        key = (name, config, window)
        if key not in groups:
            groups[key] = LayerProblem(
                name, layer_type, config, [], window, facts.softcap, facts.sinks,
                _integration_reasons(view, layer_type, facts.softcap),
            )
        groups[key].layers.append(index)
    return list(groups.values())


def layer_problems(
    config: Any, *, batch_size: int = 1, seqlen: int | None = None, is_training: bool = True, dtype: Any = "bf16",
) -> list[tuple[str, AttnConfig, list[int], tuple[str, ...]]]:
    """Like `configs_from_hf`, plus the reasons this integration cannot run a layer fused at all
    (soft-capping, chunked attention) whatever cuDNN answers for its AttnConfig."""
    view = hf_config(config)
    return [
        (p.name, p.config, list(p.layers), tuple(p.integration_reasons))
        for p in model_problems(view, batch_size, seqlen, is_training, dtype)
    ]


def configs_from_hf(
    config: Any, *, batch_size: int = 1, seqlen: int | None = None, is_training: bool = True, dtype: Any = "bf16",
) -> list[tuple[str, AttnConfig, list[int]]]:
    """The distinct attention problems of a Hugging Face model config: (layer name, problem, layers).

    `config` is a PretrainedConfig, a model, a path to config.json (or its directory), a JSON
    string or a dict. `seqlen` defaults to min(max_position_embeddings, 4096). Layer names are
    the config's layer type plus "+sinks" / "+softcap" where they apply.
    """
    view = hf_config(config)
    return [(p.name, p.config, list(p.layers)) for p in model_problems(view, batch_size, seqlen, is_training, dtype)]
