"""The live cuDNN probing engine: verdicts from building the real cuDNN frontend graphs.

A probe builds the SDPA graph of one phase of one problem (cudnn_graphs.build_graph) with no
device memory and no kernel launch, and turns the outcome into a Verdict:

    SUPPORTED     every stage up to check_support (FAST) or build_plans (FULL) passed
    UNSUPPORTED   cuDNN's "not supported" family, or a field the installed frontend cannot
                  express (stage "graph_api"); cached by the selector
    FAILED        an incident (out of memory, CUDA/driver error, unexpected exception); never cached

Cost (H200, cuDNN 9.19): the constructor pays cuDNN's one-time process initialisation (the first
handle and the first graph, a few hundred ms); after that a FAST probe is ~3 ms per graph and a
FULL probe compiles kernels (hundreds of ms cold; ~30 ms when the driver's JIT cache on disk
already holds them). FULL probes build with dynamic shapes and a kernel cache per (thread, device,
problem class, operation), so a new batch size or sequence length of a known problem class builds
in ~3 ms where cuDNN supports dynamic shapes for the graph (on Hopper: the forward).

torch is not needed: the device is queried and made current with cuda-python, cuDNN handles are
created per thread and per device on first use and destroyed when the thread ends, and graphs are
not kept after a probe. Probes of different problems may run concurrently on different threads.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Iterator

from fusedattn_select._version import __version__ as LIBRARY_VERSION
from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import PlatformError
from fusedattn_select.probing.cudnn.graphs import (
    STAGES,
    CudnnUnsupported,
    FrontendFeatures,
    GraphBuild,
    ProbeFailure,
    build_graph,
    describe_graph,
    frontend_features,
    operation_for,
)
from fusedattn_select.types import (
    Backend,
    Fingerprint,
    Outcome,
    Phase,
    ProbeDepth,
    Provenance,
    Verdict,
)

__all__ = [
    "STAGES",
    "CudnnEngine",
    "CudnnUnsupported",
    "FrontendFeatures",
    "GraphBuild",
    "ProbeFailure",
    "build_graph",
    "describe_graph",
    "device_context",
    "frontend_features",
    "handle_for",
    "kernel_cache_for",
    "operation_for",
]

# Kernel caches kept per thread and device: one per problem class (AttnConfig.shape_class_key),
# least recently used dropped first. Each holds the compiled kernels of its class.
MAX_KERNEL_CACHES_PER_THREAD = 64


# ----- cuda-python -------------------------------------------------------------------------------
def _import_driver() -> Any:
    try:
        from cuda.bindings import driver  # cuda-python >= 12.6 / cuda-bindings

        return driver
    except ImportError:
        pass
    try:
        from cuda import cuda as driver  # older cuda-python

        return driver
    except ImportError as err:
        raise PlatformError(
            f"cuda-python is not installed ({err}); install 'fusedattn-select[cuda]' to probe cuDNN"
        ) from None


def _import_cudnn() -> Any:
    try:
        import cudnn
    except ImportError as err:
        raise PlatformError(
            f"cudnn-frontend is not installed ({err}); install 'fusedattn-select[cuda]' to probe cuDNN"
        ) from None
    except OSError as err:  # the frontend found but could not load a library it links
        raise PlatformError(f"cudnn-frontend cannot load its libraries ({err})") from None
    return cudnn


class _Driver:
    """The few CUDA driver calls the engine needs, with errors turned into readable text."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def call(self, name: str, *args: Any) -> Any:
        result = getattr(self.module, name)(*args)
        if not isinstance(result, tuple):
            result = (result,)
        err, values = result[0], result[1:]
        if int(err) != 0:
            raise RuntimeError(f"{name} failed: {self.error_name(err)}")
        if not values:
            return None
        return values[0] if len(values) == 1 else values

    def error_name(self, err: Any) -> str:
        try:
            _, name = self.module.cuGetErrorName(err)
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # noqa: BLE001 -- a name is a nicety
            return str(err)

    def attribute(self, name: str, device: Any) -> int:
        return int(self.call("cuDeviceGetAttribute", getattr(self.module.CUdevice_attribute, name), device))


