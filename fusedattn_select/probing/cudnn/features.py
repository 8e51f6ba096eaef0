"""What the installed cudnn-frontend can express, found by inspecting its API once per process.

The frontend's API differs across the supported versions (1.28 .. 1.32): operations, their keyword
arguments, graph constructor arguments, data types and tensor reorderings. Graph building chooses
arguments from these features, never from a version string.
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass
from typing import Any, Mapping

OPERATIONS = ("sdpa", "sdpa_backward", "sdpa_fp8", "sdpa_fp8_backward", "sdpa_mxfp8", "sdpa_mxfp8_backward")
_SIGNATURE_NAME = re.compile(r"[(,]\s*(\w+)\s*:")


@dataclass(frozen=True)
class FrontendFeatures:
    """What the installed cudnn-frontend can express, found by inspecting its API.

    `operations` maps each SDPA operation the frontend has to the keyword arguments it accepts.
    Frontend 1.27+ wraps the compiled graph in a pure-Python `pygraph` whose SDPA builders take
    **kwargs and forward them to the compiled `backend_graph` method, so the accepted names come
    from the compiled method's signature; older frontends expose the compiled signature directly.
    """

    version: str
    operations: Mapping[str, frozenset[str]]
    graph_arguments: frozenset[str]
    has_kernel_cache: bool
    data_types: frozenset[str]
    reorderings: frozenset[str]

    def has(self, operation: str) -> bool:
        return operation in self.operations

    def accepts(self, operation: str, argument: str) -> bool:
        return argument in self.operations.get(operation, frozenset())

    @property
    def dynamic_shapes(self) -> bool:
        """Dynamic shapes with a kernel cache: a new batch size or sequence length of a problem
        class reuses the compiled kernels (a few ms instead of hundreds)."""
        return self.has_kernel_cache and {"is_dynamic_shape_enabled", "kernel_cache"} <= self.graph_arguments

    def describe(self) -> dict[str, object]:
        return {
            "version": self.version,
            "operations": {op: sorted(args) for op, args in sorted(self.operations.items())},
            "graph_arguments": sorted(self.graph_arguments),
            "dynamic_shapes": self.dynamic_shapes,
        }


def _signature_names(function: Any) -> frozenset[str] | None:
    """Keyword names of a Python callable; None when it only takes **kwargs (a forwarding shim)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    names = {
        p.name for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    }
    forwards = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    if forwards and not names - {"name", "compute_data_type", "out_dims"}:
        return None
    return frozenset(names)


def _docstring_names(function: Any, operation: str) -> frozenset[str] | None:
    """Keyword names of a compiled (pybind11) method, from its signature line(s)."""
    doc = getattr(function, "__doc__", None) or ""
    names: set[str] = set()
    for line in doc.splitlines():
        line = re.sub(r"^\s*\d+\.\s*", "", line)
        if line.startswith(operation + "(") and "->" in line:
            names.update(_SIGNATURE_NAME.findall(line[len(operation):line.rindex("->")]))
    names.discard("self")
    return frozenset(names) or None


def _compiled_graph_classes(cudnn: Any) -> list[Any]:
    module = getattr(cudnn, "_pybind_module", None) or getattr(cudnn, "_compiled_module", None)
    classes = [getattr(module, name) for name in ("backend_graph", "pygraph") if hasattr(module, name)]
    return classes + [cudnn.pygraph]


@functools.lru_cache(maxsize=None)
def frontend_features() -> FrontendFeatures:
    """Inspect the installed cudnn-frontend once per process."""
    import cudnn  # optional dependency (the 'cuda' extra): imported only when a graph is built

    operations: dict[str, frozenset[str]] = {}
    for op in OPERATIONS:
        if not hasattr(cudnn.pygraph, op):
            continue
        names = _signature_names(getattr(cudnn.pygraph, op))
        if names is None:
            for cls in _compiled_graph_classes(cudnn):
                method = getattr(cls, op, None)
                if method is not None:
                    names = _docstring_names(method, op) or _signature_names(method)
                    if names:
                        break
        operations[op] = names or frozenset()
    graph_arguments = _signature_names(cudnn.pygraph.__init__)
    if graph_arguments is None:
        for cls in _compiled_graph_classes(cudnn):
            graph_arguments = _docstring_names(cls.__init__, "__init__")
            if graph_arguments:
                break
    return FrontendFeatures(
        version=str(getattr(cudnn, "__version__", "unknown")),
        operations=operations,
        graph_arguments=frozenset(graph_arguments or ()),
        has_kernel_cache=hasattr(cudnn, "create_kernel_cache"),
        data_types=frozenset(cudnn.data_type.__members__),
        reorderings=frozenset(getattr(getattr(cudnn, "tensor_reordering", None), "__members__", {})),
    )

