"""Batched decode: encoded frames → letterboxed engine-input canvases, on the host or the GPU.

One interface, :meth:`BatchDecoder.decode_batch`: a list of :class:`DecodeRequest`
(bytes whose header was already read and whose pixel limit was already checked on the
host, plus the frame's :class:`~edge_vision.model.shape.Letterbox`) → for each frame either a
:class:`Prepared` canvas or the :class:`~edge_vision.errors.ClientError` that frame earned.
One bad frame never fails the others.

* :class:`HostBatchDecoder`: frame by frame through the pipeline's one host path
  (:meth:`edge_vision.frames.pipeline.FramePipeline.decode_request`: decode.py's decoder —
  libjpeg-turbo through simplejpeg, with DCT-domain downscaling — and
  :func:`~edge_vision.model.shape.letterbox_into` into
  :class:`~edge_vision.frames.decode.BufferPool`
  canvases, under the memory budget). It serves the service without a GPU, CI, and every
  frame the device decoder does not take.
* :class:`~edge_vision.frames.decode_gpu.CudaBatchDecoder` (its own module): JPEGs decoded in
  batches on the GPU and letterboxed there into uint8 BGR canvases the CUDA engines read
  (:class:`DeviceFrame`).

Routing (:func:`device_decodable`): baseline or extended-sequential 8-bit JPEGs with one
(grey) or three (YCbCr) components go to the device; PNG, progressive, 12-bit, CMYK/YCCK
and Adobe-RGB JPEGs go the host way frame by frame. A batched GPU decode call that fails as
a whole is retried frame by frame; a frame the GPU decoder still refuses is decoded on the
host, which raises ``bad_image`` for a corrupt one, so only that frame fails.

:class:`DecodeBatcher` feeds either from the event loop: frames for the device are
batched (everything waiting when a device stream frees up, at most ``decode.device_batch``
frames; with ``decode.device_window_ms``, not before the oldest of them has waited that
long, and with ``decode.device_window_adaptive`` only while frames come at least
``decode.device_window_min_frames`` a window), frames for the host are decoded one per
worker-pool job, as before.

How the device decoder orders its work against the engines' streams, and which memory it
holds until when, is said in :mod:`edge_vision.frames.decode_gpu`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..common.buffers import Allocator
from ..common.threads import role_pool
from ..errors import ClientError
from ..model.shape import Letterbox
from .decode import ImageHeader

log = logging.getLogger(__name__)

U8Array = npt.NDArray[np.uint8]


@dataclass(slots=True)
class DecodeRequest:
    """One frame to decode: header read and pixel limit checked on the host already."""

    data: bytes
    header: ImageHeader
    letterbox: Letterbox
    started: float = field(default_factory=time.perf_counter)  # decode_ms counts from here


@dataclass(slots=True)
class Prepared:
    """A letterboxed ``out_h × out_w × 3`` uint8 BGR canvas: a pooled host array, or a
    :class:`DeviceFrame` (``on_device``) that stays alive until the engine has read it."""

    canvas: Any  # U8Array from the BufferPool, or a DeviceFrame
    letterbox: Letterbox
    decode_s: float
    shape_s: float
    on_device: bool = False
    #: The host CPU its decode and letterbox took (a worker's time, no waits): what the
    #: engine's queue charges the session for it (batch.py). 0 for a device decode.
    host_s: float = 0.0


Outcome = Prepared | ClientError


class BatchDecoder(Protocol):
    """A device decoder behind :class:`DecodeBatcher`
    (:class:`~edge_vision.frames.decode_gpu.CudaBatchDecoder`)."""

    name: str

    def takes(self, request: DecodeRequest) -> bool:
        """True when this decoder wants the frame in a batch; False: the host path."""
        ...

    def decode_batch(self, requests: Sequence[DecodeRequest]) -> list[Outcome]:
        """Each request's canvas or its ClientError, in order (worker thread)."""
        ...

    def set_staging_allocator(self, allocator: Allocator) -> None:
        """Back the compressed-bytes pool with ``allocator`` (pinned with a CUDA engine)."""
        ...


# ---------------------------------------------------------------------------------------
# Routing

# SOF0 baseline and SOF1 extended sequential (Huffman): what nvJPEG decodes on the GPU.
_DEVICE_SOF = frozenset((0xC0, 0xC1))
_ANY_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


@dataclass(frozen=True, slots=True)
class JpegKind:
    sof: int  # the SOF marker (0xC0 baseline, 0xC2 progressive, ...)
    precision: int  # bits per sample
    components: int
    adobe_transform: int | None  # APP14 "Adobe" colour transform, when present

    @property
    def device_ok(self) -> bool:
        if self.sof not in _DEVICE_SOF or self.precision != 8:
            return False
        if self.components == 1:
            return True
        # Three components are YCbCr unless an Adobe marker says RGB (transform 0).
        return self.components == 3 and self.adobe_transform != 0


