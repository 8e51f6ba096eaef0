"""The problems `why` answers: entries of config files, a problem built from `--set` pairs, or
the distinct layer problems of a Hugging Face model config."""

from __future__ import annotations

import re
import sys
from typing import Any, NamedTuple, Sequence

import yaml

from fusedattn_select.config import AttnConfig, allowed, choice_message, did_you_mean, is_size
from fusedattn_select.config_files import NAMES_SHOWN, NamedConfig, load_config_file, load_yaml, yaml_error
from fusedattn_select.dtypes import DTYPES
from fusedattn_select.errors import ConfigError, FusedAttnSelectError
from fusedattn_select.integrations.transformers.config_json import source_name
from fusedattn_select.integrations.transformers.problems import hf_config, model_problems
from fusedattn_select.integrations.transformers.report import layer_ranges

# A problem and the reasons the transformers integration cannot run it fused whatever cuDNN
# says (e.g. soft-capping); no reasons for a problem that is not a model layer.
Problem = tuple[NamedConfig, tuple[str, ...]]


class Asked(NamedTuple):
    """The problems to answer, and what the reader of a model config says about its reading."""

    problems: list[Problem]
    notes: tuple[str, ...] = ()

NOTHING_TO_ANSWER = (
    "nothing to answer: give CONFIG.yaml files, --hf-config PATH_OR_JSON, or --set key=value pairs "
    "(e.g. why configs/llama-3-8b.yaml, or why --set batch_size=2 --set num_heads_q=32 --set num_heads_kv=8 "
    "--set seqlen_q=4096 --set seqlen_kv=4096 --set head_dim_qk=128)"
)


class UsageError(FusedAttnSelectError, ValueError):
    """A command was given nothing to work on; the message says what to give."""


