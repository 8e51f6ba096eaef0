"""The CUDA device and this process's cuDNN resources, without torch.

The device is queried and made current with cuda-python (the driver API, initialised once per
process); the primary context of each device is retained once. cuDNN handles and kernel caches are
created per thread and per device on first use (cuDNN forbids sharing a handle across threads) and
destroyed when the thread ends. Also here: the version of the loaded libcudnn and the device
fingerprint verdicts are filed under.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import threading
import weakref
from pathlib import Path
from typing import Any, Iterator

from fusedattn_select._version import __version__ as LIBRARY_VERSION
from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import PlatformError
from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.probing.cudnn.features import frontend_features
from fusedattn_select.probing.cudnn.graphs import operation_for
from fusedattn_select.probing.frontend import INSTALL_CUDA, import_cudnn
from fusedattn_select.types import Backend, Fingerprint, Phase

# Kernel caches kept per thread and device: one per problem class (AttnConfig.shape_class_key),
# least recently used dropped first. Each holds the compiled kernels of its class.
MAX_KERNEL_CACHES_PER_THREAD = 64


# ----- cuda-python -------------------------------------------------------------------------------
def import_driver() -> Any:
    """cuda-python's CUDA driver module (PlatformError naming the install when it is missing)."""
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
            f"cuda-python is not installed ({err}); {INSTALL_CUDA} to probe cuDNN"
        ) from None


class _Driver:
    """The few CUDA driver calls the engine needs, with errors turned into readable text."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.device_count = 0

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


# ----- devices and their primary contexts -------------------------------------------------------
class _Devices:
    """The initialised driver and the retained primary contexts by device, made under `lock`."""

    def __init__(self) -> None:
        self.driver: _Driver | None = None
        self.contexts: dict[int, Any] = {}
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        self.lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there


_devices = _Devices()


def cuda_driver() -> _Driver:
    """cuda-python's driver API, initialised once (PlatformError when unusable)."""
    with _devices.lock:
        if _devices.driver is None:
            driver = _Driver(import_driver())
            try:
                driver.call("cuInit", 0)
                count = int(driver.call("cuDeviceGetCount"))
            except RuntimeError as err:
                raise PlatformError(f"no usable CUDA device ({err})") from None
            if count == 0:
                raise PlatformError("no CUDA device is visible (cuDeviceGetCount returned 0)")
            driver.device_count = count
            _devices.driver = driver
        return _devices.driver


def device_ordinal(device: Any = None) -> int:
    """A CUDA device ordinal from an int, "cuda:N", a torch.device, or None (the current device)."""
    if device is None or getattr(device, "index", 0) is None or device == "cuda":
        driver = cuda_driver()
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


def primary_context(device: int) -> Any:
    """The device's primary CUDA context (the one torch and the runtime use), retained once."""
    driver = cuda_driver()
    with _devices.lock:
        context = _devices.contexts.get(device)
        if context is None:
            if not 0 <= device < driver.device_count:
                raise PlatformError(f"CUDA device {device} does not exist ({driver.device_count} visible)")
            try:
                context = driver.call("cuDevicePrimaryCtxRetain", driver.call("cuDeviceGet", device))
            except RuntimeError as err:
                raise PlatformError(f"cannot use CUDA device {device} ({err})") from None
            _devices.contexts[device] = context
        return context


@contextlib.contextmanager
def device_context(device: int) -> Iterator[None]:
    """Make `device`'s primary context current on this thread; restore the caller's afterwards."""
    driver, context = cuda_driver(), primary_context(device)
    previous = driver.call("cuCtxGetCurrent")
    switch = int(previous) != int(context)
    if switch:
        driver.call("cuCtxSetCurrent", context)
    try:
        yield
    finally:
        if switch:
            driver.call("cuCtxSetCurrent", previous)


