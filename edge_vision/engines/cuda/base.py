"""The CUDA layer interface and the choice of implementation.

Resources are owned explicitly: every buffer, stream and event has ``close()`` and is a
context manager; ``__del__`` is only a fallback. Pinned host memory is exposed as a numpy
view that keeps its owner alive, so code writes *into* it (``np.copyto(buf.array, x)``)
and never rebinds it. Every CUDA call is checked; a failure raises :class:`CudaError`
naming the call and the CUDA error.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import ConfigError, EngineError

log = logging.getLogger(__name__)

U8Array = npt.NDArray[np.uint8]


class CudaError(EngineError):
    """A CUDA call failed; the message names the call and the error."""


class _Owned:
    """An explicitly closed resource; closing twice is harmless."""

    _closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._release()

    def _release(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # fallback only; owners call close()
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to report to
            pass


class PinnedBuffer(_Owned):
    """Page-locked host memory; ``array`` is a flat uint8 numpy view of it."""

    nbytes: int

    @property
    def array(self) -> U8Array:
        raise NotImplementedError

    @property
    def ptr(self) -> int:
        return int(self.array.ctypes.data)

    def view(self, dtype: npt.DTypeLike, shape: tuple[int, ...]) -> np.ndarray:
        """A typed view of the first bytes (no copy); the buffer stays the owner."""
        count = int(np.prod(shape))
        itemsize = np.dtype(dtype).itemsize
        if count * itemsize > self.nbytes:
            raise ValueError(f"view of {count * itemsize} bytes exceeds buffer of {self.nbytes}")
        return self.array[: count * itemsize].view(dtype).reshape(shape)


class DeviceBuffer(_Owned):
    ptr: int
    nbytes: int


class CudaStream(_Owned):
    handle: int


class CudaEvent(_Owned):
    handle: int


class CudaRuntime(ABC):
    """One CUDA device as seen by one binding."""

    name: str

    # -- device ---------------------------------------------------------------------
    @abstractmethod
    def device_name(self) -> str: ...

    @abstractmethod
    def compute_capability(self) -> tuple[int, int]: ...

    def bind_thread(self) -> None:  # noqa: B027 - bindings with per-thread contexts override
        """Make this runtime's context current on the calling thread (pycuda needs it)."""

    # -- memory ---------------------------------------------------------------------
    @abstractmethod
    def alloc_pinned(self, nbytes: int) -> PinnedBuffer: ...

    @abstractmethod
    def alloc_device(self, nbytes: int) -> DeviceBuffer: ...

    def pinned_allocator(self, nbytes: int) -> U8Array:
        """A :data:`~edge_vision.frames.decode.Allocator`: a pinned flat uint8 array that owns its
        memory (freed when the last view of it goes), so pools can hold arrays alone."""
        return self.alloc_pinned(nbytes).array

    # -- streams, events, copies ----------------------------------------------------
    @abstractmethod
    def create_stream(self) -> CudaStream: ...

    @abstractmethod
    def create_event(self) -> CudaEvent: ...

    @abstractmethod
    def copy_htod_async(self, dst: int, src: np.ndarray, stream: CudaStream) -> None:
        """Copy the contiguous host array ``src`` (pinned for true asynchrony) to ``dst``."""

    @abstractmethod
    def copy_dtoh_async(self, dst: np.ndarray, src: int, stream: CudaStream) -> None:
        """Copy ``dst.nbytes`` from device pointer ``src`` into contiguous host ``dst``."""

    def copy_dtod_async(self, dst: int, src: int, nbytes: int, stream: CudaStream) -> None:
        """Copy ``nbytes`` between device pointers (frames another library decoded on the
        device, e.g. nvJPEG through torchvision, into an engine's input)."""
        raise EngineError(f"the {self.name} CUDA binding cannot copy device to device")

    @abstractmethod
    def record(self, event: CudaEvent, stream: CudaStream) -> None: ...

    @abstractmethod
    def query(self, event: CudaEvent) -> bool:
        """True when the work before the event has finished."""

    @abstractmethod
    def synchronize_event(self, event: CudaEvent) -> None: ...

    @abstractmethod
    def synchronize_stream(self, stream: CudaStream) -> None: ...

    def close(self) -> None:  # noqa: B027 - bindings with a context to let go override
        """Let go of the device (the engine's run threads have ended by now)."""


def numpy_view_of(ptr: int, nbytes: int, owner: object) -> U8Array:
    """A flat uint8 numpy array over foreign memory that keeps ``owner`` alive."""
    import ctypes

    raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
    raw.owner = owner  # type: ignore[attr-defined]  # array.base -> raw -> owner
    arr: U8Array = np.frombuffer(memoryview(raw).cast("B"), dtype=np.uint8)
    return arr


_BACKENDS = {
    "cuda-python": ("edge_vision.engines.cuda.cudart", "CudaPythonRuntime"),
    "pycuda": ("edge_vision.engines.cuda.pycuda_rt", "PyCudaRuntime"),
}


def open_runtime(backend: str = "auto", device: int = 0) -> CudaRuntime:
    """The configured CUDA binding; ``auto`` tries cuda-python, then pycuda."""
    import importlib

    names = list(_BACKENDS) if backend == "auto" else [backend]
    if backend != "auto" and backend not in _BACKENDS:
        raise ConfigError(f"engine.cuda_backend {backend!r}; allowed: auto, {', '.join(_BACKENDS)}")
    errors = []
    for name in names:
        module_name, cls_name = _BACKENDS[name]
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
            runtime: CudaRuntime = cls(device)
        except (ImportError, CudaError, OSError) as e:
            errors.append(f"{name}: {e}")
            continue
        log.info(
            "CUDA layer: %s on %s (sm_%d%d)",
            name,
            runtime.device_name(),
            *runtime.compute_capability(),
        )
        return runtime
    raise EngineError("no usable CUDA binding: " + "; ".join(errors))


def cuda_available() -> bool:
    """True when some binding can open device 0 (GPU tests skip otherwise)."""
    try:
        rt = open_runtime("auto")
    except EngineError:
        return False
    rt.close()
    return True
