"""A Hugging Face model config as plain JSON data, and its fields read with their rules.

Every source (a config.json path or its directory, a JSON string, a dict, a transformers config
object or a model) becomes the dict that config.json holds; a config object is turned into one
with its own `to_dict()`. Nothing here imports torch or transformers: reading a config file is
JSON work, and the same dict gives the same problems whether transformers is installed or not.
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Any, Mapping

from fusedattn_select.errors import ConfigError, short_text

POSITIVE_INTEGER = "must be a positive integer"
COUNT = "must be a non-negative integer"
POSITIVE_NUMBER = "must be a positive finite number"
NON_NEGATIVE_NUMBER = "must be a non-negative finite number"
PROBABILITY = "must be a number in [0, 1)"
BOOLEAN = "must be true or false"
NAMES = "must be a list of layer type names (strings)"
TEXT = "must be a string"


def _follows(rule: str, value: Any) -> bool:
    if rule == BOOLEAN:
        return isinstance(value, bool)
    if rule == TEXT:
        return isinstance(value, str)
    if rule == NAMES:
        return isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    if rule in (POSITIVE_INTEGER, COUNT):
        return isinstance(value, numbers.Integral) and value >= (1 if rule == POSITIVE_INTEGER else 0)
    if not math.isfinite(value):
        return False
    if rule == POSITIVE_NUMBER:
        return value > 0
    return value >= 0 if rule == NON_NEGATIVE_NUMBER else 0 <= value < 1


class Fields:
    """The keys of one config dict (the top level, or a nested `text_config` / `vision_config`),
    read by name with a rule; a value that breaks its rule is a ConfigError naming its JSON path
    (`hf_config.text_config.num_attention_heads`). None and absent both read as "not given". `source` names
    the whole config for errors about what it lacks (see `source_name`)."""

    def __init__(self, data: Mapping[str, Any], where: str = "hf_config", source: str = "the config given") -> None:
        self.data = data
        self.where = where
        self.source = source

    def path(self, key: str) -> str:
        """The JSON path of `key`, as errors name it."""
        return f"{self.where}.{key}"

    def first(self, keys: tuple[str, ...], rule: str) -> tuple[str, Any] | None:
        """(key, value) of the first of `keys` that is given, checked against `rule`; None if none is."""
        for key in keys:
            value = self.data.get(key)
            if value is not None:
                if not _follows(rule, value):
                    raise ConfigError(self.path(key), value, rule)
                return key, value
        return None

    def get(self, key: str, rule: str, default: Any = None) -> Any:
        """The value of `key` checked against `rule`, or `default` when it is not given."""
        found = self.first((key,), rule)
        return default if found is None else found[1]

    def nested(self, key: str) -> "Fields | None":
        """The nested config under `key` (e.g. text_config) when it is a JSON object."""
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConfigError(self.path(key), value, "must be a JSON object (a nested model config)")
        return Fields(value, self.path(key), self.source)


def _json_source(text: str, shown: str | None = None) -> dict:
    """The JSON object `text` holds; an error names `shown` (a file's path as given) or else the text."""
    named = text[:60] if shown is None else shown
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError("hf_config", named,
                          f"is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    except (ValueError, RecursionError) as err:  # an integer of thousands of digits; nesting too deep
        raise ConfigError("hf_config", named, f"is JSON this reader cannot hold ({short_text(str(err))})") from None
    if not isinstance(data, dict):
        raise ConfigError("hf_config", named, f"must be a JSON object, not {_json_kind(data)}")
    return data


def _json_kind(data: Any) -> str:
    kinds = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}
    return kinds.get(type(data), "a number")


def _file_source(source: str | Path) -> dict:
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
    return _json_source(text, str(source))


def _object_source(source: Any) -> dict:
    """The dict of a transformers config object (or of a model's config), by its own to_dict()."""
    if not hasattr(source, "to_dict") and hasattr(source, "config"):
        source = source.config  # a model
    to_dict = getattr(source, "to_dict", None)
    if not callable(to_dict):
        raise ConfigError("hf_config", type(source).__name__, "must be a config.json path, JSON, a dict, "
                          "or a transformers config or model")
    data = to_dict()
    if not isinstance(data, Mapping):
        raise ConfigError("hf_config", type(source).__name__, "to_dict() did not return a dict")
    return dict(data)


def _json_text(source: str) -> bool:
    """Whether a string is JSON text rather than a path: it starts with "{", or with "[" (an array, then
    refused as not an object) and names no file."""
    start = source.lstrip()[:1]
    if start == "[":
        try:
            return not Path(source).exists()
        except (OSError, ValueError):  # a name too long, a NUL: no file
            return True
    return start == "{"


def _is_path(source: Any) -> bool:
    return isinstance(source, Path) or (isinstance(source, str) and not _json_text(source))


def source_name(source: Any) -> str:
    """How errors name a config as a whole: the file as given, or the kind of value given."""
    if _is_path(source):
        return f"config file {short_text(str(source))!r}"
    if isinstance(source, str):
        return "the JSON given"
    if isinstance(source, Mapping):
        return "the dict given"
    return f"the {type(source).__name__} given"


def config_data(source: Any) -> dict:
    """The config.json dict of any accepted source (see the module docstring)."""
    if _is_path(source):
        return _file_source(source)
    if isinstance(source, str):
        return _json_source(source)
    if isinstance(source, Mapping):
        return dict(source)
    return _object_source(source)
