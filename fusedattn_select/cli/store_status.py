"""What the commands say about the decision store: its state in a line, its problems, and whether
a write would outlive the command."""

from __future__ import annotations

from typing import Any

from fusedattn_select.store import CACHE_DIR_ENV, CACHE_SWITCH_ENV, PersistentStore, Store


def store_info(store: Store) -> dict[str, Any]:
    """store.info() of `store`, with the persistent file's quick_check done (read-only: nothing moves)."""
    if isinstance(store, PersistentStore):
        store.check_damage()
    return store.info()


def is_degraded(info: dict[str, Any]) -> bool:
    """Whether the store is not what was asked for: memory because the persistent one failed, damaged, or a
    file whose saves all fail."""
    return bool(info.get("degraded") or info.get("damage") or info.get("unwritable"))


def describe_store(info: dict[str, Any]) -> str:
    """The store in one line: where it is and what it holds, flagged DEGRADED or DAMAGED."""
    if info.get("degraded"):
        return f"DEGRADED: in memory only, lost at exit: {info['degraded']}"
    if info.get("switched_off"):
        return f"in memory only ({info['switched_off']})"
    held = f"{info['entries']} decisions, {info['plans']} plans, {info.get('runner_choices', 0)} runner choices"
    if info.get("damage"):
        return (f"DAMAGED: {info['path']} ({info['damage']}): {held} recoverable; `fusedattn-select cache "
                "repair` salvages them")
    return f"{info['kind']} {info['path']}: {held}"


def describe_plans(info: dict[str, Any]) -> str:
    """Whether serialized plans are kept, and for how long, in one line."""
    if not info.get("persistent"):
        return "in memory only, lost at exit"
    if not info.get("plans_enabled"):
        return (f"DISABLED: {info.get('plans_refused')} (decisions are still cached; chmod 700 the directory, "
                "600 its files)")
    return "enabled"


def store_problems(info: dict[str, Any]) -> list[str]:
    """One line per thing wrong with the store (empty when nothing is)."""
    problems = []
    if info.get("degraded"):
        problems.append(f"warning: the persistent cache cannot be used: {info['degraded']}; decisions and plans "
                        f"are kept in memory and lost at exit (set {CACHE_DIR_ENV} to a writable directory)")
    if info.get("unwritable"):
        problems.append(f"warning: {info['unwritable']}: its rows are read, and every save fails")
    if info.get("damage"):
        problems.append(f"warning: {info['path']} is damaged ({info['damage']}); `fusedattn-select cache repair` "
                        "copies every recoverable row into a fresh file and keeps the damaged one aside")
    if info.get("persistent") and not info.get("plans_enabled"):
        problems.append(f"warning: serialized plans are disabled: {info.get('plans_refused')}")
    return problems


def cannot_write(info: dict[str, Any]) -> str:
    """Why every write to this store fails: a database file this user cannot write ("" when writes are taken,
    by the file or by memory)."""
    return f"the persistent cache cannot be written ({info['unwritable']})" if info.get("unwritable") else ""


def not_persisted(info: dict[str, Any]) -> str:
    """Why a write to this store would be kept in memory only, lost at exit ("" when the store is the
    persistent file; whether that file takes writes is `cannot_write`'s answer)."""
    if info.get("persistent"):
        return ""
    if info.get("degraded"):
        return f"the persistent cache cannot be used ({info['degraded']})"
    return f"the persistent cache is turned off ({info.get('switched_off') or CACHE_SWITCH_ENV + '=off'})"
