"""The problems `why` answers: entries of a config file, a problem built from `--set` pairs, or
the distinct layer problems of a Hugging Face model config."""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import yaml

from fusedattn_select.config import AttnConfig
from fusedattn_select.config_files import NamedConfig, load_config_file
from fusedattn_select.errors import ConfigError
from fusedattn_select.integrations.transformers import layer_problems
from fusedattn_select.integrations.transformers.report import layer_ranges

# A problem and the reasons the transformers integration cannot run it fused whatever cuDNN
# says (e.g. soft-capping); no reasons for a problem that is not a model layer.
Problem = tuple[NamedConfig, tuple[str, ...]]


def parse_sets(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs; values are YAML (`[128,0]`, `false`, `null`), numbers also as `1e-3`."""
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("--set", pair, "must be key=value, e.g. --set head_dim_qk=128")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(key, text, f"is not a YAML value ({str(err).splitlines()[0]})") from None
        if isinstance(value, str):
            # YAML 1.1 reads 1e-3 as a string; the user meant a number.
            with contextlib.suppress(ValueError):
                value = float(value)
        values[key] = value
    return values


def problems(config: str | None, name: str | None, hf_config: str | None, sets: Sequence[str]) -> list[Problem]:
    """The problems to answer: from `config` (only its entry `name`, when given) or `hf_config`,
    with the `--set` pairs `sets` applied on top; from `sets` alone when neither is given."""
    if hf_config is None:
        return [(entry, ()) for entry in _config_entries(config, name, parse_sets(sets))]
    if config is not None:
        raise ConfigError("--hf-config", hf_config, "give either CONFIG.yaml or --hf-config, not both")
    if name is not None:
        raise ConfigError("--name", name, "selects an entry of a CONFIG file, not of --hf-config")
    return _hf_problems(hf_config, parse_sets(sets))


def _config_entries(config: str | None, name: str | None, sets: dict[str, Any]) -> list[NamedConfig]:
    if config is None:
        if name is not None:
            raise ConfigError("--name", name, "selects an entry of a CONFIG file; none was given")
        if not sets:
            raise ConfigError("why", None, "give a CONFIG.yaml file or --set key=value pairs")
        return [NamedConfig("--set", AttnConfig.from_dict(sets))]
    config_file = load_config_file(config)
    chosen = [config_file.get(name)] if name is not None else list(config_file.entries)
    if not sets:
        return chosen
    entries = []
    for entry in chosen:
        try:
            cfg = AttnConfig.from_dict({**entry.config.to_dict(), **sets})
        except ConfigError as err:
            raise ConfigError(f"{config}: {entry.name}: {err.field}", err.value, err.allowed) from None
        entries.append(NamedConfig(entry.name, cfg, entry.source))
    return entries


def _hf_problems(source: str, sets: dict[str, Any]) -> list[Problem]:
    """One problem per distinct attention layer problem of a Hugging Face model config."""
    # Shape, pass and dtype shape the layer problems themselves (a sliding window only applies
    # when the sequence is longer than it), so they go in before the problems are derived; the
    # dtype, when not set, is layer_problems' default.
    sets = dict(sets)
    seqlen = sets.get("seqlen_kv", sets.get("seqlen_q"))
    derive: dict[str, Any] = {
        "batch_size": sets.pop("batch_size", 1),
        "seqlen": seqlen if isinstance(seqlen, int) and not isinstance(seqlen, bool) else None,
        "is_training": sets.pop("is_training", True),
    }
    if "qkv_dtype" in sets:
        derive["dtype"] = sets.pop("qkv_dtype")
    entries = []
    for name, cfg, layers, notes in layer_problems(source, **derive):
        if sets:
            cfg = AttnConfig.from_dict({**cfg.to_dict(), **sets})
        entries.append((NamedConfig(f"{name} (layers {layer_ranges(layers)})", cfg, source), notes))
    return entries

