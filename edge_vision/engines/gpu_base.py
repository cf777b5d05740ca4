"""What every CUDA engine shares: slots, host allocator, launcher, per-frame upload, the
infer/wait/error block and teardown. Each backend keeps only its own part.

A CUDA engine owns ``engine.in_flight`` *slots*; each slot holds a CUDA stream and an
event (from the CUDA layer, :mod:`edge_vision.engines.cuda`) plus the backend's buffers. A batch
takes a free slot for its whole trip::

    letterboxed uint8 frames in pinned memory (the decode pool's allocator is the CUDA
    layer's pinned allocator while the engine is active), or already on the device
    (canvases of the GPU decoder, :mod:`edge_vision.frames.decode_gpu`)
    --H2D (or D2D) per frame (slot stream)--> the backend's run (graph replay,
    execute_async_v3)
    --D2H (slot stream)--> pinned outputs --event--> outputs copied out of the slot's
    pinned memory

all in one job on the engine's *run* threads (one a slot), so a batch costs the event
loop one hand-off there and one back, and batch k+1's copies run while batch k computes
on another slot's stream. A slot goes back to the free list only when its job is over,
even when the batch's caller was cancelled: the next batch never overwrites pinned
memory a copy-out still reads, and ``close`` waits for running jobs before it frees
any. :class:`GpuEngine` does all of that; a backend implements
:meth:`GpuEngine._start_sync` (open the runtime, load the network, make the slots),
:meth:`GpuEngine._launch` (enqueue one batch on a slot's stream, record its event) and
:meth:`GpuEngine._collect` (copy the outputs out), and may add to
:meth:`GpuEngine._release_backend` (what must go before the memory it points at).
"""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from ..common.buffers import Allocator
from ..common.threads import role_pool
from ..config import Config
from ..errors import EngineError
from ..model.spec import ModelSpec
from .base import Engine, SlotPool, U8Array
from .cuda import CudaEvent, CudaRuntime, CudaStream, open_runtime
from .device_frame import DeviceFrame, wait_ready


@dataclass
class GpuSlot:
    """One in-flight slot: a stream and an event; backends add their buffers."""

    index: int
    stream: CudaStream
    event: CudaEvent
    #: Device frames (GPU decoder canvases) the batch on this slot reads: held until its
    #: event completes, so their memory is not reused by a decode while a copy is queued.
    reading: list[Any] = field(default_factory=list, kw_only=True)

    def close(self) -> None:
        """Free what the slot owns; backends free their buffers, then call this."""
        self.event.close()
        self.stream.close()


SlotT = TypeVar("SlotT", bound=GpuSlot)
#: What a backend's launch hands to its collect (the outputs' layout in pinned memory).
LayoutT = TypeVar("LayoutT")


log = logging.getLogger(__name__)


