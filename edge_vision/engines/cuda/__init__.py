"""The small CUDA layer every GPU engine uses.

One interface (:class:`~.base.CudaRuntime`): pinned host buffers viewable as numpy without
copies, device buffers, streams, events, async copies, and :meth:`~.base.CudaRuntime.wait`,
an awaitable "this stream reached here" that never blocks the event loop. Two
implementations: :mod:`.cudart` (NVIDIA's ``cuda-python``, ``cuda.bindings.runtime``, what
TensorRT 10's samples use) and :mod:`.pycuda_rt` (pycuda, common on Jetson images).
``engine.cuda_backend: auto`` takes cuda-python, then pycuda; the config can force either.
"""

from .base import (
    CudaError,
    CudaEvent,
    CudaRuntime,
    CudaStream,
    DeviceBuffer,
    PinnedBuffer,
    cuda_available,
    open_runtime,
)

__all__ = [
    "CudaError",
    "CudaEvent",
    "CudaRuntime",
    "CudaStream",
    "DeviceBuffer",
    "PinnedBuffer",
    "cuda_available",
    "open_runtime",
]
