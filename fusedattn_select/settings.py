"""The FUSEDATTN_SELECT_* environment variables: each one's name, what it takes, and its one parser.

Torch-free (core): the runtime reads its settings through these parsers, and the command line checks
every setting up front with `check_all` before it does anything (README "Environment variables" says
what an invalid value does in each). An unset or empty variable means its default.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

from fusedattn_select.errors import ConfigError

SNAPSHOT = "FUSEDATTN_SELECT_SNAPSHOT"
CACHE_DIR = "FUSEDATTN_SELECT_CACHE_DIR"
CACHE = "FUSEDATTN_SELECT_CACHE"
CACHE_MAX_BYTES = "FUSEDATTN_SELECT_CACHE_MAX_BYTES"
DENSE_AFTER = "FUSEDATTN_SELECT_DENSE_AFTER"
DENSE_BUILDS = "FUSEDATTN_SELECT_DENSE_BUILDS"
FIRST_CALLS = "FUSEDATTN_SELECT_FIRST_CALLS"
DIRECT_LAUNCH = "FUSEDATTN_SELECT_DIRECT_LAUNCH"
NATIVE = "FUSEDATTN_SELECT_NATIVE"
NATIVE_DIR = "FUSEDATTN_SELECT_NATIVE_DIR"
FP8_KERNELS = "FUSEDATTN_SELECT_FP8_KERNELS"

CACHE_OFF_VALUES = ("off", "0", "false", "no")
CACHE_ON_VALUES = ("on", "1", "true", "yes")
CACHE_SWITCH_ALLOWED = (f"must be one of {', '.join(CACHE_ON_VALUES)} (persistent cache) or "
                        f"{', '.join(CACHE_OFF_VALUES)} (memory only)")
DEFAULT_MAX_BYTES = 512 * 1024**2
MAX_BYTES_ALLOWED = "must be a positive number of bytes (K, M, G, T suffixes are powers of 1024, e.g. 512M)"
DEFAULT_DENSE_AFTER = 16
DENSE_AFTER_ALLOWED = "must be a whole number of calls (0 = never leave the bucket plans)"
DENSE_BUILD_MODES = ("process", "inline")
FIRST_CALL_MODES = ("torch", "wait")
SWITCH_ALLOWED = "must be 0 (off) or 1 (on, the default)"
NATIVE_MODES = ("auto", "1", "0")
NATIVE_ALLOWED = ("must be auto (the default: use the compiled lean path where built, and build it in the "
                  "background on first use), 1 (use it where built, never build it) or 0 (off)")
FP8_KERNEL_CHOICES = ("auto", "triton", "torch")

_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _text(name: str) -> str:
    return os.environ.get(name, "")


# ----- one parser per variable: the raw text (never empty) to its value, or ConfigError -------------
def parse_snapshot_paths(text: str) -> list[str]:
    """The snapshot files `text` names: one path, or several separated by os.pathsep."""
    paths = [part for part in text.split(os.pathsep) if part.strip()]
    if not paths:
        raise ConfigError(SNAPSHOT, text, f"must name snapshot files separated by {os.pathsep!r}")
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        raise ConfigError(SNAPSHOT, text, f"must name existing snapshot files separated by {os.pathsep!r}; "
                          f"no such file: {missing[0]}")
    return paths


def parse_cache_switch(text: str) -> bool:
    """True: the persistent cache is on; False: memory only."""
    switch = text.strip().lower()
    if switch in CACHE_OFF_VALUES:
        return False
    if not switch or switch in CACHE_ON_VALUES:
        return True
    raise ConfigError(CACHE, text, CACHE_SWITCH_ALLOWED)


def parse_max_bytes(text: str) -> int:
    """A store's size limit in bytes."""
    match = re.fullmatch(r"([0-9]+)\s*([kmgt]?)(?:i?b)?", text.strip().lower())
    if match is None or int(match.group(1)) <= 0:
        raise ConfigError(CACHE_MAX_BYTES, text, MAX_BYTES_ALLOWED)
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def parse_dense_after(text: str) -> int:
    """The call count after which a steady shape gets its own plans (blanks around ignored)."""
    if not re.fullmatch(r"[0-9]+", text.strip()):  # str.isdigit() also takes digits int() refuses ("²")
        raise ConfigError(DENSE_AFTER, text, DENSE_AFTER_ALLOWED)
    return int(text)


def parse_dense_builds(text: str) -> str:
    """Where a steady shape's own plans are built: "process" or "inline" (any case, blanks around ignored)."""
    value = text.strip().lower()
    if value not in DENSE_BUILD_MODES:
        raise ConfigError(DENSE_BUILDS, text, "must be one of " + ", ".join(repr(m) for m in DENSE_BUILD_MODES))
    return value


def parse_first_calls(text: str) -> str:
    """What a call whose cuDNN plans are not ready does: "torch" (run torch SDPA meanwhile) or "wait"."""
    value = text.strip().lower()
    if value not in FIRST_CALL_MODES:
        raise ConfigError(FIRST_CALLS, text, "must be one of " + ", ".join(repr(m) for m in FIRST_CALL_MODES))
    return value


