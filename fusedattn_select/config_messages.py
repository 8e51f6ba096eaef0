"""The wording of AttnConfig's ConfigError messages: allowed values, a likely intended spelling, and
why a number written in YAML was read as text. config.py imports them (and re-exports allowed and
did_you_mean, which other modules import from there)."""

from __future__ import annotations

import difflib
import math
from typing import Any, Iterable


def allowed(values: Iterable[str], limit: int | None = None) -> str:
    """"must be one of 'a', 'b'": all `values`, or the first `limit` and how many more there are."""
    values = list(values)
    shown = values if limit is None or len(values) <= limit else values[:limit]
    more = f" and {len(values) - len(shown)} more" if len(shown) < len(values) else ""
    return "must be one of " + ", ".join(repr(v) for v in shown) + more


def did_you_mean(value: object, choices: Iterable[str]) -> str:
    """"did you mean 'x'? " for the one of `choices` (the allowed values of the field in question)
    closest to a mistyped string `value`, else "", trying in turn: the first choice that starts with
    what was written ('bshd' -> 'bshd_bshd_bshd'), a choice spelled nearly alike (difflib ratio 0.85:
    'padding_casual' -> 'padding_causal'), the longest choice what was written starts with
    ('mask_type' -> 'mask'), then the closest spelling (ratio 0.6); case does not matter."""
    if not isinstance(value, str) or not value:
        return ""
    choices = [choice for choice in choices if isinstance(choice, str) and choice]
    written = value.lower()
    by_lower = {choice.lower(): choice for choice in reversed(choices)}  # the first of those equal but for case

    def spelled(cutoff: float) -> list[str]:
        return [by_lower[match] for match in difflib.get_close_matches(written, by_lower, n=1, cutoff=cutoff)]

    # Spelling alone ranks 'bsh3d' above 'bshd_bshd_bshd' for 'bshd' (one letter off against ten
    # letters more), although a value cut short is the likelier slip. A near spelling goes before a
    # choice the value starts with: 'causal_bottom_rigth' is a typo of 'causal_bottom_right', not
    # 'causal' run on.
    starting = [choice for choice in choices if choice.lower().startswith(written)]
    within = sorted((choice for choice in choices if written.startswith(choice.lower())), key=len, reverse=True)
    matches = starting or spelled(0.85) or within or spelled(0.6)
    return f"did you mean {matches[0]!r}? " if matches else ""


def number_as_text(value: Any) -> str:
    """For a float field given text that reads as a number: why it is text and how to write it so
    YAML reads a number. YAML 1.1 (PyYAML) reads 1e-1 and 1.5e3 as text: a float with an exponent
    needs a decimal point and a signed exponent (1.0e-1); other such text was quoted ('0.1')."""
    if not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    mantissa, _, exponent = repr(number).partition("e")
    if exponent:  # repr's exponent has its sign: the mantissa may lack the point (1e-05)
        written = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{exponent}"
    else:
        written = mantissa
    if "e" not in value.lower():  # no exponent YAML could misread: the number was quoted, or a str in Python
        return f"; {value!r} is text (quoted), not a number: write the number without quotes, as {written}"
    return (f"; {value!r} is text, not a number (YAML reads a number with an exponent as text unless it is "
            f"written like 1.0e-1): write it with a decimal point, as {written}")
