"""The suite's rules beyond AttnConfig's own checks, and the checks of whole config files.

AttnConfig.from_dict (and parse_config_file for whole files) makes every AttnConfig check; this
module adds only the rules the library does not make.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from fusedattn_select.config import AttnConfig
from fusedattn_select.config_files import ConfigFile, NamedConfig, load_config_file
from fusedattn_select.errors import ConfigError


class ConfigProblem(ValueError):
    pass


def _fail(where: str, message: str) -> None:
    raise ConfigProblem(f"{where}: {message}")


def check_suite_rules(cfg: AttnConfig, where: str) -> None:
    """Raise ConfigProblem where a valid AttnConfig breaks a rule of this suite."""
    if cfg.layout.paged:
        needed = cfg.batch_size * -(-cfg.seqlen_kv // cfg.page_size)
        if cfg.num_pages < needed:
            _fail(where, f"num_pages={cfg.num_pages} < batch * ceil(seqlen_kv / page_size) = {needed}")
    if cfg.do_format is not None and (cfg.do_format == "thd") != (cfg.q_format == "thd"):
        _fail(where, f"do_format={cfg.do_format} must be thd exactly when Q is THD")
    if cfg.is_fp8 and cfg.scaling_mode is None:
        # This suite always names the FP8 recipe explicitly.
        _fail(where, "FP8 configs in this suite name their scaling_mode")


def check_entry(name: str, fields: Mapping[str, Any]) -> AttnConfig:
    """The AttnConfig of one generated entry (``fields`` without ``name``); ConfigProblem naming
    the entry unless it is valid and keeps the suite rules."""
    try:
        cfg = AttnConfig.from_dict(fields)
    except ConfigError as err:
        raise ConfigProblem(f"{name}: {err}") from None
    check_suite_rules(cfg, name)
    return cfg


def check_unique(entries: Iterable[NamedConfig], where: str) -> None:
    """Names are unique, and no two entries are the same problem (equal cache keys)."""
    names: set[str] = set()
    keys: dict[str, str] = {}
    for entry in entries:
        if entry.name in names:
            _fail(where, f"duplicate entry name {entry.name!r}")
        names.add(entry.name)
        key = entry.config.cache_key()
        if key in keys:
            _fail(where, f"entries {keys[key]!r} and {entry.name!r} are the same config")
        keys[key] = entry.name


def check_file(config_file: ConfigFile) -> None:
    """The checks a parsed config file needs beyond parse_config_file's."""
    where = config_file.path
    for key in ("description", "source"):
        if not getattr(config_file, key):
            _fail(where, f"top-level {key!r} must be a non-empty string")
    for entry in config_file.entries:
        check_suite_rules(entry.config, f"{where}: {entry.name}")
    check_unique(config_file.entries, where)


def check_config_file(path: Path) -> int:
    """Check a configs/*.yaml (or probes/*.yaml) file; return its number of entries."""
    try:
        config_file = load_config_file(path)
    except ConfigError as err:
        raise ConfigProblem(str(err)) from None
    check_file(config_file)
    return len(config_file.entries)
