"""Declared ROCm capability tables: JSON data with the source (repository, path, commit) of every fact."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from fusedattn_select.probing.rocm._core import ConfigError, FusedAttnSelectError

DECLARED_DIR = Path(__file__).resolve().parent / "declared"
# Consulted in this order: hipDNN's graph API is the cuDNN counterpart, CK Tile is the kernel
# library under most ROCm attention paths, PyTorch SDPA is what a framework falls back to.
TABLE_NAMES = ("hipdnn_sdpa", "ck_fmha", "pytorch_sdpa")


class DeclaredTableError(FusedAttnSelectError):
    """A declared table file is missing, unreadable or lacks a required key."""


@dataclass(frozen=True)
class DeclaredSource:
    """Where a table's facts were read: upstream repository, path and commit, and our pinned copy.

    `pinned` is the copy's path relative to the repository root (under tests/data): the tests
    compare the table with it; the installed package neither ships nor reads it.
    """

    repository: str
    path: str
    commit: str
    pinned: str
    excerpt: str = ""

    def cite(self) -> str:
        return f"{self.repository} {self.path} @ {self.commit[:12]}"


@dataclass(frozen=True)
class DeclaredTable:
    """One declared table: its name, title, sources, caveat and the facts (read-only mapping)."""

    name: str
    title: str
    sources: tuple[DeclaredSource, ...]
    caveat: str
    facts: Mapping[str, Any]
    path: str
    digest: str

    def describe_sources(self) -> str:
        return f"{self.name} ({self.title}): " + "; ".join(s.cite() for s in self.sources)


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _source(raw: Mapping[str, Any], path: Path) -> DeclaredSource:
    try:
        return DeclaredSource(
            str(raw["repository"]), str(raw["path"]), str(raw["commit"]), str(raw["pinned"]),
            str(raw.get("excerpt", "")),
        )
    except (KeyError, TypeError) as err:
        raise DeclaredTableError(f"{path}: a source lacks {err}; needs repository, path, commit, pinned") from None


@functools.lru_cache(maxsize=None)
def load_table(name: str, directory: str = str(DECLARED_DIR)) -> DeclaredTable:
    """The declared table `name` (one of TABLE_NAMES) read from `directory`."""
    if name not in TABLE_NAMES:
        raise ConfigError("table", name, "must be one of " + ", ".join(repr(n) for n in TABLE_NAMES))
    path = Path(directory) / f"{name}.json"
    try:
        text = path.read_text(encoding="utf-8")
        raw = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DeclaredTableError(f"declared table {path}: cannot be read ({err})") from None
    missing = [key for key in ("name", "title", "sources") if key not in raw]
    if missing or raw.get("name") != name or not raw.get("sources"):
        raise DeclaredTableError(f"declared table {path}: needs name={name!r}, title and sources (missing {missing})")
    facts = {k: v for k, v in raw.items() if k not in ("name", "title", "sources", "caveat")}
    return DeclaredTable(
        name=name,
        title=str(raw["title"]),
        sources=tuple(_source(s, path) for s in raw["sources"]),
        caveat=str(raw.get("caveat", "")),
        facts=_freeze(facts),
        path=str(path),
        digest=hashlib.sha256(text.encode()).hexdigest()[:16],
    )
