"""The package's modules import one another without a cycle: every import counts, at module level or
inside a function (a function-level import only hides a cycle until the function runs). And two
layering rules: the probe engines never reach the store; the reference imports no other package."""

from __future__ import annotations

import ast
from pathlib import Path

import fusedattn_select

ROOT = Path(fusedattn_select.__file__).parent
PACKAGE = "fusedattn_select"


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules `path` imports (a name imported from a package counts as its submodule
    where there is one, else as the package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith(PACKAGE):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith(PACKAGE))
    return {name for name in found if name in modules}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_the_package_has_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert len(modules) > 100 and sum(map(len, graph.values())) > 300  # the walk saw the package
    assert _cycles(graph) == []


def test_the_walk_finds_a_cycle_where_there_is_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _reached(start: set[str], graph: dict[str, set[str]]) -> set[str]:
    """Every module `start` imports, directly or through other modules of the package."""
    seen, todo = set(), list(start)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    return seen


def _with_parents(name: str, modules: dict[str, Path]) -> set[str]:
    """`name` and the packages between it and the top package (importing it runs their __init__);
    the top package itself is left out: it imports the public API, selection and the store included."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(2, len(parts) + 1)} & set(modules)


def test_the_probe_engines_do_not_import_the_store():
    modules = _modules()
    graph = {name: set().union(*(_with_parents(m, modules) for m in _imports(path, modules))) - {name}
             for name, path in modules.items()}
    engines = {name for name in modules if name.startswith(f"{PACKAGE}.probing")}
    assert {f"{PACKAGE}.probing.cudnn.cudnn_engine", f"{PACKAGE}.probing.snapshot"} <= engines
    reached = _reached(engines, graph)
    assert f"{PACKAGE}.plan_store.keys" in reached  # the walk follows the engines into plan_store
    assert sorted(name for name in reached if name.startswith(f"{PACKAGE}.store")) == []
    assert sorted(name for name in reached if name == f"{PACKAGE}.plan_store.persistence") == []


def test_the_reference_imports_no_other_package_and_runtime_probing_and_transformers_import_it():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    reference = f"{PACKAGE}.reference"
    package = {name for name in modules if name.startswith(reference)}
    assert {f"{reference}.semantics", f"{reference}.autograd_reference", f"{reference}.chunked_reference"} <= package
    assert sorted(name for name in _reached(package, graph) if not name.startswith(reference)) == []
    importers = {name for name, imported in graph.items() if name not in package and imported & package}
    assert {f"{PACKAGE}.runtime.fallback", f"{PACKAGE}.probing.cudnn.verify_run",
            f"{PACKAGE}.probing.cudnn.verify_checks", f"{PACKAGE}.integrations.transformers.dependencies"} <= importers


def test_the_core_modules_do_not_import_the_store():
    # Core (the package's top-level modules: config, types, single_flight, forking, ...) is the lowest
    # layer; the store sits above it. The top package's __init__ and fusedattn_select.torch (an alias
    # of integrations.sdpa) are left out.
    modules = _modules()
    graph = {name: set().union(*(_with_parents(m, modules) for m in _imports(path, modules))) - {name}
             for name, path in modules.items()}
    core = {name for name, path in modules.items()
            if path.parent == ROOT and path.name not in ("__init__.py", "torch.py")}
    assert {f"{PACKAGE}.single_flight", f"{PACKAGE}.forking", f"{PACKAGE}.config"} <= core
    reaching = sorted(name for name in core if any(m.startswith(f"{PACKAGE}.store") for m in _reached({name}, graph)))
    assert reaching == []
