"""Exception types raised by fusedattn_select."""

from __future__ import annotations

from typing import Any, Iterator

# The most characters of a value (or a field name) an error message shows: a value read from a
# hostile file can be gigabytes once printed, and one error line must stay one readable line.
SHOWN_CHARACTERS = 300


def _repr_pieces(value: Any, open_containers: set[int]) -> Iterator[str]:
    """repr(value) in pieces, produced lazily so that the caller can stop early: a value whose
    repr is huge (a nested list of a million items) is never formatted in full."""
    kind = type(value)
    if kind in (list, tuple, set, frozenset, dict):
        if id(value) in open_containers:  # a structure that holds itself, as repr() shows it
            yield "[...]" if kind is list else "{...}" if kind is dict else "..."
            return
        if not value:
            yield repr(value)
            return
        open_containers.add(id(value))
        opening, closing = {list: "[]", tuple: "()", dict: "{}"}.get(kind, "{}")
        yield (kind.__name__ + "({") if kind is frozenset else opening
        for index, item in enumerate(value.items() if kind is dict else value):
            if index:
                yield ", "
            if kind is dict:
                yield from _repr_pieces(item[0], open_containers)
                yield ": "
                yield from _repr_pieces(item[1], open_containers)
            else:
                yield from _repr_pieces(item, open_containers)
        yield ",)" if kind is tuple and len(value) == 1 else ("})" if kind is frozenset else closing)
        open_containers.discard(id(value))
    elif isinstance(value, (str, bytes)):
        yield repr(value[:SHOWN_CHARACTERS + 1])  # the rest is never shown
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            yield repr(value)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            yield f"<an integer of {value.bit_length()} bits>"
    else:
        yield repr(value)


def _size(value: Any) -> str:
    if isinstance(value, (str, bytes)):
        return f"{len(value):,} characters" if isinstance(value, str) else f"{len(value):,} bytes"
    try:
        return f"a {type(value).__name__} of {len(value):,} items"
    except TypeError:
        return f"a long {type(value).__name__}"


def short_repr(value: Any, limit: int = SHOWN_CHARACTERS) -> str:
    """repr(value), or its first `limit` characters, an ellipsis and the value's full size."""
    pieces: list[str] = []
    length = 0
    for piece in _repr_pieces(value, set()):
        pieces.append(piece)
        length += len(piece)
        if length > limit:
            return "".join(pieces)[:limit] + f"... ({_size(value)})"
    return "".join(pieces)


def short_text(text: str, limit: int = SHOWN_CHARACTERS) -> str:
    """`text`, or its first `limit` characters, an ellipsis and its full length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def first_line(err: BaseException) -> str:
    """An error's first line (at most SHOWN_CHARACTERS), else its type's name: one line for a report."""
    text = str(err).strip()
    return text.splitlines()[0][:SHOWN_CHARACTERS] if text else type(err).__name__


class FusedAttnSelectError(Exception):
    """Base class of every error this library raises."""


class ConfigError(FusedAttnSelectError, ValueError):
    """An attention problem description has a bad field value.

    The message shows the value's repr cut to SHOWN_CHARACTERS (with its full size); `value`
    holds it whole."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        # Set, not passed to super().__init__(): dynamo cannot trace that call, so under
        # torch.compile(fullgraph=True) its own error would hide this one's field and allowed values.
        self.args = (f"{short_text(str(field))}={short_repr(value)}: {allowed}",)

    def __reduce__(self) -> tuple[Any, ...]:
        # args holds the message, not the constructor's arguments: rebuild from the fields
        # (another process receives the same error, field, value and allowed included).
        return type(self), (self.field, self.value, self.allowed), self.__dict__


class PlatformError(FusedAttnSelectError):
    """The platform (GPU, cuDNN, driver) cannot be used for probing or dispatch."""


class ProbeError(FusedAttnSelectError):
    """A probe failed for a reason that is not a support verdict (OOM, CUDA error, timeout)."""


class SnapshotError(FusedAttnSelectError):
    """A recorded snapshot file is missing, unreadable or malformed."""
