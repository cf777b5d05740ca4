"""INT8 calibration: real frames fitted as serving does, and the TensorRT calibrator.

:func:`calibration_frames` and :func:`calibration_batches` are plain code, tested on CPUs;
:func:`entropy_calibrator` makes the ``trt.IInt8EntropyCalibrator2`` fed with them (its
base class exists only once ``tensorrt`` is imported, so the class is made by a function).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import ConfigError
from ...model.shape import Fit, letterbox_into, plan_fit
from ..cuda import CudaRuntime, CudaStream, DeviceBuffer, PinnedBuffer
from .plan_store import write_cache_atomically

log = logging.getLogger(__name__)

U8Array = npt.NDArray[np.uint8]


def calibration_batches(
    frames: Iterable[U8Array], batch_size: int, limit: int
) -> Iterator[U8Array]:
    """Group fitted frames into ``[batch_size, H, W, 3]`` arrays, at most ``limit``
    frames in all. A last partial batch is dropped: TensorRT's calibrator asks for batches
    of exactly ``get_batch_size()`` frames."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    usable = (limit // batch_size) * batch_size
    if usable == 0:
        return
    batch: list[U8Array] = []
    for taken, frame in enumerate(frames, 1):
        if batch and frame.shape != batch[0].shape:
            raise ValueError(f"calibration frame {taken} is {frame.shape}, not {batch[0].shape}")
        batch.append(frame)
        if len(batch) == batch_size:
            yield np.stack(batch)
            batch = []
            if taken >= usable:  # stop before reading (decoding) another frame
                return


def calibration_frames(
    source: Path, height: int, width: int, pad_value: int, limit: int, *, fit: Fit
) -> Iterator[U8Array]:
    """Real frames from an image folder or a video, fitted to ``height × width`` exactly
    as serving does with the model's ``fit`` (:func:`~edge_vision.model.shape.plan_fit` +
    :func:`~edge_vision.model.shape.letterbox_into`: stretched for the default text detector,
    letterboxed for YOLO). Blocking: run in a worker thread.

    The source is opened here, so a missing or unreadable one is a ConfigError before
    the build starts, not in the middle of it. A video longer than ``limit`` frames is
    sampled evenly over its length rather than read from the start only, so calibration
    sees the scene's variety.
    """
    # Video sources (OpenCV capture) load only when calibrating from a clip.
    from ...common.sources import Cut, SourceError, open_source

    try:
        src = open_source(str(source), Cut())
    except SourceError as e:
        raise ConfigError(f"engine.tensorrt.calibration_source: {e}") from None
    total = src.info.frame_count
    step = max(1, math.floor(total / limit)) if total and total > limit else 1

    def frames() -> Iterator[U8Array]:
        with src:
            given = 0
            index = 0
            while given < limit:
                frame = src.read()
                if frame is None:
                    break
                index += 1
                if (index - 1) % step:
                    continue
                h0, w0 = frame.pixels.shape[:2]
                out = np.empty((height, width, 3), np.uint8)
                lb = plan_fit(w0, h0, height, width, fit)
                letterbox_into(frame.pixels, lb, out, pad_value)
                given += 1
                yield out

    return frames()


def entropy_calibrator(
    trt: Any,
    rt: CudaRuntime,
    batches: Iterator[np.ndarray],
    shape: tuple[int, int, int],
    cache_path: Path,
    on_frames: Callable[[int], None] | None,
) -> Any:
    """A ``trt.IInt8EntropyCalibrator2`` (the calibrator TensorRT prefers, and the one DLA
    requires) fed with real fitted uint8 frames, reading and writing ``cache_path``.

    ``get_batch`` copies each ``[B, H, W, 3]`` batch through pinned memory into one device
    buffer and returns its pointer; ``None`` ends calibration.
    """
    b, h, w = shape
    nbytes = b * h * w * 3

    class _Calibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self.device: DeviceBuffer | None = None
            self.pinned: PinnedBuffer | None = None
            self.stream: CudaStream | None = None
            self.error: BaseException | None = None
            self.frames = 0

        def get_batch_size(self) -> int:
            return b

        def get_batch(self, names: list[str]) -> list[int] | None:
            try:
                batch = next(batches, None)
                if batch is None:
                    return None
                if self.device is None or self.pinned is None or self.stream is None:
                    self.device = rt.alloc_device(nbytes)
                    self.pinned = rt.alloc_pinned(nbytes)
                    self.stream = rt.create_stream()
                rt.bind_thread()  # TensorRT may call from a thread of its own
                host = self.pinned.view(np.uint8, (b, h, w, 3))
                np.copyto(host, batch)
                rt.copy_htod_async(self.device.ptr, host, self.stream)
                rt.synchronize_stream(self.stream)  # the buffer is reused by the next batch
                self.frames += b
                if on_frames is not None:
                    on_frames(b)
                return [self.device.ptr]
            except BaseException as e:  # noqa: BLE001 - reported after the build returns
                self.error = e
                return None

        def read_calibration_cache(self) -> bytes | None:
            if cache_path.is_file():
                log.info("INT8 calibration: reusing %s", cache_path)
                return cache_path.read_bytes()
            return None

        def write_calibration_cache(self, cache: Any) -> None:
            write_cache_atomically(cache_path, memoryview(cache).tobytes())
            log.info("INT8 calibration cache saved to %s", cache_path)

        def release(self) -> None:
            for owned in (self.device, self.pinned, self.stream):
                if owned is not None:
                    owned.close()

    return _Calibrator()
