"""The package's lazily exported names (attention, FP8History, ... imported by `__getattr__` only when
asked, so that importing the package needs no torch) are visible to type checkers: each is imported
under `if TYPE_CHECKING:`, from where `__getattr__` takes it, and `__getattr__` is annotated."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import fusedattn_select

INIT = Path(fusedattn_select.__file__)


def _module_level_names(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """(names bound at module level outside `if TYPE_CHECKING:`, {name: module} imported inside it)."""
    plain, checking = set(), {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for inner in node.body:
                if isinstance(inner, ast.ImportFrom):
                    checking.update({alias.asname or alias.name: inner.module for alias in inner.names})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            plain.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            plain.add(node.name)
        elif isinstance(node, ast.Assign):
            plain.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return plain, checking


def test_every_exported_name_is_bound_for_type_checkers():
    tree = ast.parse(INIT.read_text())
    plain, checking = _module_level_names(tree)
    lazy = set(fusedattn_select.__all__) - plain
    assert lazy, "the package exports some names lazily"
    missing = sorted(lazy - set(checking))
    assert not missing, f"exported lazily but not imported under TYPE_CHECKING: {missing}"
    getattr_def = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__")
    assert getattr_def.returns is not None, "__getattr__ needs a return annotation (-> Any)"


def test_the_type_checking_imports_name_what_getattr_returns():
    pytest.importorskip("torch")
    _, checking = _module_level_names(ast.parse(INIT.read_text()))
    for name, module in checking.items():
        assert getattr(importlib.import_module(module), name) is getattr(fusedattn_select, name), name
