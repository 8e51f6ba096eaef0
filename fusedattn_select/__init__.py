"""fusedattn-select: which fused attention backend runs this problem on this GPU, and if none, why.

Answers come from building the real cuDNN graphs for the problem (or from a snapshot recorded on
a real device), never from hand-written support tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusedattn_select._version import __version__
from fusedattn_select.config import AttnConfig
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import ConfigError, FusedAttnSelectError
from fusedattn_select.result import Selection
from fusedattn_select.selection.selector import cache_info, clear_cache, get_backend, select, use_snapshots
from fusedattn_select.types import Backend, Verdict

if TYPE_CHECKING:  # what __getattr__ imports when asked, for type checkers (importing the package needs no torch)
    from fusedattn_select.runtime.api import FP8History, FP8Scales, FP8Tensor, attention, dispatch_info
    from fusedattn_select.selection.local_warmup import warmup

__all__ = [
    "AttnConfig",
    "Backend",
    "ConfigError",
    "FP8History",
    "FP8Scales",
    "FP8Tensor",
    "FusedAttnSelectError",
    "Selection",
    "Verdict",
    "__version__",
    "attention",
    "cache_info",
    "clear_cache",
    "dispatch_info",
    "get_backend",
    "load_config_file",
    "select",
    "use_snapshots",
    "warmup",
]


def __getattr__(name: str) -> Any:
    # attention() and dispatch_info() need torch and warmup() may need cuDNN: import them only when
    # asked for, so importing the package works on a machine with neither.
    if name in ("attention", "dispatch_info", "FP8History", "FP8Scales", "FP8Tensor"):
        try:
            from fusedattn_select.runtime import api
        except ModuleNotFoundError as err:
            if err.name != "torch":
                raise
            raise ModuleNotFoundError(f"fusedattn_select.{name} needs torch, which is not installed: "
                                      "pip install 'fusedattn-select[torch]'", name="torch") from err
        return getattr(api, name)
    if name == "warmup":
        from fusedattn_select.selection.local_warmup import warmup

        return warmup
    raise AttributeError(f"module 'fusedattn_select' has no attribute {name!r}")
