"""The CUDA layer on NVIDIA's cuda-python (``cuda.bindings.runtime``), as TensorRT 10's
samples use it: every call returns ``(err, *values)`` and goes through :func:`cuda_call`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import (
    CudaError,
    CudaEvent,
    CudaRuntime,
    CudaStream,
    DeviceBuffer,
    PinnedBuffer,
    numpy_view_of,
)

try:  # cuda-python >= 12.6 moved the runtime under cuda.bindings
    from cuda.bindings import runtime as cudart
except ImportError:  # pragma: no cover - older cuda-python
    from cuda import cudart


def cuda_call(name: str, result: Any) -> Any:
    """Check a cuda-python result tuple; raise CudaError naming the call on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        _, err_name = cudart.cudaGetErrorName(err)
        _, err_text = cudart.cudaGetErrorString(err)
        raise CudaError(f"{name} failed: {_text(err_name)} ({_text(err_text)})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _raw(handle: CudaStream | CudaEvent) -> Any:
    """The cuda-python handle object behind one of ours (plain ints work too)."""
    return getattr(handle, "raw", handle.handle)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Pinned(PinnedBuffer):
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._ptr = int(
            cuda_call("cudaHostAlloc", cudart.cudaHostAlloc(nbytes, cudart.cudaHostAllocDefault))
        )

    @property
    def array(self) -> np.ndarray:
        # A fresh view each time: the view keeps this buffer alive, never the reverse, so
        # there is no reference cycle and memory goes back as soon as the last view dies.
        return numpy_view_of(self._ptr, self.nbytes, self)

    def _release(self) -> None:
        cuda_call("cudaFreeHost", cudart.cudaFreeHost(self._ptr))


class _Device(DeviceBuffer):
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.ptr = int(cuda_call("cudaMalloc", cudart.cudaMalloc(nbytes)))

    def _release(self) -> None:
        cuda_call("cudaFree", cudart.cudaFree(self.ptr))


class _Stream(CudaStream):
    def __init__(self) -> None:
        self.raw = cuda_call(
            "cudaStreamCreateWithFlags",
            cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking),
        )
        self.handle = int(self.raw)

    def _release(self) -> None:
        cuda_call("cudaStreamDestroy", cudart.cudaStreamDestroy(self.raw))


class _Event(CudaEvent):
    def __init__(self) -> None:
        # Timing off: cheaper, and BlockingSync lets a waiting thread sleep, not spin.
        flags = cudart.cudaEventDisableTiming | cudart.cudaEventBlockingSync
        self.raw = cuda_call("cudaEventCreateWithFlags", cudart.cudaEventCreateWithFlags(flags))
        self.handle = int(self.raw)

    def _release(self) -> None:
        cuda_call("cudaEventDestroy", cudart.cudaEventDestroy(self.raw))


class CudaPythonRuntime(CudaRuntime):
    name = "cuda-python"

    def __init__(self, device: int = 0) -> None:
        count = cuda_call("cudaGetDeviceCount", cudart.cudaGetDeviceCount())
        if device >= count:
            raise CudaError(f"cudaGetDeviceCount: device {device} requested, {count} present")
        self.device = device
        cuda_call("cudaSetDevice", cudart.cudaSetDevice(device))
        self._props = cuda_call("cudaGetDeviceProperties", cudart.cudaGetDeviceProperties(device))

    def bind_thread(self) -> None:
        cuda_call("cudaSetDevice", cudart.cudaSetDevice(self.device))

    def device_name(self) -> str:
        return _text(self._props.name).rstrip("\x00")

    def compute_capability(self) -> tuple[int, int]:
        return int(self._props.major), int(self._props.minor)

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        return _Pinned(nbytes)

    def alloc_device(self, nbytes: int) -> DeviceBuffer:
        return _Device(nbytes)

    def create_stream(self) -> CudaStream:
        return _Stream()

    def create_event(self) -> CudaEvent:
        return _Event()

    def copy_htod_async(self, dst: int, src: np.ndarray, stream: CudaStream) -> None:
        cuda_call(
            "cudaMemcpyAsync(HostToDevice)",
            cudart.cudaMemcpyAsync(
                dst,
                src.ctypes.data,
                src.nbytes,
                cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
                _raw(stream),
            ),
        )

    def copy_dtoh_async(self, dst: np.ndarray, src: int, stream: CudaStream) -> None:
        cuda_call(
            "cudaMemcpyAsync(DeviceToHost)",
            cudart.cudaMemcpyAsync(
                dst.ctypes.data,
                src,
                dst.nbytes,
                cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                _raw(stream),
            ),
        )

    def copy_dtod_async(self, dst: int, src: int, nbytes: int, stream: CudaStream) -> None:
        cuda_call(
            "cudaMemcpyAsync(DeviceToDevice)",
            cudart.cudaMemcpyAsync(
                dst, src, nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice, _raw(stream)
            ),
        )

    def record(self, event: CudaEvent, stream: CudaStream) -> None:
        cuda_call("cudaEventRecord", cudart.cudaEventRecord(_raw(event), _raw(stream)))

    def query(self, event: CudaEvent) -> bool:
        (err,) = cudart.cudaEventQuery(_raw(event))
        if err == cudart.cudaError_t.cudaErrorNotReady:
            return False
        cuda_call("cudaEventQuery", (err,))
        return True

    def synchronize_event(self, event: CudaEvent) -> None:
        cuda_call("cudaEventSynchronize", cudart.cudaEventSynchronize(_raw(event)))

    def synchronize_stream(self, stream: CudaStream) -> None:
        cuda_call("cudaStreamSynchronize", cudart.cudaStreamSynchronize(_raw(stream)))
