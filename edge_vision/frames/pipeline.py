"""One frame's path from admitted message to detections: decode → shape → infer → post.

:class:`FramePipeline` is shared by the WebSocket server, in-process replay and the
benchmark. A frame goes through two steps, which the session runner
(edge_vision.session.runner) calls in turn, telling the session core in between that the
frame no longer needs its decode turn:

* :meth:`FramePipeline.prepare`: header read, pixel and decoded-size limits, decode and
  letterbox, on the host or batched on the GPU (edge_vision.frames.decode_batch,
  edge_vision.frames.decode_gpu) → a :class:`~edge_vision.frames.decode_batch.Prepared` canvas,
  which the caller owns. A host decode waits for its session's fair turn and for room in
  the memory budget for all it will hold, charged before it starts
  (edge_vision.frames.decode_turns);
* :meth:`FramePipeline.finish`: the engine (through the batcher), the head, and reading
  when the session reads → a :class:`FrameResult`, or
  :data:`~edge_vision.frames.infer.SUPERSEDED` when a newer
  frame of the session took its place before the engine ran it. It gives the canvas back
  on every path; a prepared frame that never reaches it goes back with
  :meth:`FramePipeline.release`.

:meth:`FramePipeline.process` is both steps in one call, for callers without a session.
CPU-bound steps run in a worker pool (``decode.workers`` threads; OpenCV, libjpeg-turbo
and numpy release the GIL), the engine behind the batcher, each batch's post-processing
in one job on the inference service's post threads (edge_vision.frames.infer), and the event
loop only awaits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial

import cv2
import numpy as np
import numpy.typing as npt

from ..common.aio import cancel_and_wait
from ..common.budget import MemoryBudget
from ..common.buffers import BufferPool, numpy_allocator
from ..common.memory import keep_pool_trimmed
from ..common.messages import FrameMessage
from ..common.settings import FrameSettings as FrameSettings  # re-exported: what it runs with
from ..common.threads import opencv_threads, role_pool
from ..config import Config
from ..engines import Engine
from ..errors import ClientError
from ..model.heads import DbnetHead, Head, filter_classes
from ..model.shape import Letterbox, letterbox_into, plan_for_frame
from .decode import (
    Decoder,
    check_decoded_limit,
    check_pixel_limit,
    decode_base64,
    decode_memory,
    decode_refusal,
    decoded_bytes,
    pick_decoder,
    read_image_header,
)
from .decode_batch import DecodeBatcher, DecodeRequest, HostBatchDecoder, Prepared
from .decode_gpu import make_device_decoder
from .decode_turns import DecodeTurns, Turn
from .infer import BatchInfo, InferenceService, Superseded
from .read import ReadStage, SessionReading
from .results import FrameResult as FrameResult  # re-exported: the pipeline's product

log = logging.getLogger(__name__)

F32Array = npt.NDArray[np.float32]
U8Array = npt.NDArray[np.uint8]


def worker_count(configured: int) -> int:
    return configured or max(1, os.cpu_count() or 1)


class FramePipeline:
    def __init__(
        self,
        config: Config,
        service: InferenceService,
        *,
        decoder: Decoder | None = None,
        pool: BufferPool | None = None,
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self.config = config
        self.service = service
        self.decoder = decoder or pick_decoder(config.decode.decoder)
        # One budget for the process: frames of every connection and the decode pool.
        self.budget = MemoryBudget(config.server.memory_budget_bytes // config.server.workers)
        self.pool = pool or BufferPool(budget=self.budget)
        self._housekeeping: asyncio.Task[None] | None = None
        # Host decodes' fair turns, made on the serving loop with the first frame, and the
        # turn each request handed to a worker holds (the worker ends it: decode_request).
        self._turns: DecodeTurns | None = None
        self._turn_of: dict[int, Turn] = {}
        self._own_executor = executor is None
        self.executor = executor or role_pool(worker_count(config.decode.workers), "frame")
        # Host decode is one worker job a frame; with decode.device cuda and a CUDA engine
        # active, JPEGs are decoded in batches on the GPU (edge_vision.frames.decode_gpu).
        d = config.decode
        self.host_decoder = HostBatchDecoder(self.decode_request, service.spec.pad_value)
        self.decoding = DecodeBatcher(
            self.host_decoder,
            None,
            self.executor,
            max_batch=d.device_batch,
            in_flight=d.device_streams,
            window_s=d.device_window_ms / 1000,
            adaptive=d.device_window_adaptive,
            min_frames=d.device_window_min_frames,
            release=self.release,
            on_batch=None if service.metrics is None else service.metrics.decode_batch_size.observe,
        )
        self._opencv_threads: int | None = None  # what _set_opencv_threads last set
        service.on_engine_change(self._engine_changed)
        # Reading the boxes' text (read.py): the recogniser loads when a session asks.
        self.reading = ReadStage(config)

    def _engine_changed(self, engine: Engine) -> None:
        # Frames land in pinned memory while a CUDA engine is active, so its H2D copies
        # are truly asynchronous; plain numpy memory otherwise.
        allocator = engine.host_allocator() or numpy_allocator
        self.pool.set_allocator(allocator)
        device = self.decoding.device
        if device is None and engine.accepts_device_frames:
            d = self.config.decode
            # nvImageCodec's host threads only parse headers: a few per decoder are enough,
            # with one decoder per stream in each worker process.
            threads = max(1, worker_count(0) // (self.config.server.workers * d.device_streams))
            # None, said in the log, when it cannot start: frames then go the host way.
            self.decoding.device = device = make_device_decoder(
                d.device,
                self.host_decoder,
                streams=d.device_streams,
                staging=allocator,
                library=d.device_library,
                cpu_threads=threads,
            )
            if device is not None:
                log.info(
                    "decoding JPEGs on %s with %s, up to %d a call, %d call(s) at a time",
                    device.device,
                    device.library,
                    self.config.decode.device_batch,
                    self.config.decode.device_streams,
                )
        if device is not None:
            device.set_staging_allocator(allocator)
        cuda = engine.accepts_device_frames
        self._set_opencv_threads(cuda, letterbox_on_gpu=device is not None and cuda)

    def _set_opencv_threads(self, cuda_engine: bool, *, letterbox_on_gpu: bool) -> None:
        """OpenCV's threads a call for the engine now serving (threads.py)."""
        threads = opencv_threads(self.config.server.opencv_threads, cuda_engine)
        if threads != self._opencv_threads:
            self._opencv_threads = threads
            cv2.setNumThreads(threads)
            where = "the GPU" if letterbox_on_gpu else "the host"
            shown = "OpenCV's default" if threads < 0 else str(threads)
            log.info("OpenCV threads a call: %s (frames letterboxed on %s)", shown, where)

    @property
    def head(self) -> Head:
        """The service's head (:func:`~edge_vision.model.heads.choose_head`, chosen at warm-up)."""
        head = self.service.head
        if head is None:
            raise RuntimeError("no engine has warmed up yet, so no head is chosen")
        return head

    async def close(self) -> None:
        if self._housekeeping is not None:
            await cancel_and_wait(self._housekeeping)
        await self.decoding.drain()  # abandoned decodes give their canvases back
        await self.reading.close()
        if self._own_executor:
            await asyncio.to_thread(self.executor.shutdown, True)

    # -- stages run in the worker pool ------------------------------------------------

    def request_for(self, frame: FrameMessage, input_size: int | None = None) -> DecodeRequest:
        """The header read and the pixel limit checked, on the host, before any decode.
        ``input_size``: the session's target long side instead of ``model.input_size``."""
        t0 = time.perf_counter()
        data = decode_base64(frame.image) if frame.image_is_base64 else frame.image
        header = read_image_header(data)
        check_pixel_limit(header, self.config.server.max_pixels)
        # One plan per frame: it sets both the DCT-downscale floor and the letterbox.
        limits = self.service.spec.limits
        if input_size is not None and input_size != limits.target:
            limits = replace(limits, target=input_size)
        lb = plan_for_frame(header.width, header.height, limits)
        # Refused before any decoder (host or device) allocates for it: an image bomb.
        min_size = (lb.new_w, lb.new_h) if self.config.decode.dct_downscale else None
        check_decoded_limit(header, min_size, self.config.server.max_decoded_bytes)
        return DecodeRequest(data, header, lb, t0)

    def decode_request(self, request: DecodeRequest) -> Prepared:
        """The host decode and letterbox of one frame (worker thread)."""
        data, header, lb, t0 = request.data, request.header, request.letterbox, request.started
        work_start = time.perf_counter()
        spec = self.service.spec
        min_size = (lb.new_w, lb.new_h) if self.config.decode.dct_downscale else None
        nbytes = decoded_bytes(header, min_size)
        turn = self._turn_of.pop(id(request), None)
        charged = 0
        if turn is None:
            # Not through a turn (the device decoder's host fallback): charged here, all it
            # will hold; the pixels of a decoder that writes into the pool are then counted
            # by the pool instead.
            need = decode_memory(data, header, min_size)
            if not self.budget.try_acquire(need, "decode"):
                raise decode_refusal(header, data, need, self.budget.limit, ever=True)
            charged = need
        try:
            try:
                decoded = self.decoder.decode(data, header, min_size, self.pool)
            except cv2.error as e:
                raise ClientError("bad_image", f"image could not be decoded: {e.msg}") from None
            if decoded.pooled and charged:
                self.budget.release(nbytes, "decode")
                charged -= nbytes
            t1 = time.perf_counter()
            canvas = self.pool.acquire((lb.out_h, lb.out_w, 3))
            try:
                letterbox_into(decoded.pixels, lb, canvas, spec.pad_value)
            except BaseException:
                self.pool.release(canvas)
                raise
            finally:
                if decoded.pooled:
                    self.pool.release(decoded.pixels)
        finally:
            self.budget.release(charged, "decode")
            if turn is not None:
                turn.done()
        t2 = time.perf_counter()
        return Prepared(canvas, lb, t1 - t0, t2 - t1, host_s=t2 - work_start)

    def full_frame(self, frame: FrameMessage) -> tuple[U8Array, Callable[[], None]]:
        """The frame decoded at its full size on the host, and how to give it back (read
        stage, worker thread): crops for the recogniser come from the original pixels,
        not from the engine's smaller input."""
        data = decode_base64(frame.image) if frame.image_is_base64 else frame.image
        header = read_image_header(data)
        # Charged before it is spent, as a host decode is (decode_turns.py): all the decode
        # holds while it runs, then the pixels it keeps unless the pool counts them.
        need, limit = decode_memory(data, header, None), self.budget.limit
        if not self.budget.try_acquire(need, "decode"):
            raise decode_refusal(header, data, need, limit, ever=need <= limit)
        try:
            decoded = self.decoder.decode(data, header, None, self.pool)
        except BaseException:
            self.budget.release(need, "decode")
            raise
        kept = 0 if decoded.pooled else decoded_bytes(header, None)
        self.budget.release(need - kept, "decode")

        def release() -> None:
            if decoded.pooled:
                self.pool.release(decoded.pixels)
            self.budget.release(kept, "decode")

        return decoded.pixels, release

    def postprocess(
        self, outputs: list[np.ndarray], lb: Letterbox, settings: FrameSettings
    ) -> F32Array:
        dets = self.head.decode(outputs, lb, settings.confidence)
        return filter_classes(dets, settings.classes)

    def postprocess_quads(
        self, outputs: list[np.ndarray], lb: Letterbox, settings: FrameSettings
    ) -> tuple[F32Array, F32Array | None]:
        """:meth:`postprocess` plus each box's rotated rectangle when the head gives them
        (DbnetHead; ``None`` otherwise): what the read stage straightens."""
        head = self.head
        if not isinstance(head, DbnetHead):
            return self.postprocess(outputs, lb, settings), None
        dets, quads = head.decode_quads(outputs, lb, settings.confidence)
        kept = filter_classes(dets, settings.classes)  # one class: all rows or none
        return kept, quads[: len(kept)]

    def _post_frame(
        self, outputs: list[np.ndarray], *, lb: Letterbox, settings: FrameSettings, quads: bool
    ) -> tuple[F32Array, F32Array | None]:
        """One frame's post-processing in its batch's post job (infer.py): the boxes, and
        their rotated rectangles when ``quads`` (the read stage's)."""
        if quads:
            return self.postprocess_quads(outputs, lb, settings)
        return self.postprocess(outputs, lb, settings), None

    # -- the async path ---------------------------------------------------------------

    async def prepare(
        self, frame: FrameMessage, settings: FrameSettings, *, owner: Hashable | None = None
    ) -> Prepared:
        """Read the header, check the limits, decode and letterbox one admitted frame (on
        the host, or batched on the GPU while a CUDA engine serves). Raises ClientError
        for bad input. The canvas is the caller's: hand it to :meth:`finish` or
        :meth:`release`. Cancelled while decoding, the decode goes on in its worker and
        its canvas goes back to the pool when it is done. ``owner`` (the session): whose
        turn a host decode takes (decode_turns.py)."""
        loop = asyncio.get_running_loop()
        if self._housekeeping is None:  # started with the first frame, on the serving loop
            d = self.config.decode
            self._housekeeping = loop.create_task(
                keep_pool_trimmed(self.pool, d.pool_idle_bytes, d.pool_idle_s, d.trim_heap)
            )
        if frame.image_is_base64:  # base64 of a large frame is worth a worker
            request = await loop.run_in_executor(
                self.executor, self.request_for, frame, settings.input_size
            )
        else:
            request = self.request_for(frame, settings.input_size)
        engine = self.service.engine
        on_device = engine is not None and engine.accepts_device_frames
        device = self.decoding.device
        if on_device and device is not None and device.takes(request):
            # Cancelled while decoding, the batcher gives the canvas back once it is made.
            return await self.decoding.decode(request, device=True)
        turn = await self._host_turn(request, owner)
        self._turn_of[id(request)] = turn
        try:
            return await self.decoding.decode(request, device=False)
        finally:
            left = self._turn_of.pop(id(request), None)
            if left is not None:  # no worker took it (cancelled while queued): end it here
                left.done()

    async def _host_turn(self, request: DecodeRequest, owner: Hashable | None) -> Turn:
        """The session's fair turn to decode on the host, with all the decode will hold
        charged to the memory budget (decode_turns.py)."""
        if self._turns is None:
            self._turns = DecodeTurns(
                worker_count(self.config.decode.workers),
                self.budget,
                self.config.server.memory_wait_s,
                asyncio.get_running_loop(),
            )
        header, lb = request.header, request.letterbox
        min_size = (lb.new_w, lb.new_h) if self.config.decode.dct_downscale else None
        cost = decode_memory(request.data, header, min_size)
        limit = self.budget.limit

        def refuse(nbytes: int) -> ClientError:
            return decode_refusal(header, request.data, nbytes, limit, ever=nbytes <= limit)

        return await self._turns.acquire(owner, cost, refuse)

    def release(self, prepared: Prepared) -> None:
        """Give a prepared frame's canvas back (:meth:`finish` does so itself)."""
        if not prepared.on_device:  # a device canvas is freed when its last user drops it
            self.pool.release(prepared.canvas)

    async def finish(
        self,
        frame: FrameMessage,
        prepared: Prepared,
        settings: FrameSettings,
        taken_at: float,
        *,
        supersede_key: Hashable | None = None,
        owner: Hashable | None = None,
        reading: SessionReading | None = None,
    ) -> FrameResult | Superseded:
        """Infer, post-process and (``reading``: the session's reading state, read.py)
        read one prepared frame; its canvas goes back on every path. Returns
        :data:`~edge_vision.frames.infer.SUPERSEDED` when a newer frame of ``supersede_key``
        took its place before the engine ran it; ``owner`` (the session) sets its turn in
        the engine's queue (edge_vision.frames.batch), where the host time its decode and
        letterbox took is charged to it. Raises EngineError when no engine can
        serve."""
        lb = prepared.letterbox
        post = partial(self._post_frame, lb=lb, settings=settings, quads=reading is not None)
        try:
            # Post-processed in the batch's post job (infer.py), not one hand-off a frame.
            inferred = await self.service.infer_then(
                prepared.canvas, post, supersede_key, owner=owner, cost=prepared.host_s
            )
        finally:
            self.release(prepared)
        if isinstance(inferred, Superseded):
            return inferred
        (dets, quads), batch = inferred
        done = time.perf_counter()
        timing = _timing(frame, taken_at, prepared, batch, done)
        texts = None
        if reading is not None:
            texts = await self.reading.read(
                reading,
                dets,
                quads,
                frame.received_at,
                lambda: self.full_frame(frame),
                wait=supersede_key is None,  # latest mode carries, never queues (read.py)
                size=(lb.src_w, lb.src_h),
            )
            read_done = time.perf_counter()
            timing["read_ms"] = (read_done - done) * 1000.0
            timing["server_ms"] = (read_done - frame.received_at) * 1000.0
        return FrameResult(frame, lb.src_w, lb.src_h, dets, timing, texts)

    async def process(
        self,
        frame: FrameMessage,
        settings: FrameSettings,
        taken_at: float | None = None,
    ) -> FrameResult:
        """:meth:`prepare` then :meth:`finish`, for a caller without a session (nothing
        can supersede its frame). Raises ClientError for bad input, EngineError when no
        engine can serve."""
        taken_at = time.perf_counter() if taken_at is None else taken_at
        prepared = await self.prepare(frame, settings)
        result = await self.finish(frame, prepared, settings, taken_at)
        if isinstance(result, Superseded):
            raise RuntimeError("a frame without a supersede key was superseded")
        return result


def _timing(
    frame: FrameMessage,
    taken_at: float,
    prep: Prepared,
    batch: BatchInfo,
    done: float,
) -> dict[str, float]:
    ms = 1000.0
    return {
        "decode_ms": prep.decode_s * ms,
        "shape_ms": prep.shape_s * ms,
        "queue_ms": (taken_at - frame.received_at + batch.wait_s) * ms,
        "batch_wait_ms": batch.wait_s * ms,
        "infer_ms": batch.infer_s * ms,
        "post_ms": batch.post_s * ms,
        "server_ms": (done - frame.received_at) * ms,
        "batch_size": float(batch.size),
    }
