"""The live cuDNN probing engine: verdicts from building the real cuDNN frontend graphs.

A probe builds the SDPA graph of one phase of one problem (graphs.build_graph) with no device
memory and no kernel launch, and turns the outcome into a Verdict:

    SUPPORTED     every stage up to check_support (FAST) or build_plans (FULL) passed
    UNSUPPORTED   cuDNN's "not supported" family, or a field the installed frontend cannot
                  express (stage "graph_api"); cached by the selector
    FAILED        an incident (out of memory, CUDA/driver error, unexpected exception); never cached

Cost (measured in docs/performance.md, "Measured facts behind the design"): cuDNN's one-time
process initialisation (the first handle, then the first graph: the warm-up) is paid by the
constructor, or with `warm_up=False` the handle there and the graph before the first probe; after
that a FAST probe costs milliseconds per graph and a FULL probe compiles kernels (much less when
the driver's JIT cache on disk already holds them). FULL probes build with dynamic shapes and a
kernel cache per (thread, device, problem class, operation), so a new batch size or sequence length
of a known problem class builds in about a FAST probe's time where cuDNN supports dynamic shapes
for the graph (on Hopper: the forward).

torch is not needed (see cudnn_device.py); graphs are not kept after a probe. Probes of different
problems may run concurrently on different threads.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import PlatformError
from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.probing.cudnn.cudnn_device import (
    backend_version,
    cuda_driver,
    device_context,
    device_ordinal,
    handle_for,
    primary_context,
    read_fingerprint,
    thread_kernel_cache,
    thread_resources,
)
from fusedattn_select.probing.cudnn.features import FrontendFeatures, frontend_features
from fusedattn_select.probing.cudnn.graphs import GraphBuild, build_graph, operation_for
from fusedattn_select.probing.cudnn.messages import CudnnUnsupported, ProbeFailure, verdict_from_exception
from fusedattn_select.probing.cudnn.numerics import verify
from fusedattn_select.probing.cudnn.plan_graphs import dispatch_plan_key, serialize_build
from fusedattn_select.probing.frontend import import_cudnn
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, ProbeDepth, Provenance, Verdict


class CudnnEngine:
    """Ground-truth verdicts from cuDNN on one CUDA device (the ProbeEngine and PlanBuilder protocols).

    `device` is a CUDA device ordinal (or "cuda:N" / torch.device); None means the device of the
    calling thread's current CUDA context, else device 0. The constructor initialises CUDA and
    cuDNN (`init_ms`) and, with `warm_up`, builds one small graph (`warm_up()`, `warm_up_ms`):
    cuDNN loads its engine libraries on the first heuristics query, which is then not timed as
    part of a probe. Without it the first probe warms up first; an engine that only loads stored
    plans never builds the graph. Raises PlatformError when cudnn-frontend or cuda-python cannot
    be imported, no CUDA device exists, or libcudnn cannot be loaded.
    """

    name = "cudnn"
    provenance = Provenance.LIVE_PROBE

    def __init__(self, device: Any = None, *, warm_up: bool = True) -> None:
        started = time.perf_counter()
        cudnn = import_cudnn()
        cuda_driver()
        self.device = device_ordinal(device)
        primary_context(self.device)
        version = backend_version(cudnn)
        self.features: FrontendFeatures = frontend_features()
        try:
            with device_context(self.device):
                thread_resources(self.device)
        except Exception as err:  # noqa: BLE001
            raise PlatformError(
                f"cannot create a cuDNN handle on CUDA device {self.device} ({type(err).__name__}: {err})"
            ) from None
        self._fingerprint = read_fingerprint(self.device, version)
        self.warm_up_ms = 0.0
        self._renew_locks()
        renew_locks_after_fork(self)
        self._warmed = False
        self.init_ms = (time.perf_counter() - started) * 1e3
        if warm_up:
            self.warm_up()

    # ----- the ProbeEngine protocol ------------------------------------------------------------
    def fingerprint(self) -> Fingerprint:
        return self._fingerprint

    def probe(self, cfg: AttnConfig, backend: Backend, phase: Phase,
              depth: ProbeDepth = ProbeDepth.FAST) -> Verdict:
        """The verdict for one phase of `cfg` on `backend`; never raises for cuDNN outcomes.

        FAST builds a static graph up to check_support. FULL also compiles the kernels, with dynamic
        shapes and this thread's kernel cache for the problem class; where cuDNN rejects dynamic
        shapes for the graph, build_graph builds it static (noted in Verdict.detail), so the verdict
        is about the problem, not about dynamic shapes. VERIFY builds the graphs as dispatch does,
        runs them on seeded data and compares with a float32 reference (numerics.py); it raises
        PlatformError where torch with CUDA is missing.
        """
        depth = ProbeDepth.parse(depth, "depth")
        if not self._warmed:
            self.warm_up()
        return self._probe(cfg, backend, phase, depth)

    def _probe(self, cfg: AttnConfig, backend: Backend, phase: Phase, depth: ProbeDepth) -> Verdict:
        if depth is ProbeDepth.VERIFY:
            return verify(self, cfg, backend, phase)
        try:
            with device_context(self.device):
                resources = thread_resources(self.device)
                cache = None
                if depth is ProbeDepth.FULL:
                    cache = thread_kernel_cache(resources, cfg, operation_for(cfg, backend, phase))
                build = build_graph(cfg, backend, phase, handle=resources.handle, depth=depth, kernel_cache=cache)
                timings, last_stage, note = build.timings_ms, next(reversed(build.timings_ms)), build.note
                del build  # graphs are not kept: probing thousands of problems keeps memory flat
        except Exception as err:  # noqa: BLE001 -- a probe reports rejections and incidents, it does not raise them
            return verdict_from_exception(err, backend, phase, depth, "probe")
        return Verdict(
            backend=backend, phase=phase, outcome=Outcome.SUPPORTED, stage=last_stage, message="",
            detail=note, provenance=Provenance.LIVE_PROBE, depth=depth,
            timings_ms=tuple((name, float(ms)) for name, ms in timings.items()),
        )

    # ----- for dispatch ------------------------------------------------------------------------
    def build(self, cfg: AttnConfig, backend: Backend, phase: Phase, depth: ProbeDepth = ProbeDepth.FULL,
              *, dynamic_shapes: bool = True) -> GraphBuild:
        """Build (FULL: and compile) the graph on this thread's handle, to execute it.

        With `dynamic_shapes` this thread's kernel cache for the problem class is used, so another
        batch size or sequence length reuses compiled kernels. Raises CudnnUnsupported or
        ProbeFailure like build_graph. Execute the graph with `self.handle()` on this thread.
        """
        with device_context(self.device):
            resources = thread_resources(self.device)
            cache = thread_kernel_cache(resources, cfg, operation_for(cfg, backend, phase)) if dynamic_shapes else None
            return build_graph(cfg, backend, phase, handle=resources.handle,
                               depth=ProbeDepth.parse(depth, "depth"), kernel_cache=cache)

    def handle(self) -> Any:
        """This thread's cuDNN handle on the engine's device."""
        return handle_for(self.device)

    # ----- the PlanBuilder protocol: plans for warmup ------------------------------------------
    def plan_key(self, cfg: AttnConfig, backend: Backend, phase: Phase) -> str | Verdict:
        """The plan key attention() looks up for `phase` of `cfg`, or the verdict when the installed
        frontend cannot describe the graph (then no plan of it exists)."""
        try:
            with device_context(self.device):
                return dispatch_plan_key(cfg, backend, phase, handle=handle_for(self.device)).key
        except (CudnnUnsupported, ProbeFailure) as err:
            return verdict_from_exception(err, backend, phase, ProbeDepth.FULL)

    def build_plan(self, cfg: AttnConfig, backend: Backend, phase: Phase, plan_key: str) -> bytes | Verdict:
        """The plan of `phase` of `cfg` built as dispatch builds it (FULL, static, this thread's
        handle) and serialized for `plan_key`, or the verdict when it does not build."""
        try:
            with device_context(self.device):
                build = build_graph(cfg, backend, phase, handle=handle_for(self.device), depth=ProbeDepth.FULL)
        except (CudnnUnsupported, ProbeFailure) as err:
            return verdict_from_exception(err, backend, phase, ProbeDepth.FULL)
        return serialize_build(build, plan_key)

    # ----- internals ---------------------------------------------------------------------------
    def _renew_locks(self) -> None:
        # Fresh in a forked child: a warm-up another thread of the parent was in stays held there for ever
        # (the child's first probe then raises CUDA's error about forked processes instead of hanging).
        self._warm = threading.Lock()

    def warm_up(self) -> None:
        """Build one small graph, once per engine: cuDNN loads its engine libraries on the first
        heuristics query, which would otherwise land in the timings of the first real probe."""
        if self._warmed:
            return
        with self._warm:  # a probe on another thread meanwhile waits for it
            if self._warmed:
                return
            started = time.perf_counter()
            cfg = AttnConfig(batch_size=1, num_heads_q=1, num_heads_kv=1, seqlen_q=64, seqlen_kv=64,
                             head_dim_qk=64, is_training=False)
            self._probe(cfg, Backend.F16, Phase.FORWARD, ProbeDepth.FAST)
            self.warm_up_ms = (time.perf_counter() - started) * 1e3
            self._warmed = True
