"""Problem classes: what the configs of one class (every field but the shape) share, made once per
class and process. AttnConfig uses it to validate a new shape of a known class by its shape fields
only, and to make its cache_key from the class's JSON text."""

from __future__ import annotations

import hashlib
import json
import operator
from dataclasses import dataclass
from typing import Any, Mapping

# The fields a problem class leaves out (AttnConfig.shape_class_key): its shape.
SHAPE_FIELDS = ("batch_size", "seqlen_q", "seqlen_kv", "num_pages")
# Marks where a shape field's value goes in a class's JSON text: no valid field value holds a NUL.
_MARKS = {name: "\x00" + name for name in SHAPE_FIELDS}
# Classes remembered before the memo starts over.
_KEPT = 65536


def json_text(data: Mapping[str, Any]) -> str:
    """The JSON text a key digests: sorted keys, no spaces."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class ClassKeys:
    """The keys of one problem class: its shape_class_key, and its JSON text cut where the shape
    fields' values go (in sorted field order), from which each config's cache_key text is made."""

    class_key: str
    pieces: tuple[str, ...]  # len(SHAPE_FIELDS) + 1 pieces around the shape values
    order: tuple[str, ...]   # the shape fields in the order their values go in

    @classmethod
    def of(cls, resolved: dict[str, Any]) -> "ClassKeys":
        """From a config's resolved() fields."""
        data = {name: value for name, value in resolved.items() if name not in SHAPE_FIELDS}
        class_key = digest(json_text(data))
        rest = json_text(dict(data, **_MARKS))
        order = tuple(sorted(SHAPE_FIELDS))
        pieces = []
        for name in order:
            before, _, rest = rest.partition(json.dumps(_MARKS[name]))
            pieces.append(before)
        pieces.append(rest)
        return cls(class_key, tuple(pieces), order)

    def text(self, cfg: Any) -> str:
        """The JSON text of `cfg`'s resolved fields (what json.dumps writes: ints, or null)."""
        parts = [self.pieces[0]]
        for name, piece in zip(self.order, self.pieces[1:]):
            value = getattr(cfg, name)
            parts.append("null" if value is None else int.__repr__(value))
            parts.append(piece)
        return "".join(parts)


class ProblemClasses:
    """The problem classes validated in this process, with their ClassKeys once made."""

    def __init__(self, class_fields: tuple[str, ...]) -> None:
        self._values = operator.attrgetter(*class_fields)
        self._known: dict[tuple, ClassKeys | None] = {}

    def of(self, cfg: Any) -> tuple | None:
        """The class of `cfg`: the values of every non-shape field and their types (True and 1 are
        equal values), or None where one is unhashable (such a config is validated whole, and fails)."""
        values = self._values(cfg)
        window = cfg.window_size
        key = (values, tuple(map(type, values)), tuple(map(type, window)) if type(window) is tuple else None)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def __contains__(self, problem_class: tuple) -> bool:
        return problem_class in self._known

    def keys(self, problem_class: tuple) -> ClassKeys | None:
        return self._known.get(problem_class)

    def remember(self, problem_class: tuple, keys: ClassKeys | None) -> None:
        if len(self._known) >= _KEPT:
            self._known.clear()
        self._known[problem_class] = keys