def _kernel_module_version() -> str:
    """The NVIDIA kernel driver version (e.g. 580.82.07), when the proc file is readable."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return ""
    for token in text.split():
        parts = token.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return token
    return ""


# ----- devices and their primary contexts -------------------------------------------------------
_DRIVER: _Driver | None = None
_CONTEXTS: dict[int, Any] = {}
_DEVICE_LOCK = threading.Lock()


def _driver() -> _Driver:
    """cuda-python's driver API, initialised once (PlatformError when unusable)."""
    global _DRIVER
    with _DEVICE_LOCK:
        if _DRIVER is None:
            driver = _Driver(_import_driver())
            try:
                driver.call("cuInit", 0)
                count = int(driver.call("cuDeviceGetCount"))
            except RuntimeError as err:
                raise PlatformError(f"no usable CUDA device ({err})") from None
            if count == 0:
                raise PlatformError("no CUDA device is visible (cuDeviceGetCount returned 0)")
            driver.device_count = count
            _DRIVER = driver
        return _DRIVER


def _device_ordinal(device: Any = None) -> int:
    """A CUDA device ordinal from an int, "cuda:N", a torch.device, or None (the current device)."""
    if device is None or getattr(device, "index", 0) is None or device == "cuda":
        driver = _driver()
        try:
            context = driver.call("cuCtxGetCurrent")
            if int(context) != 0:
                return int(driver.call("cuCtxGetDevice"))
        except RuntimeError:
            pass
        return 0
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if isinstance(index, int):
        return index
    kind, _, tail = str(device).partition(":")
    if kind == "cuda" and tail.isdigit():
        return int(tail)
    raise PlatformError(f"device={device!r}: expected a CUDA device ordinal, 'cuda:N' or a torch.device")


def _primary_context(device: int) -> Any:
    """The device's primary CUDA context (the one torch and the runtime use), retained once."""
    driver = _driver()
    with _DEVICE_LOCK:
        context = _CONTEXTS.get(device)
        if context is None:
            if not 0 <= device < driver.device_count:
                raise PlatformError(f"CUDA device {device} does not exist ({driver.device_count} visible)")
            try:
                context = driver.call("cuDevicePrimaryCtxRetain", driver.call("cuDeviceGet", device))
            except RuntimeError as err:
                raise PlatformError(f"cannot use CUDA device {device} ({err})") from None
            _CONTEXTS[device] = context
        return context


@contextlib.contextmanager
def device_context(device: int) -> Iterator[None]:
    """Make `device`'s primary context current on this thread; restore the caller's afterwards."""
    driver, context = _driver(), _primary_context(device)
    previous = driver.call("cuCtxGetCurrent")
    switch = int(previous) != int(context)
    if switch:
        driver.call("cuCtxSetCurrent", context)
    try:
        yield
    finally:
        if switch:
            driver.call("cuCtxSetCurrent", previous)


# ----- per-thread cuDNN resources ---------------------------------------------------------------
class _ThreadResources:
    """One thread's cuDNN handle and kernel caches for one device."""

    __slots__ = ("handle", "kernel_caches")

    def __init__(self) -> None:
        self.handle: Any = None
        self.kernel_caches: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()


class _ThreadHolder:
    """Owns a thread's resources; when the thread ends the holder is collected and its handles destroyed."""

    def __init__(self) -> None:
        self.by_device: dict[int, _ThreadResources] = {}
        self.handles: list[Any] = []
        finalizer = weakref.finalize(self, _destroy_handles, self.handles)
        finalizer.atexit = False  # at interpreter exit the process releases everything anyway


def _destroy_handles(handles: list[Any]) -> None:
    try:
        import cudnn
    except ImportError:
        return
    while handles:
        handle = handles.pop()
        try:
            cudnn.destroy_handle(handle)
        except Exception:  # noqa: BLE001 -- the device may already be gone
            pass


_LOCAL = threading.local()


@atexit.register
def _release_main_thread_resources() -> None:
    # Other threads' resources went with their threads; the main thread's go before the
    # interpreter tears the cudnn module down (else nanobind reports them as leaked).
    holder = getattr(_LOCAL, "holder", None)
    if holder is not None:
        holder.by_device.clear()
        _destroy_handles(holder.handles)
        del _LOCAL.holder


def _resources(device: int) -> _ThreadResources:
    """This thread's resources on `device`, with its handle (call with the device's context current)."""
    holder = getattr(_LOCAL, "holder", None)
    if holder is None:
        holder = _LOCAL.holder = _ThreadHolder()
    resources = holder.by_device.get(device)
    if resources is None:
        resources = holder.by_device[device] = _ThreadResources()
    if resources.handle is None:
        resources.handle = _import_cudnn().create_handle()
        holder.handles.append(resources.handle)
    return resources


