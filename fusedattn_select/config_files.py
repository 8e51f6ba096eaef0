"""Config files: YAML documents naming the attention problems of one model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from fusedattn_select.config import AttnConfig, allowed, did_you_mean
from fusedattn_select.errors import ConfigError


@dataclass(frozen=True)
class NamedConfig:
    """One entry of a config file: the problem plus where it came from."""

    name: str
    config: AttnConfig
    source: str = ""


@dataclass(frozen=True)
class ConfigFile:
    """A YAML file describing one model: a name, shared defaults and named problems."""

    name: str
    entries: tuple[NamedConfig, ...]
    description: str = ""
    source: str = ""
    path: str = ""

    def get(self, name: str) -> NamedConfig:
        for entry in self.entries:
            if entry.name == name:
                return entry
        names = [e.name for e in self.entries]
        raise ConfigError("name", name, did_you_mean(name, names) + allowed(names, limit=NAMES_SHOWN))


NAMES_SHOWN = 12  # entry names an error lists (a probe suite has hundreds)
_FILE_KEYS = ("name", "description", "source", "defaults", "configs")
# What a config file must hold, for the errors about its shape.
FILE_SHAPE = (
    "a config file is a YAML mapping with a non-empty 'configs' list of named entries "
    "(optional keys: name, description, source, defaults); see README 'Config format'"
)


def parse_config_file(data: Any, path: str = "<memory>") -> ConfigFile:
    """Build a ConfigFile from parsed YAML; errors name the entry and the field."""
    if data is None:
        raise ConfigError("config file", path, f"is empty; {FILE_SHAPE}")
    if not isinstance(data, Mapping):
        raise ConfigError("config file", path, f"holds a YAML {type(data).__name__}, not a mapping; {FILE_SHAPE}")
    unknown = sorted(set(data) - set(_FILE_KEYS), key=str)
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}", data[unknown[0]],
                          "unknown key; " + did_you_mean(unknown[0], _FILE_KEYS) + allowed(_FILE_KEYS))
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        raise ConfigError(f"{path}: defaults", defaults, "must be a mapping of AttnConfig fields")
    raw_entries = data.get("configs")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise ConfigError(f"{path}: configs", raw_entries, "must be a non-empty list of named entries")
    entries: list[NamedConfig] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_entries):
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{path}: configs[{index}]", raw, "must be a mapping with a 'name'")
        raw = dict(raw)
        name = raw.pop("name", None)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{path}: configs[{index}].name", name, "must be a non-empty string")
        if name in seen:
            raise ConfigError(f"{path}: configs[{index}].name", name, "must be unique in the file")
        seen.add(name)
        merged = {**defaults, **raw}
        try:
            cfg = AttnConfig.from_dict(merged)
        except ConfigError as err:
            raise ConfigError(f"{path}: {name}: {err.field}", err.value, err.allowed) from None
        except TypeError as err:  # pragma: no cover - from_dict checks names first
            raise ConfigError(f"{path}: {name}", merged, str(err)) from None
        entries.append(NamedConfig(name, cfg, str(data.get("source", ""))))
    return ConfigFile(
        name=str(data.get("name") or Path(path).stem),
        entries=tuple(entries),
        description=str(data.get("description", "")),
        source=str(data.get("source", "")),
        path=path,
    )


def load_config_file(path: str | Path) -> ConfigFile:
    """Read a YAML config file (see README 'Config format')."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError("config file", str(path), f"cannot be read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ConfigError("config file", str(path), f"cannot be read (not UTF-8 text: {err.reason} at byte {err.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError("config file", str(path), f"is not valid YAML: {yaml_error(err)}") from None
    return parse_config_file(data, str(path))


def yaml_error(err: Exception) -> str:
    """A YAML parse error in one line: where (line and column, from 1) and what yaml says."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or not problem:
        return " ".join(str(err).split())
    text = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and context_mark is not None:
        text += f" ({context} at line {context_mark.line + 1}, column {context_mark.column + 1})"
    return text