# A number in decimal or exponent notation, as typed (not "nan", "inf" or "1_0", which float() also reads).
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def parse_sets(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs; values are YAML (`[128,0]`, `false`, `null`), numbers also as `1e-3`."""
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("--set", pair, "must be key=value, e.g. --set head_dim_qk=128")
        if key in values:  # the later value wins (base pairs, then overrides), said so
            print(f"warning: --set {pair} replaces {key}={values[key]!r} given before it", file=sys.stderr)
        try:
            value = load_yaml(text, key, text)
        except yaml.YAMLError as err:
            raise ConfigError(key, text, f"is not a YAML value ({yaml_error(err)})") from None
        if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-3 as a string; the user meant a number
        values[key] = value
    return values


def problems(configs: str | Sequence[str] | None, name: str | None, hf_config: str | None,
             sets: Sequence[str]) -> Asked:
    """The problems to answer: the entries of the `configs` files (only those named `name`, when
    given) or of `hf_config`, with the `--set` pairs `sets` applied on top; from `sets` alone
    when neither is given. UsageError when nothing is given."""
    paths = [configs] if isinstance(configs, str) else list(configs or ())
    if hf_config is None:
        return Asked([(entry, ()) for entry in _config_entries(paths, name, parse_sets(sets))])
    if paths:
        raise ConfigError("--hf-config", hf_config, "give either CONFIG.yaml files or --hf-config, not both")
    if name is not None:
        raise ConfigError("--name", name, "selects an entry of a CONFIG file, not of --hf-config")
    return _hf_problems(hf_config, parse_sets(sets))


def _config_entries(paths: list[str], name: str | None, sets: dict[str, Any]) -> list[NamedConfig]:
    if not paths:
        if name is not None:
            raise ConfigError("--name", name, "selects an entry of a CONFIG file; none was given")
        if not sets:
            raise UsageError(f"why: {NOTHING_TO_ANSWER}")
        return [NamedConfig("--set", AttnConfig.from_dict(sets))]
    entries = []
    for path, entry in _chosen_entries(paths, name):
        if sets:
            try:
                cfg = AttnConfig.from_dict({**entry.config.to_dict(), **sets})
            except ConfigError as err:
                raise ConfigError(f"{path}: {entry.name}: {err.field}", err.value, err.allowed) from None
            entry = NamedConfig(entry.name, cfg, entry.source)
        entries.append(entry)
    return entries


def _chosen_entries(paths: list[str], name: str | None) -> list[tuple[str, NamedConfig]]:
    """(path, entry) of every file's entries, or only those named `name` (in any of the files).
    With several files an entry is named "<file name>/<entry>", as `warmup` names it."""
    files = [(path, load_config_file(path)) for path in paths]
    chosen = []
    for path, config_file in files:
        for entry in config_file.entries:
            if name is not None and entry.name != name:
                continue
            if len(files) > 1:
                entry = NamedConfig(f"{config_file.name}/{entry.name}", entry.config, entry.source)
            chosen.append((path, entry))
    if not chosen:
        names = list(dict.fromkeys(e.name for _, f in files for e in f.entries))
        where = "the file" if len(files) == 1 else f"any of the {len(files)} files"
        raise ConfigError("--name", name, f"no entry of {where} has this name; " + did_you_mean(name, names)
                          + allowed(names, limit=NAMES_SHOWN))
    return chosen


# Fields a model ties together (a self-attention layer's key length is its query length; a
# layer's V head dim is usually its QK head dim): --set of one changes that one only, and says so.
TIED_FIELDS = (("seqlen_q", "seqlen_kv"), ("head_dim_qk", "head_dim_v"))


def _length(sets: dict[str, Any], key: str) -> int | None:
    """The length `--set key=...` gives the model's problems, or None (each stack's own)."""
    value = sets.get(key)
    # A value that is no length is not passed on: model_problems would name its own argument
    # (seqlen) and allow None, which --set does not; the --set pair, applied on top of each layer's
    # problem, is then refused by AttnConfig naming the field the user wrote (seqlen_q=3000000000).
    return value if is_size(value) else None


def _tied_notes(sets: dict[str, Any], configs: list[AttnConfig]) -> list[str]:
    notes = []
    for first, second in TIED_FIELDS:
        for named, other in ((first, second), (second, first)):
            if named in sets and other not in sets:
                kept = sorted({getattr(cfg, other) if other != "head_dim_v" else cfg.resolved_head_dim_v
                               for cfg in configs})
                notes.append(f"--set {named}={sets[named]} changes {named} only: {other} stays "
                             f"{', '.join(map(str, kept))} as the model config reads it; --set {other}=... to change it")
    return notes


def _hf_problems(source: str, sets: dict[str, Any]) -> Asked:
    """One problem per distinct attention layer problem of a Hugging Face model config."""
    # Shape, pass and dtype shape the layer problems themselves (a sliding window only applies
    # when the sequence is longer than it), so they go in before the problems are derived; the
    # dtype, when not set, is the one the config names.
    sets = dict(sets)
    asked = "qkv_dtype" in sets
    dtype = sets.pop("qkv_dtype", None)
    if asked and dtype not in DTYPES:  # as a config file's field: names, not aliases
        raise ConfigError("qkv_dtype", dtype, choice_message("qkv_dtype", dtype, DTYPES))
    reading = hf_config(source)
    layers = model_problems(
        reading, sets.pop("batch_size", 1), _length(sets, "seqlen_q"), sets.pop("is_training", True),
        dtype, seqlen_kv=_length(sets, "seqlen_kv"),
    )
    if not layers:
        raise ConfigError("hf_config", source_name(source), f"(model_type {reading.model_type!r}) has no softmax "
                          "attention layer to answer: " + "; ".join(reading.notes or ("no layers",)))
    entries = []
    for layer in layers:
        cfg = AttnConfig.from_dict({**layer.config.to_dict(), **sets}) if sets else layer.config
        name = f"{layer.name} (layers {layer_ranges(layer.layers)})"
        entries.append((NamedConfig(name, cfg, source), tuple(layer.integration_reasons)))
    notes = list(reading.notes) + _tied_notes(sets, [layer.config for layer in layers])
    return Asked(entries, tuple(notes))
