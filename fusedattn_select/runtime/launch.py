"""The frontend's own launch of a built cuDNN backend plan, without pygraph.execute's per-call Python.

cudnn-frontend 1.32's `pygraph.execute(buffers, workspace, handle=..., tensor_uids=...)` spends a few
microseconds per call in Python deciding what it decided on the first call: which plan is selected,
whether a Python engine serves it, the binding schema. For a graph that the cuDNN backend serves,
`direct_launcher` takes those answers once and returns a function that makes the same two calls into
the frontend's compiled module that execute() ends in. It reads frontend internals, so it is found
by feature detection and used only after a public execute of the same plan succeeded; where anything
is missing it returns None and plans keep the public execute. FUSEDATTN_SELECT_DIRECT_LAUNCH=0 turns
it off.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from fusedattn_select import settings
from fusedattn_select.runtime.run_settings import run_settings

log = logging.getLogger("fusedattn_select")

ENV_VAR = settings.DIRECT_LAUNCH
Launcher = Callable[[tuple, Any, Any], None]


def enabled() -> bool:
    """Whether direct launches are allowed ("0" turns them off; "", "1" leave them on)."""
    return run_settings.get().direct_launch  # ConfigError naming a variable when one is invalid


def direct_launcher(graph: Any, uids: tuple[int, ...]) -> Optional[Launcher]:
    """launch(buffers, workspace, handle) for a built graph the cuDNN backend serves, binding
    `buffers` in `uids` order as execute(..., tensor_uids=uids) does; None when the graph or this
    frontend does not offer it."""
    if not enabled():
        return None
    try:
        lowered = graph._lowered_graph
        if lowered is None or not graph._is_built or graph.selected_engine is not None:
            return None  # not built yet, or a Python engine of the frontend serves it
        schema = graph._prepare_ordered_binding_schema()
        if schema is None:
            return None
        cpp_index = -1
        if graph._plans:
            placed = graph._materialize_backend_plan(graph._plan_index).cpp_index
            cpp_index = -1 if placed is None else placed
        bindings = graph._data_bindings
        execute_ordered, execute_pack, finish = lowered._execute_ordered, lowered._execute_ordered_pack, \
            graph._finish_ordered
    except AttributeError as err:
        log.debug("fusedattn_select: no direct launch with this cudnn-frontend (%s)", err)
        return None

    def launch(buffers: tuple, workspace: Any, handle: Any) -> None:
        backend_handle = getattr(handle, "backend_handle", handle) or 0
        result = execute_ordered(schema, buffers, uids, bindings, workspace, None, None, None, backend_handle,
                                 cpp_index)
        if result is not None:  # a buffer the compiled reader could not describe: the frontend's completion
            pack = finish(schema, result, workspace, None)
            execute_pack(pack.native, pack.workspace, backend_handle, cpp_index)

    return launch