def jpeg_kind(data: bytes) -> JpegKind | None:
    """SOF type, precision, components and the Adobe transform, from the markers before
    the first scan; None when they cannot be read (the host decoder then says why)."""
    i, n = 2, len(data)
    adobe: int | None = None
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):
            i += 2
            continue
        (length,) = struct.unpack_from(">H", data, i + 2)
        if length < 2:
            return None
        if marker == 0xEE and length >= 14 and data[i + 4 : i + 9] == b"Adobe":
            adobe = data[i + 15] if i + 15 < n else None
        elif marker in _ANY_SOF:
            if i + 10 > n:
                return None
            return JpegKind(marker, data[i + 4], data[i + 9], adobe)
        elif marker == 0xDA:
            return None
        i += 2 + length
    return None


def device_decodable(request: DecodeRequest) -> bool:
    """True when the GPU decoder takes this frame (see the module docstring)."""
    if request.header.format != "jpeg":
        return False
    kind = jpeg_kind(request.data)
    return kind is not None and kind.device_ok


# ---------------------------------------------------------------------------------------
# Host


class HostBatchDecoder:
    """Frame by frame through ``prepare_one`` (the pipeline's host decode + letterbox)."""

    name = "host"

    def __init__(self, prepare_one: Callable[[DecodeRequest], Prepared], pad_value: int) -> None:
        self.decode_one = prepare_one
        self.pad_value = pad_value

    def takes(self, request: DecodeRequest) -> bool:
        return False  # every frame is its own worker job, as without batching

    def decode_batch(self, requests: Sequence[DecodeRequest]) -> list[Outcome]:
        out: list[Outcome] = []
        for r in requests:
            try:
                out.append(self.decode_one(r))
            except ClientError as e:
                out.append(e)
        return out


# ---------------------------------------------------------------------------------------
# From the event loop


