"""The CUDA layer on pycuda (``pycuda.driver``), the binding common on Jetson images.

pycuda works with explicit contexts; this uses the device's *primary* context (the one
the CUDA runtime, TensorRT and torch use), pushed on every thread that makes calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pycuda.driver as drv

from .base import (
    CudaError,
    CudaEvent,
    CudaRuntime,
    CudaStream,
    DeviceBuffer,
    PinnedBuffer,
)


def _checked(name: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except drv.Error as e:
        raise CudaError(f"{name} failed: {e}") from e


class _Pinned(PinnedBuffer):
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        # pagelocked_empty's array owns a HostAllocation freed with it.
        self._host = _checked("cuMemHostAlloc", drv.pagelocked_empty, nbytes, np.uint8)

    @property
    def array(self) -> np.ndarray:
        host: np.ndarray = self._host
        return host

    def _release(self) -> None:
        base = self._host.base
        if base is not None and hasattr(base, "free"):
            _checked("cuMemFreeHost", base.free)


class _Device(DeviceBuffer):
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._alloc = _checked("cuMemAlloc", drv.mem_alloc, nbytes)
        self.ptr = int(self._alloc)

    def _release(self) -> None:
        _checked("cuMemFree", self._alloc.free)


class _Stream(CudaStream):
    def __init__(self) -> None:
        self.raw = _checked("cuStreamCreate", drv.Stream, 1)  # CU_STREAM_NON_BLOCKING
        self.handle = int(self.raw.handle)

    def _release(self) -> None:
        self.raw = None


class _Event(CudaEvent):
    def __init__(self) -> None:
        flags = drv.event_flags.DISABLE_TIMING | drv.event_flags.BLOCKING_SYNC
        self.raw = _checked("cuEventCreate", drv.Event, flags)
        self.handle = 0  # pycuda does not expose CUevent handles; self.raw is used instead

    def _release(self) -> None:
        self.raw = None


class PyCudaRuntime(CudaRuntime):
    name = "pycuda"

    def __init__(self, device: int = 0) -> None:
        _checked("cuInit", drv.init)
        if device >= drv.Device.count():
            raise CudaError(
                f"cuDeviceGetCount: device {device} requested, {drv.Device.count()} present"
            )
        self._device = drv.Device(device)
        self._context: Any = _checked(
            "cuDevicePrimaryCtxRetain", self._device.retain_primary_context
        )

    @contextmanager
    def _current(self) -> Iterator[None]:
        """The primary context pushed for one call and popped after it. pycuda's context
        stacks are per thread and it aborts the process when a thread (a run thread, a
        launcher) ends with a context still pushed, so nothing stays pushed."""
        if self._context is None:
            raise CudaError("pycuda runtime used after close()")
        _checked("cuCtxPushCurrent", self._context.push)
        try:
            yield
        finally:
            drv.Context.pop()

    def device_name(self) -> str:
        return str(self._device.name())

    def compute_capability(self) -> tuple[int, int]:
        major, minor = self._device.compute_capability()
        return int(major), int(minor)

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        with self._current():
            return _Pinned(nbytes)

    def pinned_allocator(self, nbytes: int) -> np.ndarray:
        # pagelocked_empty's array owns its HostAllocation, freed with the last view.
        with self._current():
            arr: np.ndarray = _checked("cuMemHostAlloc", drv.pagelocked_empty, nbytes, np.uint8)
        return arr

    def alloc_device(self, nbytes: int) -> DeviceBuffer:
        with self._current():
            return _Device(nbytes)

    def create_stream(self) -> CudaStream:
        with self._current():
            return _Stream()

    def create_event(self) -> CudaEvent:
        with self._current():
            return _Event()

    def copy_htod_async(self, dst: int, src: np.ndarray, stream: CudaStream) -> None:
        with self._current():
            _checked("cuMemcpyHtoDAsync", drv.memcpy_htod_async, dst, src, _raw(stream))

    def copy_dtoh_async(self, dst: np.ndarray, src: int, stream: CudaStream) -> None:
        with self._current():
            _checked("cuMemcpyDtoHAsync", drv.memcpy_dtoh_async, dst, src, _raw(stream))

    def copy_dtod_async(self, dst: int, src: int, nbytes: int, stream: CudaStream) -> None:
        with self._current():
            _checked("cuMemcpyDtoDAsync", drv.memcpy_dtod_async, dst, src, nbytes, _raw(stream))

    def record(self, event: CudaEvent, stream: CudaStream) -> None:
        with self._current():
            _checked("cuEventRecord", _raw(event).record, _raw(stream))

    def query(self, event: CudaEvent) -> bool:
        with self._current():
            return bool(_checked("cuEventQuery", _raw(event).query))

    def synchronize_event(self, event: CudaEvent) -> None:
        with self._current():
            _checked("cuEventSynchronize", _raw(event).synchronize)

    def synchronize_stream(self, stream: CudaStream) -> None:
        with self._current():
            _checked("cuStreamSynchronize", _raw(stream).synchronize)

    def close(self) -> None:
        super().close()
        if self._context is not None:
            _checked("cuDevicePrimaryCtxRelease", self._context.detach)
            self._context = None


def _raw(handle: CudaStream | CudaEvent) -> Any:
    raw = getattr(handle, "raw", None)
    if raw is None:
        raise CudaError("a stream or event of another CUDA binding was passed to pycuda")
    return raw
