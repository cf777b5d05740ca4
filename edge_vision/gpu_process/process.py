"""The GPU process: one a GPU, owning decode, the engine and post for every worker.

Started and restarted by the node's main process (:mod:`.supervisor`), it listens on a
Unix socket of the node. Each worker connects (:mod:`.link`), hands over its ring's file
descriptor (:mod:`.ring`) and submits frames by where they lie in it (:mod:`.wire`). The
frames of every worker wait in one queue (:class:`~.pending.PendingQueue`: latest wins
before any decode, least recently served session first); as many as the decoders can
take at once go on through the frame pipeline the workers would otherwise each run
(:class:`~.decoders.GpuSidePipeline`): decode in batches (split across the hardware JPEG
engine, the CUDA decoder and host threads, :mod:`.route`), letterbox, then the batching
front (:class:`~edge_vision.frames.infer.InferenceService`), so the engine's batches hold
frames of every camera of the node, and its post-processing. Only the detections (and,
for a session that reads text, each box's rotated rectangle) go back, with the stage
times and the batch's number; or, for a frame its worker post-processes (``raw``: the
workers ask for it, so that the post-processing of every camera of the node does not
share this one interpreter), the engine's outputs for it when they are the device post's
compact kind (:data:`WORKER_POSTS_UP_TO`).

A frame's end is always answered once: ``ok``, ``superseded`` (a newer frame of its
session took its place before its decode, or before the engine ran it), ``cancelled``
(its worker said so), or ``error`` with the code its client gets. A worker whose
connection closes takes its waiting frames with it (never decoded); the others go on.

The CPU stand-in (``server.gpu_process: on`` without a GPU) is this same process with
ONNX Runtime as its engine and the host decoders only: CI proves the hand-off, the
batching, superseding, ordering and faults with it (tests named ``cpu_stand_in``).

Liveness: the event loop writes the time into a shared array every :data:`BEAT_S`
(``beat``: time, ready, pid), which the supervisor reads; a loop stuck past its
hang limit is killed and restarted like a dead one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Hashable, MutableSequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..common.aio import cancel_and_wait, wait_event
from ..common.memory import settle_startup_heap, tune_serving_process
from ..common.messages import FrameMessage
from ..common.settings import FrameSettings
from ..config import Config
from ..engines import create_engine
from ..errors import ClientError, EngineError
from ..frames.infer import InferenceService, Superseded
from ..frames.pipeline import worker_count
from ..frames.supervisor import EngineFactory
from ..model.spec import ModelSpec, load_model_spec
from . import wire
from .decoders import GpuSidePipeline
from .pending import PendingQueue
from .ring import RingReader, Segment

log = logging.getLogger(__name__)

#: How often the event loop writes its heartbeat.
BEAT_S = 0.25
#: Each worker connection's send buffer (the kernel caps it at net.core.wmem_max).
SOCKET_BUFFER_BYTES = 4 << 20
#: How often the engine's state is compared with what the workers were last told.
STATUS_EVERY_S = 0.2


def gpu_process_config(config: Config, stand_in: bool) -> Config:
    """The node's config as the GPU process runs it: the whole memory budget is its own
    (decoded frames of every worker live here), and the CPU stand-in runs ONNX Runtime and
    host decode."""
    own = config.model_copy(deep=True)
    own.server.workers = 1
    if stand_in:
        own.engine.kind = "onnxruntime"
        own.decode.device = "host"
    return own


def decode_capacity(config: Config) -> int:
    """Frames that may be decoding at once; the rest wait in the queue, where a newer frame
    of their session can still take their place for free. Two device calls' worth per
    stream (one running, one gathering) with GPU decode, two frames a host thread."""
    d = config.decode
    host = 2 * worker_count(d.workers)
    return host if d.device == "host" else max(host, 2 * d.device_batch * d.device_streams)


def post_threads(config: Config) -> int:
    """Post threads of the GPU process: they deflate the outputs of every worker's frames
    (or post-process frames whose outputs are not the device post's), so at least a
    worker's (one a batch in flight) and up to half the host's cores (zlib, OpenCV and
    numpy release the GIL for most of it)."""
    per_worker = max(2, config.engine.in_flight)
    return max(per_worker, min(16, (os.cpu_count() or 2) // 2))


@dataclass(eq=False, slots=True)
class _Worker:
    """One worker's connection."""

    index: int
    pid: int
    ring: RingReader
    writer: asyncio.StreamWriter
    waiting: dict[int, _Frame] = field(default_factory=dict)  # seq -> frame in the queue
    closed: bool = False

    def send(self, *parts: bytes) -> None:
        if not self.closed and not self.writer.is_closing():
            self.writer.writelines(parts)


@dataclass(eq=False, slots=True)
class _Frame:
    worker: _Worker
    submit: wire.Submit
    arrived: float  # perf_counter when its submit was read


class GpuProcess:
    """Serves the frames of every worker on one engine (module docstring)."""

    def __init__(
        self,
        config: Config,
        *,
        stand_in: bool,
        spec: ModelSpec | None = None,
        engine_factory: EngineFactory = create_engine,
        gpu: int = 0,
    ) -> None:
        self.config = gpu_process_config(config, stand_in)
        self.stand_in = stand_in
        self.gpu = gpu
        self.spec = spec or load_model_spec(self.config.model)
        self.service = InferenceService(
            self.spec,
            self.config,
            engine_factory=engine_factory,
            post_threads=post_threads(self.config),
        )
        self.pipeline = GpuSidePipeline(self.config, self.service)
        self.queue: PendingQueue[_Frame] = PendingQueue()
        self.capacity = decode_capacity(self.config)
        self.decoding = 0
        self.workers: set[_Worker] = set()
        self.counts: dict[str, int] = dict.fromkeys(
            ("submitted", "ok", "superseded", "cancelled", "error", "torn", "orphaned"), 0
        )
        self.startup_error: str | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ids = itertools.count()
        self._sent_status: dict[str, Any] | None = None
        self._no_workers = asyncio.Event()

    # -- what the workers are told --------------------------------------------------

    def status(self) -> dict[str, Any]:
        st = self.service.status
        return {
            "ready": bool(st.ready and self.startup_error is None),
            "configured": st.configured,
            "active": st.active,
            "degraded": st.degraded,
            "reason": self.startup_error or st.reason,
            "failed": self.startup_error is not None,
            "warmup_s": st.warmup_s,
            "details": st.details,
            "head": self.service.spec.head,
            "max_batch": self.service.max_batch,
            "stand_in": self.stand_in,
            "pid": os.getpid(),
            "gpu": self.gpu,
        }

    def _broadcast_if_changed(self) -> None:
        now = self.status()
        if now != self._sent_status:
            self._sent_status = now
            for w in self.workers:
                w.send(wire.status(now))

    def _answer(self, frame: _Frame, result: wire.Result) -> None:
        self.counts[result.outcome] += 1
        frame.worker.send(*result.encode_parts())

    def _end(self, frame: _Frame, outcome: wire.Outcome, code: str = "", text: str = "") -> None:
        """``frame``'s end without detections: superseded, cancelled, or an error."""
        seq = frame.submit.seq
        self._answer(
            frame,
            wire.Result(seq, outcome, _NO_DETECTIONS, None, error_code=code, error_message=text),
        )

    # -- frames in -------------------------------------------------------------------

    def submit(self, worker: _Worker, sub: wire.Submit) -> None:
        self.counts["submitted"] += 1
        frame = _Frame(worker, sub, time.perf_counter())
        if not self.status()["ready"]:
            reason = self.startup_error or self.service.status.reason or "warming up"
            self._end(
                frame, "error", "engine_unavailable", f"the GPU process is not ready: {reason}"
            )
            return
        owner: Hashable = (id(worker), sub.session)
        worker.waiting[sub.seq] = frame
        old = self.queue.add(owner, frame, latest=sub.latest)
        if old is not None:
            old.worker.waiting.pop(old.submit.seq, None)
            self._end(old, "superseded")
        self._kick()

    def cancel(self, worker: _Worker, seq: int) -> None:
        frame = worker.waiting.pop(seq, None)
        if frame is not None and self.queue.remove((id(worker), frame.submit.session), frame):
            self._end(frame, "cancelled")
        # Otherwise it is decoding or in the engine: its answer comes, and the worker
        # drops it.

    def worker_gone(self, worker: _Worker) -> None:
        worker.closed = True
        self.workers.discard(worker)
        if not self.workers:
            self._no_workers.set()
        gone = self.queue.purge(lambda owner: isinstance(owner, tuple) and owner[0] == id(worker))
        self.counts["orphaned"] += len(gone)
        worker.waiting.clear()
        worker.ring.segment.close()  # frames decoding copied their bytes out already
        log.info(
            "worker w%d (pid %d) disconnected; %d of its frames dropped before decode",
            worker.index,
            worker.pid,
            len(gone),
        )

    def _kick(self) -> None:
        while self.decoding < self.capacity:
            nxt = self.queue.pop()
            if nxt is None:
                return
            owner, frame = nxt
            frame.worker.waiting.pop(frame.submit.seq, None)
            if frame.worker.closed:
                continue
            data = frame.worker.ring.read(frame.submit.record)  # copied out now
            if data is None:
                self.counts["torn"] += 1
                self._end(frame, "error", "internal", "the frame's bytes were not whole")
                continue
            self.decoding += 1
            task = asyncio.create_task(self._serve(owner, frame, data))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, owner: Hashable, frame: _Frame, data: bytes) -> None:
        sub = frame.submit
        settings = FrameSettings(sub.confidence, sub.classes, sub.input_size)
        message = FrameMessage(sub.seq, None, data, False, frame.arrived)
        taken = time.perf_counter()
        try:
            try:
                prepared = await self.pipeline.prepare(message, settings, owner=owner)
            finally:
                self.decoding -= 1
                self._kick()
            posted = partial(
                self.pipeline._post_frame,
                lb=prepared.letterbox,
                settings=settings,
                quads=sub.quads,
            )
            post: Any = partial(_rows_or_posted, posted=posted) if sub.raw else posted
            try:
                inferred = await self.service.infer_then(
                    prepared.canvas, post, owner if sub.latest else None, owner=owner
                )
            finally:
                self.pipeline.release(prepared)
        except ClientError as e:
            self._end(frame, "error", e.code, e.message)
            return
        except EngineError as e:
            self._end(frame, "error", "engine_unavailable", str(e))
            return
        except Exception:
            log.exception("frame %d of worker w%d failed", sub.seq, frame.worker.index)
            self._end(frame, "error", "internal", "the server failed on this frame")
            return
        if isinstance(inferred, Superseded):
            self._end(frame, "superseded")
            return
        value, batch = inferred
        rows = value if isinstance(value, bytes) else None
        dets, quads = (_NO_DETECTIONS, None) if rows is not None else value
        times = wire.StageTimes(
            prepared.decode_s,
            prepared.shape_s,
            taken - frame.arrived,
            batch.wait_s,
            batch.infer_s,
            batch.post_s,
            batch.size,
            batch.number,
        )
        self._answer(frame, wire.Result(sub.seq, "ok", dets, quads, times, outputs=rows))

    # -- the connections ---------------------------------------------------------------

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            task = asyncio.create_task(self._connection(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connection(self, conn: socket.socket) -> None:
        worker: _Worker | None = None
        try:
            hello, segment = await _receive_hello(conn)
            # Answers with outputs (a deflated byte map: 2-33 KB) leave in bursts of a
            # batch: room for them in the socket, so the loop rarely buffers and retries.
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
            reader, writer = await asyncio.open_unix_connection(sock=conn)
            worker = _Worker(hello.worker, hello.pid, RingReader(segment), writer)
            self.workers.add(worker)
            self._no_workers.clear()
            writer.write(wire.status(self.status()))
            log.info("worker w%d (pid %d) connected", hello.worker, hello.pid)
            while True:
                kind, body = await wire.read_message(reader)
                if kind == wire.SUBMIT:
                    self.submit(worker, wire.Submit.decode(body))
                elif kind == wire.CANCEL:
                    self.cancel(worker, wire.decode_cancel(body))
                await _drain_if_full(writer)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError) as e:
            if worker is None:
                log.warning("a worker's connection failed before its hello: %s", e)
        finally:
            if worker is not None:
                self.worker_gone(worker)
                worker.writer.close()  # and the socket under it
            else:
                conn.close()

    # -- running ---------------------------------------------------------------------

    async def run(
        self,
        path: str,
        beat: MutableSequence[float] | None = None,
        stop: asyncio.Event | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        """Listen on ``path``, start the engine (then ``on_ready``, before the workers
        hear it is ready), serve until ``stop`` is set and the workers are gone (or
        ``server.shutdown_grace_s`` + 2 s after ``stop``)."""
        stop = stop or asyncio.Event()
        listener = await asyncio.to_thread(_listen, path)
        background = [
            asyncio.create_task(self._accept(listener), name="gpu-accept"),
            asyncio.create_task(self._heartbeat(beat, stop), name="gpu-beat"),
        ]
        try:
            try:
                await self.service.start()
            except Exception as e:  # noqa: BLE001 - up and saying why beats a restart loop
                self.startup_error = f"engine failed to start: {e}"
                log.error("GPU process: %s", self.startup_error)
            if on_ready is not None:
                on_ready()
            self._broadcast_if_changed()
            self._beat(beat)  # ready now, for the supervisor too: not at the next beat
            log.info("GPU process ready: %s", _said(self.status()))
            await stop.wait()
            if self.workers:  # they stop first, finishing their frames in flight
                await wait_event(self._no_workers, self.config.server.shutdown_grace_s + 2)
        finally:
            await cancel_and_wait(*background, *self._tasks)
            listener.close()
            await asyncio.to_thread(_unlink, path)
            await self.service.close()
            await self.pipeline.close()

    def _beat(self, beat: MutableSequence[float] | None) -> None:
        if beat is not None:
            ready = float(self.status()["ready"])
            beat[0], beat[1], beat[2] = time.monotonic(), ready, float(os.getpid())

    async def _heartbeat(
        self, beat: MutableSequence[float] | None, stop: asyncio.Event | None = None
    ) -> None:
        next_status = 0.0
        parent = os.getppid()
        while True:
            now = time.monotonic()
            if stop is not None and os.getppid() != parent and not stop.is_set():
                log.error("the node's main process is gone; stopping")  # killed: no orphan
                stop.set()
            self._beat(beat)
            if now >= next_status:
                next_status = now + STATUS_EVERY_S
                self._broadcast_if_changed()
            await asyncio.sleep(BEAT_S if beat is not None else STATUS_EVERY_S)


def _listen(path: str) -> socket.socket:
    """The GPU process's socket, the service user's alone (in the supervisor's 0700
    folder, and 0600 itself)."""
    _unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(256)
    listener.setblocking(False)
    return listener


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


async def _drain_if_full(writer: asyncio.StreamWriter) -> None:
    """Answers are small: wait for the worker only when a megabyte is queued for it."""
    if writer.transport.get_write_buffer_size() > 1 << 20:
        await writer.drain()


async def _receive_hello(conn: socket.socket) -> tuple[wire.Hello, Segment]:
    """The worker's hello and its ring (SCM_RIGHTS), read off the loop: once a connection."""
    conn.settimeout(10.0)
    size = wire.FRAME.size + 16
    body, fds, _flags, _addr = await asyncio.to_thread(socket.recv_fds, conn, size, 1)
    conn.setblocking(False)
    if len(body) != size or not fds:
        for fd in fds:
            os.close(fd)
        raise ValueError("no hello with a ring")
    _length, kind = wire.FRAME.unpack_from(body)
    if kind != wire.HELLO:
        os.close(fds[0])
        raise ValueError("the first message was not a hello")
    hello = wire.Hello.decode(body[wire.FRAME.size :])
    try:
        segment = Segment.attach(fds[0], f"w{hello.worker}")
    except ValueError:
        os.close(fds[0])
        raise
    return hello, segment


def _said(status: dict[str, Any]) -> str:
    what = "CPU stand-in, " if status["stand_in"] else ""
    return (
        f"{what}engine {status['active'] or status['configured']}, max batch {status['max_batch']}"
    )


_NO_DETECTIONS = np.zeros((0, 6), np.float32)


#: A frame's outputs go to its worker to post-process when they are the device post's
#: (DB's byte map: uint8) or this small (a YOLO head's boxes after the device NMS);
#: larger ones (a float map, YOLO's raw anchors: 0.9-2.8 MB a frame, deflating them
#: would cost more than their post) are post-processed here.
WORKER_POSTS_UP_TO = 64 * 1024


def _rows_or_posted(outputs: list[np.ndarray], posted: Callable[..., Any]) -> Any:
    """A frame's rows of its batch's outputs, encoded for its worker's post-processing
    (in the post job, where post would have read them; the copy is the bytes), or, when
    they are not the device post's compact kind, post-processed here."""
    if all(o.dtype == np.uint8 for o in outputs) or sum(o.nbytes for o in outputs) <= (
        WORKER_POSTS_UP_TO
    ):
        return wire.encode_outputs(outputs)
    return posted(outputs)


def gpu_process_main(
    config_json: str,
    path: str,
    beat: MutableSequence[float],
    *,
    stand_in: bool,
    gpu: int = 0,
    visible: str | None = None,
) -> None:
    """The GPU process's entry point (spawned by the supervisor). ``visible``: its
    ``CUDA_VISIBLE_DEVICES``, set before anything touches CUDA."""
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s gpu{gpu} %(name)s: %(message)s"
    )
    config = Config.model_validate_json(config_json)
    logging.getLogger("edge_vision").setLevel(config.logging.level.upper())
    tune_serving_process(config.server.mmap_threshold_bytes)  # as a worker does
    process = GpuProcess(config, stand_in=stand_in, gpu=gpu)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)  # the node stops its workers first
        await process.run(path, beat, stop, on_ready=settle_startup_heap)

    asyncio.run(main())
