"""Streams, threads and CUDA graphs: what the runtime's own CUDA work does so that the caller's graphs
(`torch.cuda.graph`, torch.compile's cudagraph trees) neither break nor capture it.

- A private stream for loading serialized cuDNN plans. cudnn-frontend's deserialize() ends with a
  warm-up that captures one run of the plan into a CUDA graph. On a handle pointed at the legacy
  default stream it captures on a new blocking stream, and while a blocking stream captures, every
  launch on the legacy default stream from any other thread fails (cudaErrorStreamCaptureImplicit)
  and ruins the capture: a plan loaded off the caller's path would crash the caller's next kernel.
  Loading under `loading_stream` points the handle at a stream of this thread's own, non-blocking
  (torch's pool streams are), so the capture stays on it and the rest of the process never waits on it.
- Our threads ignore other threads' captures (`ignore_other_threads_captures`). A capture in CUDA's
  default *global* mode forbids every thread in that mode the calls that are unsafe during a capture
  (cudaMalloc among them), fails them and invalidates the capture: a plan loaded off the caller's path
  while the caller captured made both fail. In thread-local mode our threads' calls are allowed and
  leave the caller's capture alone (cudnn-frontend itself switches to relaxed mode for such calls).
- Calls on tensors of a GPU other than the thread's current one (a model split over GPUs in one process,
  as transformers' device_map="auto" makes it) run with that GPU made current (`on_device`): cuDNN and
  Triton launch on the current device, torch's own ops on their tensors'.
- Tensors kept across calls are allocated off the caller's thread (`persistent`). torch.compile's
  cudagraph trees route every allocation of the thread that records or warms a graph into the graph's
  private pool, and refuse a pool left holding a tensor that is not one of the graph's outputs; a
  workspace made there would be both.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch

from fusedattn_select.runtime.dispatcher import dispatcher

log = logging.getLogger("fusedattn_select")


def _private(index: int) -> torch.cuda.Stream:
    streams = getattr(dispatcher.per_thread, "loading_streams", None)
    if streams is None:
        streams = dispatcher.per_thread.loading_streams = {}
    stream = streams.get(index)
    if stream is None:
        stream = streams[index] = torch.cuda.Stream(device=index)
    return stream


@contextlib.contextmanager
def loading_stream(index: int) -> Iterator[None]:
    """Make this thread's private stream of device `index` current inside the block (a no-op while
    capturing: a capture's own stream must stay current)."""
    if torch.cuda.is_current_stream_capturing():
        yield
        return
    with torch.cuda.stream(_private(index)):
        yield


def ignore_other_threads_captures() -> None:
    """Set this thread's CUDA stream-capture mode to thread-local (once per thread; for the runtime's own
    threads, never the caller's). Without cuda-python or a CUDA driver nothing changes (logged at debug)."""
    if getattr(dispatcher.per_thread, "capture_mode", False):
        return
    try:
        from fusedattn_select.probing.cudnn.cudnn_device import import_driver

        driver = import_driver()
        driver.cuInit(0)  # (a thread may get here before anything initialised CUDA in the process)
        err, _ = driver.cuThreadExchangeStreamCaptureMode(
            driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        if int(err) != 0:
            raise RuntimeError(f"cuThreadExchangeStreamCaptureMode returned {err}")
    except Exception as err:  # noqa: BLE001 - the thread works as before, only a concurrent capture can trip it
        log.debug("fusedattn_select: this thread's CUDA capture mode stays global (%s: %s)", type(err).__name__, err)
    dispatcher.per_thread.capture_mode = True


def persistent(make: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
    """`make()` (a tensor on `device` that calls keep) allocated on the runtime's allocating thread, on this
    thread's current stream of `device`: never in a CUDA-graph pool this thread allocates into."""
    if device.type != "cuda" or dispatcher.allocator.runs_here():
        return make()
    stream = torch.cuda.current_stream(device)

    def allocate() -> torch.Tensor:
        ignore_other_threads_captures()
        with torch.cuda.stream(stream):
            return make()

    return dispatcher.allocator.submit(allocate).result()


# The thread's current CUDA device, without torch.cuda's Python checks (asked at every call).
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def foreign_device(t: torch.Tensor) -> int | None:
    """The index of the GPU `t` is on where it is not this thread's current device, else None."""
    index = t.get_device()
    if index < 0 or _current_device is None or _current_device() == index:
        return None
    return index


def on_device(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """`t`'s GPU made current for the block where it is not (see the module docstring), else nothing."""
    index = foreign_device(t)
    return contextlib.nullcontext() if index is None else torch.cuda.device(index)