def _kernel_cache(resources: _ThreadResources, cfg: AttnConfig, operation: str) -> Any:
    # A cuDNN kernel cache binds to the operation graph it first builds, so forward and backward
    # (and F16 and FP8) graphs of one problem class get separate caches.
    if not frontend_features().dynamic_shapes:
        return None
    key = (cfg.shape_class_key(), operation)
    caches = resources.kernel_caches
    cache = caches.get(key)
    if cache is None:
        cache = caches[key] = _import_cudnn().create_kernel_cache()
        while len(caches) > MAX_KERNEL_CACHES_PER_THREAD:
            caches.popitem(last=False)
    else:
        caches.move_to_end(key)
    return cache


def handle_for(device: Any = None) -> Any:
    """This thread's cuDNN handle on `device` (int, "cuda:N", torch.device; None = current device).

    Handles are created on first use, one per thread and device (cuDNN forbids sharing one across
    threads), and destroyed when the thread ends.
    """
    ordinal = _device_ordinal(device)
    with device_context(ordinal):
        return _resources(ordinal).handle


def kernel_cache_for(cfg: AttnConfig, backend: Backend, phase: Phase, device: Any = None) -> Any:
    """This thread's kernel cache for the problem class of `cfg` and the graph of `phase` on `backend`.

    Pass it to build_graph: graphs of one class (same problem but batch size and sequence lengths)
    then reuse compiled kernels. None when the frontend has no dynamic shapes.
    """
    ordinal = _device_ordinal(device)
    with device_context(ordinal):
        return _kernel_cache(_resources(ordinal), cfg, operation_for(cfg, backend, phase))


