"""Config files: YAML documents naming the attention problems of one model."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from fusedattn_select.config import AttnConfig, allowed, did_you_mean
from fusedattn_select.errors import ConfigError, short_repr


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
    defaults = data.get("defaults", {})
    if not isinstance(defaults, Mapping):  # 0, [] or null would otherwise be read as no defaults
        raise ConfigError(f"{path}: defaults", defaults,
                          "must be a mapping of AttnConfig fields (leave the key out for no defaults)")
    fields = [f.name for f in dataclasses.fields(AttnConfig)]
    unknown = sorted(set(defaults) - set(fields), key=str)
    if unknown:  # named here: AttnConfig.from_dict would name the first entry, which does not hold it
        key = unknown[0]
        where = "an entry's name goes in the entry; " if key == "name" else ""
        suggestion = did_you_mean(key, fields)
        rest = f"(AttnConfig has {len(fields)} fields; see README 'Config format')" if suggestion else allowed(fields)
        raise ConfigError(f"{path}: defaults: {key}", defaults[key], f"unknown field; {where}{suggestion}{rest}")
    raw_entries = data.get("configs")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise ConfigError(f"{path}: configs", raw_entries, "must be a non-empty list of named entries")
    for key in ("name", "description", "source"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ConfigError(f"{path}: {key}", data[key], "must be a string")
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
        entries.append(NamedConfig(name, cfg, data.get("source") or ""))
    return ConfigFile(
        name=data.get("name") or Path(path).stem,
        entries=tuple(entries),
        description=data.get("description") or "",  # an empty `description:` is null: no text, not 'None'
        source=data.get("source") or "",
        path=path,
    )


# Nodes a YAML document's aliases may add once expanded: each alias stands for a copy of its
# anchor, so a few lines of nested aliases ("billion laughs") describe billions of nodes, which
# loading shares but anything that prints or walks the value expands.
ALIAS_NODE_BUDGET = 1_000_000
# libyaml's syntax errors are vaguer than the Python parser's (a tab is "a character that cannot
# start any token", an unclosed list is reported at the end of the text): a document this small is
# parsed again in Python to say where and what, which a large one would wait for.
PRECISE_ERROR_CHARACTERS = 256 * 1024


@functools.lru_cache(maxsize=None)
def yaml_loader() -> type:
    """The YAML loader every file and --set value is read with: the safe loader in C where PyYAML
    was built with libyaml (pure Python is two orders of magnitude slower on a large file), else
    in Python; a mapping that repeats a key is an error naming the key and its line, not "last
    one wins"; a value yaml cannot build (a month 13, an integer of 5,000 digits) is a YAML error
    at its line."""
    import yaml
    from yaml.constructor import ConstructorError

    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                first: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # `<<: *defaults` then own keys: an override, not a repeat
                    key = self.construct_object(key_node, deep=True)
                    try:
                        earlier = first.setdefault(key, key_node)
                    except TypeError:
                        continue  # unhashable: the base class says so, at its line
                    if earlier is not key_node:
                        raise ConstructorError(
                            "while constructing a mapping", node.start_mark,
                            f"found duplicate key {short_repr(key)} (first at line {earlier.start_mark.line + 1})",
                            key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Any:
            return self.clear_number(node, super().construct_yaml_int(node))

        def construct_yaml_float(self, node: Any) -> Any:
            return self.clear_number(node, super().construct_yaml_float(node))

        def clear_number(self, node: Any, value: Any) -> Any:
            unclear = _unclear_number(self.construct_scalar(node), value)
            if unclear:
                raise ConstructorError(None, None, unclear, node.start_mark)
            return value

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep=deep)
            # PyYAML's constructors fail on a value their tag cannot mean (`!!int` with no digits,
            # `!!bool maybe`, `!!timestamp x`) with these; yaml.YAMLError is none of them.
            except (ValueError, OverflowError, LookupError, AttributeError) as err:
                tag = str(node.tag).rpartition(":")[2]
                raise ConstructorError(None, None, f"cannot build this value as !!{tag} ({type(err).__name__}: {err})",
                                       node.start_mark) from None

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    Loader.add_constructor("tag:yaml.org,2002:float", Loader.construct_yaml_float)
    return Loader


def _unclear_number(text: str, value: Any) -> str:
    """Why YAML 1.1 reads `text` as a number (`value`) other than most readers see, else "": 0100 is
    octal (64) and 1:30 is base 60 (90); a size written so is a slip far more often than meant."""
    digits = text.replace("_", "").lstrip("+-")
    if ":" in digits:
        return f"{text} is a base-60 number in YAML 1.1 ({value}): write the number in decimal, or quote it for text"
    if isinstance(value, int) and len(digits) > 1 and digits[0] == "0" and digits[1] not in "bx":
        return f"{text} has a leading 0, which YAML 1.1 reads as octal ({value}): write the number without the leading 0"
    return ""


def _expansion(root: Any) -> tuple[int, int] | None:
    """(nodes, nodes with every alias expanded) of a composed document; None when an alias
    holds itself (a recursive structure, which expands without end). Iterative: a document may
    nest as deep as libyaml allows."""
    import yaml

    def children(node: Any) -> list[Any]:
        if isinstance(node, yaml.MappingNode):
            return [part for pair in node.value for part in pair]
        return list(node.value) if isinstance(node, yaml.SequenceNode) else []

    expanded: dict[int, int] = {}  # id(node) -> its size with aliases expanded
    open_nodes: set[int] = set()  # the nodes on the path being walked
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        if closing:
            expanded[id(node)] = 1 + sum(expanded[id(child)] for child in children(node))
            open_nodes.discard(id(node))
            continue
        if id(node) in expanded:
            continue
        if id(node) in open_nodes:
            return None
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in children(node))
    return len(expanded), expanded[id(root)]


def load_yaml(text: str, field: str, value: str) -> Any:
    """The value of a YAML document, read with yaml_loader(). yaml.YAMLError when it is not
    YAML; ConfigError(field, value, ...) when its aliases expand it beyond ALIAS_NODE_BUDGET
    or hold themselves."""
    import yaml
    from yaml.constructor import ConstructorError

    try:
        return _load(yaml_loader(), text, field, value)
    except RecursionError:  # flow-style nesting ([[[...]]]) recurses in the composer, C or Python
        raise ConfigError(field, value, "nests collections too deeply to read (a config file is a few levels deep)") from None
    except ConstructorError:
        raise  # from the constructor, which is Python with either parser: as precise as it gets
    except yaml.YAMLError:
        if getattr(yaml, "CSafeLoader", None) is None or len(text) > PRECISE_ERROR_CHARACTERS:
            raise
        try:
            yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as precise:
            raise precise from None
        except RecursionError:
            pass  # nesting the Python parser cannot follow: the C parser's message stands
        raise


def _load(loader_class: type, text: str, field: str, value: str) -> Any:
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if "&" in text and "*" in text:  # an alias needs an anchor; a file with neither skips the walk
            sizes = _expansion(node)
            if sizes is None:
                raise ConfigError(field, value, "holds an alias that contains itself (a recursive structure)")
            nodes, expanded = sizes
            if expanded - nodes > ALIAS_NODE_BUDGET:
                raise ConfigError(field, value, f"its aliases expand it by {expanded - nodes:,} nodes, more than "
                                  f"the {ALIAS_NODE_BUDGET:,} allowed (a 'billion laughs' document?)")
        return loader.construct_document(node)
    finally:
        loader.dispose()


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
        data = load_yaml(text, "config file", str(path))
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