def parse_direct_launch(text: str) -> bool:
    """"1" or "0" (blanks around ignored)."""
    if text.strip() not in ("0", "1"):
        raise ConfigError(DIRECT_LAUNCH, text, SWITCH_ALLOWED)
    return text.strip() == "1"


def parse_native(text: str) -> str:
    """"auto", "1" or "0" (any case, blanks around ignored)."""
    value = text.strip().lower()
    if value not in NATIVE_MODES:
        raise ConfigError(NATIVE, text, NATIVE_ALLOWED)
    return value


def parse_fp8_kernels(text: str) -> str:
    """"auto", "triton" or "torch" (any case, blanks around ignored; blank means auto)."""
    value = text.strip().lower() or "auto"
    if value not in FP8_KERNEL_CHOICES:
        raise ConfigError(FP8_KERNELS, text, "must be one of " + ", ".join(FP8_KERNEL_CHOICES))
    return value


def _any_path(text: str) -> str:
    return text  # a directory that cannot be used is reported where it is used (it degrades, with a warning)


@dataclass(frozen=True)
class Setting:
    """One environment variable: its parser (raw text -> value, ConfigError) and its default."""

    name: str
    parse: Callable[[str], Any]
    default: Any

    def value(self) -> Any:
        """The variable's value now: its default when unset or empty, else parsed (ConfigError)."""
        text = _text(self.name)
        return self.default if text == "" else self.parse(text)


SETTINGS: tuple[Setting, ...] = (
    Setting(SNAPSHOT, parse_snapshot_paths, None),
    Setting(CACHE_DIR, _any_path, None),
    Setting(CACHE, parse_cache_switch, True),
    Setting(CACHE_MAX_BYTES, parse_max_bytes, DEFAULT_MAX_BYTES),
    Setting(DENSE_AFTER, parse_dense_after, DEFAULT_DENSE_AFTER),
    Setting(DENSE_BUILDS, parse_dense_builds, "process"),
    Setting(FIRST_CALLS, parse_first_calls, "torch"),
    Setting(DIRECT_LAUNCH, parse_direct_launch, True),
    Setting(NATIVE, parse_native, "auto"),
    Setting(NATIVE_DIR, _any_path, None),
    Setting(FP8_KERNELS, parse_fp8_kernels, "auto"),
)
_BY_NAME = {setting.name: setting for setting in SETTINGS}


def value(name: str) -> Any:
    """The value of the variable `name` (one of SETTINGS) now; ConfigError naming it when invalid."""
    return _BY_NAME[name].value()


@dataclass(frozen=True)
class RuntimeSettings:
    """What attention() reads of the environment, read once per process (`read_runtime`): the
    runtime holds one (runtime/run_settings.py), and tools and tests change it only through that."""

    dense_after: int
    dense_builds: str
    first_calls: str
    direct_launch: bool
    native: str
    fp8_kernels: str


# Each field's variable (its parser and default are the variable's Setting).
RUNTIME_VARIABLES = {"dense_after": DENSE_AFTER, "dense_builds": DENSE_BUILDS, "first_calls": FIRST_CALLS,
                     "direct_launch": DIRECT_LAUNCH, "native": NATIVE, "fp8_kernels": FP8_KERNELS}


def read_runtime() -> RuntimeSettings:
    """The runtime's settings now (ConfigError naming the first variable that holds a value it does
    not take, in the order of RuntimeSettings' fields)."""
    return RuntimeSettings(**{field: value(name) for field, name in RUNTIME_VARIABLES.items()})


def runtime_with(current: RuntimeSettings, **changes: Any) -> RuntimeSettings:
    """`current` with `changes`, each checked by its variable's parser (ValueError naming the field
    and what it takes)."""
    unknown = set(changes) - set(RUNTIME_VARIABLES)
    if unknown:
        raise ValueError(f"unknown runtime setting {sorted(unknown)[0]!r}: one of {', '.join(RUNTIME_VARIABLES)}")
    checked = {}
    for field, given in changes.items():
        text = ("1" if given else "0") if isinstance(given, bool) else str(given)
        try:
            checked[field] = _BY_NAME[RUNTIME_VARIABLES[field]].parse(text)
        except ConfigError as err:
            raise ValueError(f"runtime setting {field}={given!r}: {err.allowed}") from None
    return dataclasses.replace(current, **checked)


PREFIX = "FUSEDATTN_SELECT_"


def unknown_variables() -> list[str]:
    """A note for each FUSEDATTN_SELECT_* variable set that is none of SETTINGS (a misspelling: ignored), naming
    the setting it is closest to where one is close."""
    notes = []
    for name in sorted(n for n in os.environ if n.startswith(PREFIX) and n not in _BY_NAME):
        close = difflib.get_close_matches(name[len(PREFIX):], [n[len(PREFIX):] for n in _BY_NAME], n=1, cutoff=0.7)
        notes.append(f"{name} is not a variable of fusedattn-select: it is ignored"
                     + (f" (did you mean {PREFIX}{close[0]}?)" if close else f" (they are: {', '.join(_BY_NAME)})"))
    return notes


def check_all(skip: tuple[str, ...] = ()) -> None:
    """Raise ConfigError for the first variable (in SETTINGS order, except `skip`) that holds a
    value it does not take: what every command does before anything else."""
    for setting in SETTINGS:
        if setting.name not in skip:
            setting.value()