# ----- the engine ------------------------------------------------------------------------------
class CudnnEngine:
    """Ground-truth verdicts from cuDNN on one CUDA device (the ProbeEngine protocol).

    `device` is a CUDA device ordinal (or "cuda:N" / torch.device); None means the device of the
    calling thread's current CUDA context, else device 0. The constructor initialises CUDA and
    cuDNN and (with `warm_up`) builds one small graph, so cuDNN's one-time library loading is paid
    here, not by the first probe: `init_ms` is the whole cost (a few hundred ms once per process),
    `warm_up_ms` its graph part. Raises PlatformError when cudnn-frontend or cuda-python cannot be
    imported, no CUDA device exists, or libcudnn cannot be loaded.
    """

    name = "cudnn"
    provenance = Provenance.LIVE_PROBE

    def __init__(self, device: Any = None, *, warm_up: bool = True) -> None:
        started = time.perf_counter()
        self._cudnn = _import_cudnn()
        self._driver = _driver()
        self.device = _device_ordinal(device)
        _primary_context(self.device)
        try:
            backend_version = int(self._cudnn.backend_version())
        except Exception as err:  # noqa: BLE001 -- any failure here means libcudnn is unusable
            raise PlatformError(f"libcudnn cannot be loaded ({type(err).__name__}: {err})") from None
        self.features: FrontendFeatures = frontend_features()
        try:
            with device_context(self.device):
                _resources(self.device)
        except Exception as err:  # noqa: BLE001
            raise PlatformError(
                f"cannot create a cuDNN handle on CUDA device {self.device} ({type(err).__name__}: {err})"
            ) from None
        self._fingerprint = self._read_fingerprint(backend_version)
        self.warm_up_ms = self._warm_up() if warm_up else 0.0
        self.init_ms = (time.perf_counter() - started) * 1e3

    # ----- the ProbeEngine protocol ------------------------------------------------------------
    def fingerprint(self) -> Fingerprint:
        return self._fingerprint

    def probe(self, cfg: AttnConfig, backend: Backend, phase: Phase,
              depth: ProbeDepth = ProbeDepth.FAST) -> Verdict:
        """The verdict for one phase of `cfg` on `backend`; never raises for cuDNN outcomes.

        FAST builds a static graph up to check_support. FULL also compiles the kernels, with dynamic
        shapes and this thread's kernel cache for the problem class; where cuDNN rejects dynamic
        shapes for the graph, build_graph builds it static (noted in Verdict.detail), so the verdict
        is about the problem, not about dynamic shapes.
        """
        depth = ProbeDepth(depth)
        try:
            with device_context(self.device):
                resources = _resources(self.device)
                cache = None
                if depth is ProbeDepth.FULL:
                    cache = _kernel_cache(resources, cfg, operation_for(cfg, backend, phase))
                build = build_graph(cfg, backend, phase, handle=resources.handle, depth=depth, kernel_cache=cache)
                timings, last_stage, note = build.timings_ms, next(reversed(build.timings_ms)), build.note
                del build  # graphs are not kept: probing thousands of problems keeps memory flat
        except CudnnUnsupported as err:
            return self._verdict(backend, phase, Outcome.UNSUPPORTED, err.stage, err.message, err.detail,
                                 depth, err.timings_ms)
        except ProbeFailure as err:
            return self._verdict(backend, phase, Outcome.FAILED, err.stage, err.message, err.detail,
                                 depth, err.timings_ms)
        except Exception as err:  # noqa: BLE001 -- a probe reports incidents, it does not raise them
            text = f"{type(err).__name__}: {err}"
            return self._verdict(backend, phase, Outcome.FAILED, "probe", text, text, depth, {})
        return self._verdict(backend, phase, Outcome.SUPPORTED, last_stage, "", note, depth, timings)

    # ----- for dispatch ------------------------------------------------------------------------
    def build(self, cfg: AttnConfig, backend: Backend, phase: Phase, depth: ProbeDepth = ProbeDepth.FULL,
              *, dynamic_shapes: bool = True) -> GraphBuild:
        """Build (FULL: and compile) the graph on this thread's handle, to execute it.

        With `dynamic_shapes` this thread's kernel cache for the problem class is used, so another
        batch size or sequence length reuses compiled kernels. Raises CudnnUnsupported or
        ProbeFailure like build_graph. Execute the graph with `self.handle()` on this thread.
        """
        with device_context(self.device):
            resources = _resources(self.device)
            cache = _kernel_cache(resources, cfg, operation_for(cfg, backend, phase)) if dynamic_shapes else None
            return build_graph(cfg, backend, phase, handle=resources.handle, depth=ProbeDepth(depth),
                               kernel_cache=cache)

    def handle(self) -> Any:
        """This thread's cuDNN handle on the engine's device."""
        return handle_for(self.device)

    # ----- internals ---------------------------------------------------------------------------
    def _warm_up(self) -> float:
        """Build one small graph: cuDNN loads its engine libraries on the first heuristics query
        (~250 ms), which would otherwise land in the timings of the first real probe."""
        started = time.perf_counter()
        cfg = AttnConfig(batch_size=1, num_heads_q=1, num_heads_kv=1, seqlen_q=64, seqlen_kv=64,
                         head_dim_qk=64, is_training=False)
        self.probe(cfg, Backend.F16, Phase.FORWARD, ProbeDepth.FAST)
        return (time.perf_counter() - started) * 1e3

    @staticmethod
    def _verdict(backend: Backend, phase: Phase, outcome: Outcome, stage: str, message: str,
                 detail: str, depth: ProbeDepth, timings: dict[str, float]) -> Verdict:
        return Verdict(
            backend=backend, phase=phase, outcome=outcome, stage=stage, message=message,
            detail=detail, provenance=Provenance.LIVE_PROBE, depth=depth,
            timings_ms=tuple((name, float(ms)) for name, ms in timings.items()),
        )

    def _read_fingerprint(self, backend_version: int) -> Fingerprint:
        driver = self._driver
        device = driver.call("cuDeviceGet", self.device)
        raw_name = driver.call("cuDeviceGetName", 256, device)
        name = raw_name.decode(errors="replace") if isinstance(raw_name, bytes) else str(raw_name)
        major = driver.attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", device)
        minor = driver.attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", device)
        sm_count = driver.attribute("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", device)
        cuda_version = int(driver.call("cuDriverGetVersion"))
        cuda = f"CUDA {cuda_version // 1000}.{cuda_version % 1000 // 10}"
        kernel_module = _kernel_module_version()
        return Fingerprint(
            platform="cuda",
            device_name=name.split("\x00", 1)[0].strip(),
            compute_capability=f"{major}.{minor}",
            sm_count=sm_count,
            cudnn_backend_version=backend_version,
            cudnn_frontend_version=self.features.version,
            driver_version=f"{kernel_module} ({cuda})" if kernel_module else cuda,
            library_version=LIBRARY_VERSION,
        )