class DecodeBatcher:
    """Feeds the host decoder and, when there is one, a device decoder from the event
    loop (see the module docstring).

    Device frames wait while all ``in_flight`` device calls are busy; when one finishes,
    everything waiting (up to ``max_batch``) goes in the next call, so batches grow with
    the load and a lone frame is decoded at once. With ``window_s`` > 0 a call also waits
    until its oldest frame has waited ``window_s`` (or ``max_batch`` frames wait): the
    host's cost of a device call is mostly a cost a call (docs/benchmarks.md), so a
    worker with few cameras trades that much latency for fewer, fuller calls. With
    ``adaptive`` a call waits out the window only while the worker's device frames come
    at least ``min_frames`` a window (the average of the last 32 gaps between their
    arrivals, each counted at most two windows, times ``min_frames`` is no longer than the
    window), so a worker whose frames come further apart, one camera or a light load, pays
    no latency for calls that would carry few frames anyway (after a busier spell, once
    the average has caught up: with ``min_frames`` 1, one camera at 30 fps and a 20 ms
    window still waits for its next 17-19 frames).
    ``min_frames`` 1 waits whenever the window should gather another frame; more keeps the
    wait for a worker busy enough that its calls would otherwise stay small, where the
    per-call host cost the window saves is what limits the node. Whether to wait depends on
    that average only, not on when the next frame looks due: stopping a wait once the next
    frame looks due after the window's end would cut windows short under load and leave
    the engine's batches smaller (docs/benchmarks.md, "the decode window at 60 s, the
    adaptive window, and fewer workers").
    Host frames are one worker job each in the shared pool; device calls run on
    ``in_flight`` threads of their own.
    """

    # How many recent gaps between device frames the adaptive window averages: enough
    # that a few frames read back to back after the event loop was busy (a run of near-zero
    # gaps) do not look like a busier worker and hold calls that should go (a shorter
    # average does: docs/benchmarks.md, "one configuration for 64 and 32 cameras"), few
    # enough to follow the load within a fraction of a second. Each gap counts at most two
    # windows, whatever min_frames asks: a lower cap would shorten the long gaps of a
    # light, bursty load and pull its average under the threshold.
    GAP_HISTORY = 32

    def __init__(
        self,
        host: HostBatchDecoder,
        device: BatchDecoder | None,
        executor: Executor,
        *,
        max_batch: int,
        in_flight: int,
        window_s: float = 0.0,
        adaptive: bool = False,
        min_frames: float = 1.0,
        release: Callable[[Prepared], None] | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self.host = host
        self.device = device
        self.executor = executor
        self.max_batch = max_batch
        self.in_flight = in_flight
        self.window_s = window_s
        self.adaptive = adaptive
        self.min_frames = min_frames
        self._window_timer: asyncio.TimerHandle | None = None
        # The last GAP_HISTORY gaps between device frames' arrivals (adaptive), each counted at
        # most two windows, so an idle spell says only "further apart than the window";
        # empty until a second frame came (the first does not wait).
        self._gaps: deque[float] = deque(maxlen=self.GAP_HISTORY)
        self._last_arrival: float | None = None
        # Gives back the canvas of a frame whose caller went away while it was decoded.
        self._release = release
        self._on_batch = on_batch  # sees each device call's frame count (metrics)
        self._abandoned: set[concurrent.futures.Future[Prepared]] = set()
        self._abandoned_lock = threading.Lock()
        # (request, its caller's future, when it arrived by the loop's clock)
        self._waiting: list[tuple[DecodeRequest, asyncio.Future[Prepared], float]] = []
        self._running = 0
        # A device call holds its thread while the GPU works (it waits for its stream):
        # a thread per call in flight of its own, so that post-processing and host decodes
        # in the shared pool never queue behind GPU waits (threads start with the first).
        self._device_threads = role_pool(in_flight, "gpu-decode")
        self.batches = 0  # device calls made (tests and logs read these)
        self.batched_frames = 0

    async def decode(self, request: DecodeRequest, *, device: bool = True) -> Prepared:
        """The frame's canvas; raises its ClientError. ``device`` False (the active
        engine cannot read device memory): the host path."""
        loop = asyncio.get_running_loop()
        if not (device and self.device is not None and self.device.takes(request)):
            job = self.executor.submit(self.host.decode_one, request)
            try:
                return await asyncio.wrap_future(job)
            except asyncio.CancelledError:  # a worker may still be decoding it
                with self._abandoned_lock:
                    self._abandoned.add(job)
                job.add_done_callback(self._release_abandoned)
                raise
        fut: asyncio.Future[Prepared] = loop.create_future()
        now = loop.time()
        if self.adaptive and self.window_s > 0:  # the gaps matter only to an adaptive window
            if self._last_arrival is not None:
                self._gaps.append(min(now - self._last_arrival, 2 * self.window_s))
            self._last_arrival = now
        self._waiting.append((request, fut, now))
        self._kick(loop)
        return await fut

    def _release_abandoned(self, job: concurrent.futures.Future[Prepared]) -> None:
        """(Any thread.) The canvas of a decode nobody waits for any more goes back."""
        with self._abandoned_lock:
            self._abandoned.discard(job)
        if not job.cancelled() and job.exception() is None and self._release is not None:
            self._release(job.result())

    async def drain(self) -> None:
        """Send the frames still inside their window and wait for them, wait until the
        decodes whose callers went away have finished (and given back their canvases),
        then let the device calls' threads go."""
        self.window_s = 0.0  # no more windows: nothing would send a frame that waits
        if self._window_timer is not None:
            self._window_timer.cancel()
            self._window_timer = None
        waiting = [fut for _, fut, _ in self._waiting]
        self._kick(asyncio.get_running_loop())
        if waiting:
            await asyncio.gather(*(asyncio.shield(f) for f in waiting), return_exceptions=True)
        with self._abandoned_lock:
            jobs = list(self._abandoned)
        if jobs:
            await asyncio.gather(*(asyncio.wrap_future(j) for j in jobs), return_exceptions=True)
        await asyncio.to_thread(self._device_threads.shutdown, True)

    def _worth_a_window(self) -> bool:
        """Whether holding a call for the window should gather enough frames: always for
        the plain window; adaptive, when device frames came lately at least ``min_frames``
        a window (the average gap times ``min_frames`` is no longer than the window)."""
        if not self.adaptive:
            return True
        gaps = self._gaps
        return bool(gaps) and sum(gaps) / len(gaps) * self.min_frames <= self.window_s

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._waiting and self._running < self.in_flight:
            if self.window_s > 0 and len(self._waiting) < self.max_batch:
                due = self._waiting[0][2] + self.window_s
                # The oldest has not waited its window yet, and waiting should gather
                # another frame.
                if loop.time() < due and self._worth_a_window():
                    if self._window_timer is None:
                        self._window_timer = loop.call_at(due, self._window_over, loop)
                    return
            batch = [(r, f) for r, f, _ in self._waiting[: self.max_batch]]
            del self._waiting[: self.max_batch]
            self._running += 1
            loop.create_task(self._run(loop, batch))

    def _window_over(self, loop: asyncio.AbstractEventLoop) -> None:
        self._window_timer = None
        self._kick(loop)

    async def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: list[tuple[DecodeRequest, asyncio.Future[Prepared]]],
    ) -> None:
        if self.device is None:  # pragma: no cover - decode() batches only for a device
            raise RuntimeError("no device decoder")
        try:
            outcomes = await loop.run_in_executor(
                self._device_threads, self.device.decode_batch, [r for r, _ in batch]
            )
        except BaseException as e:  # a bug or a CUDA failure: every frame of it fails
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        finally:
            self._running -= 1
            self._kick(loop)
        self.batches += 1
        self.batched_frames += len(batch)
        if self._on_batch is not None:
            self._on_batch(len(batch))
        for (_, fut), outcome in zip(batch, outcomes, strict=True):
            if fut.done():  # the frame's caller went away: its canvas goes back
                if isinstance(outcome, Prepared) and self._release is not None:
                    self._release(outcome)  # a no-op for a device canvas
                continue
            if isinstance(outcome, ClientError):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)
