"""The functions the "fusedattn" mask and attention functions call, imported once by `register()`.

torch.compile cannot trace an import from transformers' lazy modules (torch 2.11: a graph break,
an error with fullgraph=True), so nothing that runs inside a traced model imports: it reads the
`Dependencies` that `register()` loaded. transformers and the torch-side runtime are optional
dependencies of the package, hence the imports inside `load()`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple


class Dependencies(NamedTuple):
    masking_utils: Any
    sdpa_attention_forward: Callable
    dispatch_attention: Callable
    reference_attention: Callable
    deterministic: Callable[[], bool]  # torch.are_deterministic_algorithms_enabled


_loaded: Dependencies | None = None


def load() -> Dependencies:
    """Import the dependencies (once); call before any tracing."""
    global _loaded
    if _loaded is None:
        import torch
        from transformers import masking_utils
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        from fusedattn_select.reference.autograd_reference import reference_attention
        from fusedattn_select.runtime.api import attention

        _loaded = Dependencies(masking_utils, sdpa_attention_forward, attention, reference_attention,
                               torch.are_deterministic_algorithms_enabled)
    return _loaded


def loaded() -> Dependencies:
    """The dependencies `register()` imported (imported here if it has not run)."""
    return _loaded or load()