class GpuEngine(Engine, Generic[SlotT, LayoutT]):
    """A CUDA engine: the shared run path; see the module docstring."""

    #: Thread name prefix of the launcher and run threads ("torch", "trt").
    thread_prefix: ClassVar[str]

    def __init__(self, spec: ModelSpec, config: Config) -> None:
        super().__init__(spec, config)
        self.runtime: CudaRuntime | None = None
        self._all_slots: list[SlotT] = []
        self._slot_pool: SlotPool[SlotT] = SlotPool(self._all_slots)
        self._launcher: ThreadPoolExecutor | None = None  # start, graph capture, CPU runs
        self._runner: ThreadPoolExecutor | None = None  # one batch job per slot at a time

    @property
    def accepts_device_frames(self) -> bool:
        return self.runtime is not None

    def host_allocator(self) -> Allocator | None:
        return self.runtime.pinned_allocator if self.runtime is not None else None

    # -- start ----------------------------------------------------------------------

    async def start(self) -> None:
        self._launcher = role_pool(1, f"{self.thread_prefix}-launch")
        # Importing torch or TensorRT reads hundreds of files: never on the event loop.
        await asyncio.get_running_loop().run_in_executor(self._launcher, self._start_sync)
        self._runner = role_pool(max(1, len(self._all_slots)), f"{self.thread_prefix}-run")

    @abstractmethod
    def _start_sync(self) -> None:
        """Open the runtime (:meth:`_open_runtime`), load the network, make the slots
        (launcher thread)."""

    def _open_runtime(self, device: int = 0) -> CudaRuntime:
        self.runtime = open_runtime(self.config.engine.cuda_backend, device)
        self.runtime.bind_thread()
        return self.runtime

    def _rt(self) -> CudaRuntime:
        if self.runtime is None:
            raise RuntimeError("CUDA runtime used before start() or after close()")
        return self.runtime

    # -- one batch ------------------------------------------------------------------

    def _upload_frames(
        self, base: int, frames: Sequence[Any], slot: SlotT, *, into: Any = None
    ) -> None:
        """Copy each frame to consecutive rows at device address ``base``, one copy per
        frame: H2D from the decode pool's pinned buffers, or D2D from the GPU decoder's
        :class:`~edge_vision.frames.decode_batch.DeviceFrame` canvases. With ``into``, a torch
        tensor over those rows (the caller has made the slot's stream torch's current
        one), a batch of device canvases goes in with one stacking kernel instead: one
        call, not one a frame, on a busy worker's GIL.

        A device canvas may still be being decoded on the decoder's stream: the slot's
        stream first waits, on the GPU, for each canvas's ``ready`` event
        (:func:`~edge_vision.frames.decode_batch.wait_ready`); no thread waits. The slot keeps a
        reference to each canvas until the batch's event has completed
        (:meth:`_run_batch`): torch's caching allocator cannot hand its memory to another
        decode while the copy queued here has yet to run, even when the frame's caller
        drops it early (a client gone mid-batch). (``Tensor.record_stream`` would do the
        same inside torch, but it records on the slot's stream at free time, and the slot
        streams are destroyed when the engine closes while canvases may still be alive.)"""
        on_device = [f for f in frames if isinstance(f, DeviceFrame)]
        if on_device:
            import torch  # device canvases are torch tensors: torch is there

            if any(f.ready is not None for f in on_device):
                if into is not None:  # the slot's stream is torch's current one
                    stream = torch.cuda.current_stream()
                else:
                    device = on_device[0].tensor.device
                    stream = torch.cuda.ExternalStream(slot.stream.handle, device=device)  # type: ignore[no-untyped-call, unused-ignore]
                wait_ready(on_device, stream)
            slot.reading.extend(on_device)
            if into is not None and len(on_device) == len(frames):
                torch.stack([f.tensor for f in on_device], out=into[: len(frames)])
                return
        rt = self._rt()
        for i, frame in enumerate(frames):
            dst = base + i * frame.nbytes
            if isinstance(frame, DeviceFrame):
                rt.copy_dtod_async(dst, frame.data_ptr(), frame.nbytes, slot.stream)
            else:
                rt.copy_htod_async(dst, np.ascontiguousarray(frame), slot.stream)

    @abstractmethod
    def _launch(self, slot: SlotT, frames: Sequence[U8Array]) -> LayoutT:
        """Enqueue upload → run → D2H → event record on the slot's stream (run thread)."""

    @abstractmethod
    def _collect(self, slot: SlotT, layout: LayoutT, n: int) -> list[np.ndarray]:
        """The ``n`` real rows of each output, copied out of the slot's pinned memory (the
        slot is reused by the next batch). Runs on the batch's run thread."""

    def _run_batch(self, slot: SlotT, frames: Sequence[U8Array]) -> list[np.ndarray]:
        """One batch's whole trip on a run thread: launch, wait for its event, copy out."""
        rt = self._rt()
        try:
            layout = self._launch(slot, frames)
            rt.synchronize_event(slot.event)
        finally:
            slot.reading.clear()  # the copies have run (or the batch failed): let go
        return self._collect(slot, layout, len(frames))

    async def infer(self, frames: Sequence[U8Array]) -> list[np.ndarray]:
        runner = self._runner
        if runner is None or not self._all_slots:
            raise RuntimeError("engine not started")
        loop = asyncio.get_running_loop()
        slot = await self._slot_pool.get()
        try:
            job = runner.submit(self._run_batch, slot, frames)
        except RuntimeError as e:  # the engine closed meanwhile
            self._slot_pool.put(slot)
            raise EngineError(f"{self.kind} engine is closed: {e}") from e

        def give_back(_: object) -> None:
            # (The job's thread.) After the loop has closed there is no list to feed.
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._slot_pool.put, slot)

        try:
            return await asyncio.wrap_future(job)
        except RuntimeError as e:  # torch and pybind11 report CUDA failures so
            raise EngineError(f"{self.kind} engine failed on a batch of {len(frames)}: {e}") from e
        finally:
            # Back to the free list once the job is over, not when its caller stops
            # waiting: here on the loop when it is (no second wake-up of the loop from the
            # job's thread, one a batch at batches of 1-2 frames), else when it ends.
            if job.done():
                self._slot_pool.put(slot)
            else:
                job.add_done_callback(give_back)

    # -- end ------------------------------------------------------------------------

    def _release_backend(self) -> None:
        """Drop backend objects that point into slot memory, before it is freed."""

    async def close(self) -> None:
        for name in ("_runner", "_launcher"):  # running jobs end before slots are freed
            pool: ThreadPoolExecutor | None = getattr(self, name)
            if pool is not None:
                await asyncio.to_thread(pool.shutdown, True)
                setattr(self, name, None)
        self._release_backend()
        for slot in self._all_slots:
            slot.close()
        self._all_slots.clear()
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        if self.runtime is not None:
            d["cuda_backend"] = self.runtime.name
        return d
