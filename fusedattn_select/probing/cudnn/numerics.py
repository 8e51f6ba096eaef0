"""Probe depth `verify`: build a problem's graphs as dispatch builds them, run them twice on seeded
data and compare the results with a float32 reference computed on the same GPU.

"It builds" is not "it computes right": a verdict at depth verify is SUPPORTED at stage "numerics"
only when every output (forward: O, and the softmax stats when training; backward: dQ, dK, dV, and
dBias / dSink where the graph has them) is within `tolerance` of the reference; otherwise it is
UNSUPPORTED at stage "numerics" with the measured errors in its message. Build rejections keep
their cuDNN stage; incidents (out of memory, CUDA errors) are FAILED and never cached.

The graphs are built static, without the kernel cache (runtime/plans.build_plan builds the plans
attention() runs that way), on a cuDNN handle of this module's own, so the stream of the handle
dispatch shares is never changed. A training problem's backward check reuses the tensors of its
forward check on the same thread (the selector probes forward, then backward).

Problems verify cannot check (MXFP8 block scales, tensors it has no data for) are answered by the
depth-full probe, at depth verify, stage unchanged, with "numerics not checked: <why>" in the
detail: Verdict.verified is False for them.

Importing this module does not import torch; `verify` does (PlatformError when it is missing).
docs/verify.md documents the data, the reference, the tolerances and the dropout check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import PlatformError
from fusedattn_select.probing.cudnn.cudnn_device import device_context
from fusedattn_select.probing.cudnn.messages import verdict_from_exception
from fusedattn_select.probing.cudnn.tolerances import SEED, UNIT_ROUNDOFF, Check, Planted, tolerance
from fusedattn_select.probing.frontend import import_cudnn
from fusedattn_select.types import NUMERICS_STAGE, Backend, Outcome, Phase, ProbeDepth, Provenance, Verdict

log = logging.getLogger("fusedattn_select")

__all__ = ["SEED", "Check", "Planted", "numerics_verdict", "planted", "tolerance", "unchecked_reason", "verify"]

def unchecked_reason(cfg: AttnConfig, backend: Backend) -> str:
    """Why verify cannot check the graphs of `cfg` on `backend` ("" when it can)."""
    if backend is Backend.FP8 or cfg.is_fp8:
        if cfg.resolved_scaling_mode == "mxfp8":
            return "MXFP8 graphs (verify binds no block scales)"
        return ""
    names = {"o_dtype": cfg.resolved_o_dtype}
    if cfg.is_training:
        names.update(do_dtype=cfg.resolved_do_dtype, dqkv_dtype=cfg.resolved_dqkv_dtype)
    for field_name, value in names.items():
        if value not in UNIT_ROUNDOFF:
            return f"{field_name}={value!r} (verify compares 16-bit results)"
    return ""


def require_torch() -> Any:
    """torch, with a CUDA device; PlatformError saying what depth verify needs otherwise."""
    try:
        import torch
    except ImportError:
        raise PlatformError("probe depth 'verify' runs the graphs with torch, which is not installed: "
                            "install torch with CUDA, or ask at depth 'full'") from None
    if not torch.cuda.is_available():
        raise PlatformError("probe depth 'verify' runs the graphs with torch, which sees no CUDA device "
                            f"(torch {torch.__version__}); ask at depth 'full'")
    return torch


# ----- the module's state: the test seam, and each thread's handles --------------------------------
class _State:
    """The planted error of the test seam (None outside `planted`) and the per-thread verify handles."""

    def __init__(self) -> None:
        self.planted: Planted | None = None
        self.local = threading.local()


_state = _State()


@contextlib.contextmanager
def planted(graph_config: Callable[[AttnConfig], AttnConfig] | None = None,
            after_execute: Callable[[Phase, dict], None] | None = None) -> Iterator[None]:
    """Within the block, every verify builds and runs with the planted error (tests only)."""
    previous, _state.planted = _state.planted, Planted(graph_config, after_execute)
    try:
        yield
    finally:
        _state.planted = previous


# ----- the check ---------------------------------------------------------------------------------

def _handle(device: int, torch: Any) -> Any:
    """This thread's verify handle on `device`, pointed at torch's current stream."""
    handles = getattr(_state.local, "handles", None)
    if handles is None:
        handles = _state.local.handles = {}
    cudnn = import_cudnn()
    handle = handles.get(device)
    if handle is None:
        handle = handles[device] = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
    return handle


def verify(engine: Any, cfg: AttnConfig, backend: Backend, phase: Phase) -> Verdict:
    """The depth-verify verdict for one phase of `cfg` on `backend` on `engine`'s device (a CudnnEngine).

    Raises PlatformError when torch (with CUDA) is missing; every other failure is a verdict.
    """
    reason = unchecked_reason(cfg, backend)
    if reason:
        _state.local.forward = None  # a training forward's tensors no check of this thread will read
        return _unchecked(engine, cfg, backend, phase, reason)
    torch = require_torch()
    from fusedattn_select.probing.cudnn import verify_checks  # imports torch

    seam = _state.planted or Planted()
    try:
        with torch.cuda.device(engine.device), device_context(engine.device):
            handle = _handle(engine.device, torch)
            if phase is Phase.FORWARD:
                timings, checks, note = verify_checks.forward(cfg, backend, handle, engine.device, seam, _state.local)
            else:
                timings, checks, note = verify_checks.backward(cfg, backend, handle, engine.device, seam, _state.local)
    except verify_checks.Unbindable as err:
        return _unchecked(engine, cfg, backend, phase, str(err))
    except Exception as err:  # noqa: BLE001 -- rejections and incidents are verdicts, as in a probe
        return verdict_from_exception(err, backend, phase, ProbeDepth.VERIFY, NUMERICS_STAGE)
    return numerics_verdict(backend, phase, checks, timings, note)


def numerics_verdict(backend: Backend, phase: Phase, checks: list[Check], timings: dict[str, float],
                     note: str = "") -> Verdict:
    """SUPPORTED at stage numerics when every check passed, else UNSUPPORTED naming the failed ones."""
    failed = [c for c in checks if not c.passed]
    described = "; ".join(c.describe() for c in checks)
    detail = f"compared with the float32 reference on seeded data (seed {SEED}): {described}"
    if note:
        detail = f"{detail}; {note}"
    message = ""
    if failed:
        message = "results differ from the float32 reference: " + "; ".join(c.describe() for c in failed)
        log.warning("fusedattn_select: %s %s %s", backend.value, phase.value, message)
    return Verdict(
        backend=backend, phase=phase, outcome=Outcome.UNSUPPORTED if failed else Outcome.SUPPORTED,
        stage=NUMERICS_STAGE, message=message, detail=detail, provenance=Provenance.LIVE_PROBE,
        depth=ProbeDepth.VERIFY, timings_ms=tuple((name, float(ms)) for name, ms in timings.items()),
    )


def _unchecked(engine: Any, cfg: AttnConfig, backend: Backend, phase: Phase, reason: str) -> Verdict:
    """The depth-full verdict, at depth verify, saying the numerics were not checked and why."""
    verdict = engine.probe(cfg, backend, phase, ProbeDepth.FULL)
    if verdict.outcome is Outcome.FAILED:
        return verdict
    note = f"numerics not checked: {reason}"
    return dataclasses.replace(verdict, depth=ProbeDepth.VERIFY,
                               detail=f"{verdict.detail}; {note}" if verdict.detail else note)
