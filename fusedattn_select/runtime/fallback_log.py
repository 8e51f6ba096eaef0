"""The fallback warning: one line per problem, its first reason in full and each cause once. attention(), the SDPA
drop-in (with call signatures of its own) and the compiled custom op all reach `entries.log_fallback`, which logs a
problem once however many signatures run it, and the shapes of one problem class once per reason (the Dispatcher
keeps the (class, reason) pairs until clear_plans())."""

from __future__ import annotations

# A warning's reason is cut after this many characters (the first reason is always kept whole):
# an FP8 problem tried with three output recipes gave ~1,400 characters before.
MAX_REASON_CHARS = 500
SEPARATOR = "; "


def _cause(part: str) -> str:
    """What a rejection line says after its "<backend> <passes> <kind> at " prefix."""
    return part.split(" at ", 1)[1] if " at " in part else part


def _label(part: str) -> str:
    """Whose reason a line is: an FP8 output recipe ("O fp8_e4m3, dO fp8_e5m2: ..."), else the
    rejection ("F16 backward not supported")."""
    head = part.split(" at ", 1)[0]
    recipe, sep, _ = head.partition(": ")
    return recipe if sep else head


def short_reason(reason: str, limit: int = MAX_REASON_CHARS) -> str:
    """`reason` on one line with each cause stated once: a later reason with the same cause as an
    earlier one is named, not repeated; past `limit` characters the rest is counted, not shown."""
    parts = [" ".join(part.split()) for part in " ".join(reason.split()).split(SEPARATOR)]
    kept: list[str] = []
    same: list[str] = []
    causes: set[str] = set()
    for part in parts:
        if not part or part in kept:
            continue
        if _cause(part) in causes:
            same.append(_label(part))
            continue
        causes.add(_cause(part))
        kept.append(part)
    cut = max(limit, len(kept[0]) if kept else 0)
    text = SEPARATOR.join(kept)
    if len(text) > cut:
        text = text[:cut].rstrip() + f" ... ({len(text) - cut} more characters; select(config).reasons has every reason)"
    if same:
        text += f" (the same for {' and for '.join(same)})"
    return text


def fallback_line(where: str, problem: str, reason: str) -> str:
    """The warning logged when calls of `problem` fall back to `where`."""
    return f"fusedattn_select: attention() falls back to {where} for {problem}: {short_reason(reason)}"
