"""A private stream for loading serialized cuDNN plans.

cudnn-frontend's deserialize() ends with a warm-up that captures one run of the plan into a CUDA
graph. On a handle pointed at the legacy default stream it captures on a new blocking stream, and
while a blocking stream captures, every launch on the legacy default stream from any other thread
fails (cudaErrorStreamCaptureImplicit) and ruins the capture: a plan loaded off the caller's path
would crash the caller's next kernel. Loading under `loading_stream` points the handle at a stream
of this thread's own, non-blocking (torch's pool streams are), so the capture stays on it and the
rest of the process never waits on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fusedattn_select.runtime.dispatcher import dispatcher


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
