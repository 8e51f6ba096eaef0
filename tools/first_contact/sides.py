"""What each side runs, and the timing every worker shares.

"ours": fusedattn_select.attention (models: attn_implementation "fusedattn", registered by
fusedattn_select.integrations.transformers.register()); "flash": torch SDPA pinned to its flash
backend (models: "sdpa" under sdpa_kernel(FLASH_ATTENTION)); "default": torch SDPA's own choice.
torch is passed in; the library is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tools.bench.shapes_hf import FUSEDATTN, IMPLEMENTATIONS, SDPA, SDPA_FLASH, pinned

SIDES = ("ours", "flash", "default")
HF_LABELS = {"ours": FUSEDATTN, "flash": SDPA_FLASH, "default": SDPA}
# Where the workers run: "cuda", or "cpu" for a smoke run of the code paths (no figure means anything).
DEVICE_ENV = "FIRST_CONTACT_DEVICE"


def device() -> str:
    return os.environ.get(DEVICE_ENV, "cuda")


def sync(torch: Any) -> None:
    if device() == "cuda":
        torch.cuda.synchronize()


def timed_ms(torch: Any, work: Callable[[], Any]) -> float:
    """ms of work(), the device synchronised before and after."""
    sync(torch)
    started = time.perf_counter()
    work()
    sync(torch)
    return (time.perf_counter() - started) * 1e3


def attention_call(torch: Any, side: str) -> Callable[[Any, Any, Any, bool], Any]:
    """f(q, k, v, causal) on BSHD tensors for `side` (importing what that side imports)."""
    if side == "ours":
        from fusedattn_select import attention

        return lambda q, k, v, causal: attention(q, k, v, mask="causal" if causal else "no_mask")
    if side not in SIDES:
        raise ValueError(f"side={side!r}: must be one of {', '.join(SIDES)}")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    functional = torch.nn.functional

    def sdpa(q: Any, k: Any, v: Any, causal: bool) -> Any:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        gqa = q.shape[1] != k.shape[1]
        if side == "flash":
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                out = functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        else:
            out = functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        return out.transpose(1, 2)

    return sdpa


def hf_implementation(side: str) -> str:
    """The attn_implementation a transformers model of `side` is built with (registered for "ours")."""
    if side == "ours":
        from fusedattn_select.integrations.transformers import register

        register()
    return IMPLEMENTATIONS[HF_LABELS[side]][0]


@contextlib.contextmanager
def hf_context(side: str) -> Iterator[None]:
    """The context a model's calls run in: SDPA pinned to flash for "flash", nothing for the others."""
    with pinned(HF_LABELS[side]):
        yield


def dispatch_record() -> dict[str, Any]:
    """fusedattn_select.dispatch_info() as it stands, and the compiled module's status."""
    import fusedattn_select

    out: dict[str, Any] = {"dispatch_info": dict(fusedattn_select.dispatch_info())}
    try:
        from fusedattn_select.runtime import native

        status = native.status()
        # Loaded in this process: imported under its file's name (asking load() here would load it).
        loaded = bool(status.get("module")) and Path(status["module"]).stem in sys.modules
        out["native"] = {"status": status, "loaded": loaded}
    except Exception as err:  # noqa: BLE001 - a record, never a reason to lose the figures
        out["native"] = {"error": f"{type(err).__name__}: {err}"}
    return out