# ----- versions and the fingerprint ------------------------------------------------------------
def backend_version(cudnn: Any) -> int:
    """The version of the libcudnn the frontend loaded (e.g. 91900); PlatformError when unusable."""
    try:
        return int(cudnn.backend_version())
    except Exception as err:  # noqa: BLE001 -- any failure here means libcudnn is unusable
        raise PlatformError(f"libcudnn cannot be loaded ({type(err).__name__}: {err})") from None


def read_fingerprint(device: int, cudnn_backend_version: int) -> Fingerprint:
    """What verdicts on CUDA device `device` depend on: the device, cuDNN, the driver, this library."""
    driver = cuda_driver()
    cu_device = driver.call("cuDeviceGet", device)
    raw_name = driver.call("cuDeviceGetName", 256, cu_device)
    name = raw_name.decode(errors="replace") if isinstance(raw_name, bytes) else str(raw_name)
    major = driver.attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", cu_device)
    minor = driver.attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", cu_device)
    sm_count = driver.attribute("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", cu_device)
    cuda_version = int(driver.call("cuDriverGetVersion"))
    cuda = f"CUDA {cuda_version // 1000}.{cuda_version % 1000 // 10}"
    kernel_module = _kernel_module_version()
    return Fingerprint(
        platform="cuda",
        device_name=name.split("\x00", 1)[0].strip(),
        compute_capability=f"{major}.{minor}",
        sm_count=sm_count,
        cudnn_backend_version=cudnn_backend_version,
        cudnn_frontend_version=frontend_features().version,
        driver_version=f"{kernel_module} ({cuda})" if kernel_module else cuda,
        library_version=LIBRARY_VERSION,
    )


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


# ----- per-thread cuDNN resources ---------------------------------------------------------------
class ThreadResources:
    """One thread's cuDNN handle and kernel caches for one device."""

    __slots__ = ("handle", "kernel_caches")

    def __init__(self) -> None:
        self.handle: Any = None
        self.kernel_caches: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()


class _ThreadHolder:
    """Owns a thread's resources; when the thread ends the holder is collected and its handles destroyed."""

    def __init__(self) -> None:
        self.by_device: dict[int, ThreadResources] = {}
        self.handles: list[Any] = []
        finalizer = weakref.finalize(self, _destroy_handles, self.handles)
        finalizer.atexit = False  # at interpreter exit the process releases everything anyway


def _destroy_handles(handles: list[Any]) -> None:
    try:
        import cudnn  # optional dependency; absent, no handle was ever created
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


def thread_resources(device: int) -> ThreadResources:
    """This thread's resources on `device`, with its handle (call with the device's context current)."""
    holder = getattr(_LOCAL, "holder", None)
    if holder is None:
        holder = _LOCAL.holder = _ThreadHolder()
    resources = holder.by_device.get(device)
    if resources is None:
        resources = holder.by_device[device] = ThreadResources()
    if resources.handle is None:
        resources.handle = import_cudnn().create_handle()
        holder.handles.append(resources.handle)
    return resources


def thread_kernel_cache(resources: ThreadResources, cfg: AttnConfig, operation: str) -> Any:
    # A cuDNN kernel cache binds to the operation graph it first builds, so forward and backward
    # (and F16 and FP8) graphs of one problem class get separate caches.
    if not frontend_features().dynamic_shapes:
        return None
    key = (cfg.shape_class_key(), operation)
    caches = resources.kernel_caches
    cache = caches.get(key)
    if cache is None:
        cache = caches[key] = import_cudnn().create_kernel_cache()
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
    ordinal = device_ordinal(device)
    with device_context(ordinal):
        return thread_resources(ordinal).handle


def kernel_cache_for(cfg: AttnConfig, backend: Backend, phase: Phase, device: Any = None) -> Any:
    """This thread's kernel cache for the problem class of `cfg` and the graph of `phase` on `backend`.

    Pass it to build_graph: graphs of one class (same problem but batch size and sequence lengths)
    then reuse compiled kernels. None when the frontend has no dynamic shapes.
    """
    ordinal = device_ordinal(device)
    with device_context(ordinal):
        return thread_kernel_cache(thread_resources(ordinal), cfg, operation_for(cfg, backend, phase))
