"""A worker's frame path when its node has GPU processes: the same session rules, the
frames handed over.

With ``server.gpu_process`` on, a worker runs no engine and decodes nothing. Its session
runner (edge_vision.session.runner) drives the session core exactly as without, through
the same two pipeline steps; only the pipeline and the service behind them differ:

* :meth:`HandoffPipeline.prepare` reads the header and checks the pixel and decoded-size
  limits on the worker (so a bad frame never reaches the GPU process), and returns the
  frame still compressed: the session core's "prepared" (its decode turn is over, it waits
  for the engine), as for a frame a GPU batch will decode.
* :meth:`HandoffPipeline.finish` places the bytes in the worker's ring (:mod:`.ring`),
  submits them to the session's GPU process (:mod:`.link`) with the core's supersede key
  (a ``latest`` frame may be replaced there by its session's next one, before any decode),
  and turns the answer into the session's result, or
  :data:`~edge_vision.frames.infer.SUPERSEDED`, or the error the frame earned; then reads
  the boxes' text on the worker when the session asked (the recogniser stays here).
  A full ring refuses a ``latest`` frame at once and lets an ``every`` frame wait up to
  ``server.memory_wait_s`` (``over_memory_budget``, as the memory budget does). While no
  GPU process is ready (one is being restarted) a frame waits for it up to
  :data:`RESTART_WAIT_S`; the frames that were in it when it was lost are answered
  ``engine_unavailable`` at once (:mod:`.link`). Where the engine's outputs for the frame
  are the device post's compact kind, the GPU process answers them and the worker
  post-processes them on its own threads, with the head the GPU process chose: one
  interpreter a GPU cannot also post-process every camera of the node (docs/benchmarks.md,
  "post on the workers"); other outputs come back as boxes.
* :class:`GpuProcessService` stands where the inference service stands for the server:
  ready while a GPU process is, its engine's state (and each GPU process's, under
  ``details.gpu_process``) in /readyz and hello, ``engine_unavailable`` while none is.

Each session keeps to one GPU process while it has frames there (superseding is per GPU
process); with nothing in flight its next frame goes to the ready one with the fewest
frames of this worker (:func:`pick_link`): on a host with several GPUs cameras spread over
them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from ..common.aio import wait_event
from ..common.messages import FrameMessage
from ..common.metrics import Metrics
from ..common.settings import FrameSettings
from ..config import Config
from ..engines import Engine
from ..errors import ERROR_CODES, ClientError, EngineUnavailable
from ..frames.decode_batch import Prepared
from ..frames.infer import SUPERSEDED, BatchInfo, InferenceService, Superseded
from ..frames.pipeline import FramePipeline, FrameResult, _timing
from ..frames.read import SessionReading
from ..frames.supervisor import EngineStatus
from ..model.heads import F32Array, Head, choose_head
from ..model.shape import Letterbox
from ..model.spec import ModelSpec
from . import wire
from .link import GpuLink
from .ring import Record, RingWriter, Segment

log = logging.getLogger(__name__)


#: How long a frame waits for a GPU process being restarted (the node's warm start)
#: before it is answered ``engine_unavailable``. Frames that were in the GPU process
#: when it was lost are answered at once.
RESTART_WAIT_S = 30.0


def ring_bytes(config: Config) -> int:
    """A worker's ring: four of the largest messages it accepts (32 MiB at the default)."""
    return 4 * config.server.max_message_bytes


def pick_link(ready: Sequence[bool], in_flight: Sequence[int]) -> int | None:
    """The GPU process a session with nothing in flight sends to: the ready one with the
    fewest frames of this worker in flight, the lowest index on a tie; None when none is
    ready."""
    candidates = [i for i, r in enumerate(ready) if r]
    return min(candidates, key=lambda i: (in_flight[i], i)) if candidates else None


@dataclass(slots=True)
class Compressed:
    """A frame whose header was checked, still compressed: what ``prepare`` hands on."""

    data: bytes


@dataclass(slots=True)
class _Route:
    number: int  # the session's number on the wire while it has frames in flight
    link: int = -1  # its GPU process, once its first frame in flight picked one
    in_flight: int = 0


class _GpuProcessMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "edge_vision_gpu_process_"
        self.up = Gauge(p + "up", "1 while this worker's GPU process serves", registry=registry)
        self.losses = Counter(
            p + "losses", "Times this worker lost its GPU process (died or hung)", registry=registry
        )
        self.failed = Counter(
            p + "frames_failed",
            "Frames in flight in a GPU process when it was lost, answered engine_unavailable",
            registry=registry,
        )
        self.ring_full = Counter(
            p + "ring_full", "Frames refused because the hand-off ring was full", registry=registry
        )


class GpuProcessService(InferenceService):
    """The inference service as the server sees it, served by the node's GPU processes
    (module docstring). It loads no engine: ``start`` waits for a GPU process to be ready."""

    def __init__(
        self,
        spec: ModelSpec,
        config: Config,
        paths: Sequence[str],
        ring: RingWriter,
        *,
        worker: int = 0,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(spec, config, metrics=metrics)
        self.ring = ring
        self.room = asyncio.Event()  # set whenever a ring record is freed
        self.links = [
            GpuLink(p, ring, worker, on_change=self._changed, on_free=self.room.set) for p in paths
        ]
        self._status = EngineStatus(configured=config.engine.kind)
        self._counted = (0, 0)  # losses and failed frames already in the metrics
        self._metrics = metrics.extension(_GpuProcessMetrics) if metrics is not None else None
        self._ready = asyncio.Event()
        self._head: tuple[str, Head] | None = None
        self.changed = asyncio.Event()  # set whenever a GPU process's state changes
        self._changed()

    # -- what the server reads -------------------------------------------------------

    def _changed(self) -> None:
        ready = [link for link in self.links if link.ready]
        st = self._status
        st.ready = bool(ready)
        first = (ready or self.links)[0].status
        st.active = first.get("active")
        st.warmup_s = first.get("warmup_s")
        gone = [i for i, link in enumerate(self.links) if not link.ready]
        degraded = [link for link in ready if link.status.get("degraded")]
        st.degraded = bool(gone and ready) or bool(degraded)
        if not ready:
            lost = any(link.losses for link in self.links)
            st.reason = next((link.failed for link in self.links if link.failed), None) or (
                "the GPU process is restarting" if lost else "the GPU process is starting"
            )
        elif gone:
            st.reason = f"GPU process {', '.join(map(str, gone))} not ready"
        else:
            st.reason = str(degraded[0].status.get("reason")) if degraded else None
        st.details = {
            **(first.get("details") or {}),
            "gpu_process": [link.describe() for link in self.links],
        }
        head = first.get("head")
        if head and head != self.supervisor.spec.head:
            self.supervisor.spec = self.supervisor.spec.with_head(str(head))
        if st.ready:
            self._ready.set()
        self.changed.set()
        m = self._metrics
        if m is not None:
            m.up.set(1 if st.ready else 0)
            losses = sum(link.losses for link in self.links)
            failed = sum(link.failed_frames for link in self.links)
            m.losses.inc(losses - self._counted[0])
            m.failed.inc(failed - self._counted[1])
            self._counted = (losses, failed)

    @property
    def status(self) -> EngineStatus:
        return self._status

    @property
    def engine(self) -> Engine | None:
        return None  # the engine runs in the GPU process

    @property
    def head(self) -> Head | None:
        """The head the GPU process chose (its status names it), made here with this
        node's ``model`` settings: the worker post-processes its own frames."""
        name = next((ln.status.get("head") for ln in self.links if ln.status.get("head")), None)
        if name is None:  # none says one now (restarting): the last one, for frames posting
            return self._head[1] if self._head is not None else None
        if self._head is None or self._head[0] != name:
            self._head = (str(name), choose_head(str(name), [], self.config.model))
        return self._head[1]

    @property
    def max_batch(self) -> int:
        sizes = [int(link.status.get("max_batch") or 1) for link in self.links if link.ready]
        return min(sizes) if sizes else 1

    @property
    def in_flight(self) -> int:
        return sum(link.in_flight for link in self.links)

    async def start(self) -> None:
        """Connect to the GPU processes; return once one is ready, or raise
        EngineUnavailable with the reason a GPU process gave for not starting."""
        for link in self.links:
            link.start()
        while not self._ready.is_set():
            failed = [link.failed for link in self.links if link.failed]
            if failed and len(failed) == len(self.links):
                raise EngineUnavailable(failed[0])
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        for link in self.links:
            await link.close()
        self.ring.segment.close()

    async def health(self) -> str | None:
        return None if self._status.ready else (self._status.reason or "GPU process starting")

    async def retry_primary(self) -> bool:
        return self._status.ready and not self._status.degraded

    async def keep_warm(self, frame: Any) -> None:
        return None  # the GPU process keeps its own engine warm

    # -- frames ----------------------------------------------------------------------

    def link_of(self, route: _Route) -> GpuLink | None:
        """The session's GPU process when it has frames there, else the one
        :func:`pick_link` picks (the session keeps to it from now); None when that one is
        not ready."""
        if route.link >= 0:
            link = self.links[route.link]
            return link if link.ready else None
        i = pick_link([link.ready for link in self.links], [ln.in_flight for ln in self.links])
        if i is None:
            return None
        route.link = i
        return self.links[i]

    async def ready_link(self, route: _Route) -> GpuLink:
        """:meth:`link_of`, waiting up to :data:`RESTART_WAIT_S` while a GPU process is
        being restarted; EngineUnavailable when none comes back (or one said it cannot
        start)."""
        deadline = time.monotonic() + RESTART_WAIT_S
        while True:
            link = self.link_of(route)
            if link is not None:
                return link
            left = deadline - time.monotonic()
            failed = next((ln.failed for ln in self.links if ln.failed), None)
            if failed or left <= 0:
                raise EngineUnavailable(failed or "the GPU process is restarting; retry later")
            self.changed.clear()
            await wait_event(self.changed, left)


class HandoffPipeline(FramePipeline):
    """The worker's frame path with GPU processes (module docstring)."""

    def __init__(self, config: Config, service: GpuProcessService) -> None:
        super().__init__(config, service)
        self.handoff = service
        self._routes: dict[int, _Route] = {}
        self._numbers = itertools.count(1)
        self._seqs = itertools.count(1)

    async def prepare(
        self, frame: FrameMessage, settings: FrameSettings, *, owner: Hashable | None = None
    ) -> Prepared:
        t0 = time.perf_counter()
        if frame.image_is_base64:  # base64 of a large frame is worth a worker
            loop = asyncio.get_running_loop()
            request = await loop.run_in_executor(
                self.executor, self.request_for, frame, settings.input_size
            )
        else:
            request = self.request_for(frame, settings.input_size)
        checked = time.perf_counter() - t0
        return Prepared(Compressed(request.data), request.letterbox, checked, 0.0, on_device=True)

    def release(self, prepared: Prepared) -> None:
        """Nothing to give back: a prepared frame holds only its compressed bytes."""

    async def _place(self, data: bytes, latest: bool) -> Record:
        ring = self.handoff.ring
        if not ring.fits_ever(len(data)):
            raise ClientError("over_memory_budget", "the frame is larger than the hand-off ring")
        deadline = time.monotonic() + (0.0 if latest else self.config.server.memory_wait_s)
        while True:
            record = ring.put(data, next(self._seqs))
            if record is not None:
                return record
            left = deadline - time.monotonic()
            if left <= 0:
                m = self.handoff._metrics
                if m is not None:
                    m.ring_full.inc()
                raise ClientError(
                    "over_memory_budget",
                    "the node's hand-off to its GPU process is full (frames come faster than "
                    "it answers them); retry",
                )
            self.handoff.room.clear()
            await wait_event(self.handoff.room, left)

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
        """Hand the frame to its session's GPU process and wait for its answer; raises
        ClientError (the frame's error) or EngineUnavailable (no GPU process serves)."""
        compressed = prepared.canvas
        if not isinstance(compressed, Compressed):
            raise TypeError("finish() of a frame this pipeline did not prepare")
        latest = supersede_key is not None
        key = id(owner if owner is not None else frame)
        route = self._routes.get(key)
        if route is None:  # made before any wait: the session's next frames share it
            route = self._routes[key] = _Route(next(self._numbers))
        route.in_flight += 1
        try:
            link = await self.handoff.ready_link(route)
            record = await self._place(compressed.data, latest)
            try:
                seq, answer = link.submit(
                    record,
                    route.number,
                    settings,
                    latest=latest,
                    quads=reading is not None,
                    raw=True,
                )
            except BaseException:
                self.handoff.ring.free(record)
                raise
            try:
                result = await asyncio.shield(answer)
            except asyncio.CancelledError:
                link.cancel(seq)  # its record goes when the GPU process answers
                raise
        finally:
            route.in_flight -= 1
            if route.in_flight == 0:
                del self._routes[key]
        if result.outcome in ("superseded", "cancelled"):
            return SUPERSEDED
        if result.outcome == "error":
            code = result.error_code if result.error_code in ERROR_CODES else "internal"
            raise ClientError(code, result.error_message)
        return await self._result(
            frame, prepared, settings, result, taken_at, supersede_key, reading
        )

    def _post_outputs(
        self, encoded: bytes, *, lb: Letterbox, settings: FrameSettings, quads: bool
    ) -> tuple[F32Array, F32Array | None]:
        """The frame's post-processing from the outputs its GPU process answered."""
        return self._post_frame(wire.decode_outputs(encoded), lb=lb, settings=settings, quads=quads)

    async def _result(
        self,
        frame: FrameMessage,
        prepared: Prepared,
        settings: FrameSettings,
        result: Any,
        taken_at: float,
        supersede_key: Hashable | None,
        reading: SessionReading | None,
    ) -> FrameResult:
        t = result.times
        lb = prepared.letterbox
        dets, quads, post_s = result.detections, result.quads, t.post_s
        if result.outputs is not None:  # this worker post-processes the frame
            started = time.perf_counter()
            dets, quads = await asyncio.get_running_loop().run_in_executor(
                self.executor,
                partial(
                    self._post_outputs,
                    result.outputs,
                    lb=lb,
                    settings=settings,
                    quads=reading is not None,
                ),
            )
            post_s += time.perf_counter() - started  # the GPU process's part, then ours
        stages = Prepared(prepared.canvas, lb, prepared.decode_s + t.decode_s, t.shape_s)
        active = self.handoff.status.active or ""
        wait = t.queued_s + t.batch_wait_s
        batch = BatchInfo(t.batch_size, wait, t.infer_s, active, post_s, t.batch)
        done = time.perf_counter()
        timing = _timing(frame, taken_at, stages, batch, done)
        texts = None
        if reading is not None:  # as FramePipeline.finish: the recogniser is the worker's
            texts = await self.reading.read(
                reading,
                dets,
                quads,
                frame.received_at,
                lambda: self.full_frame(frame),
                wait=supersede_key is None,
                size=(lb.src_w, lb.src_h),
            )
            read_done = time.perf_counter()
            timing["read_ms"] = (read_done - done) * 1000.0
            timing["server_ms"] = (read_done - frame.received_at) * 1000.0
        return FrameResult(frame, lb.src_w, lb.src_h, np.asarray(dets, np.float32), timing, texts)


def worker_side(
    config: Config,
    spec: ModelSpec,
    paths: Sequence[str],
    node: str,
    *,
    worker: int = 0,
    metrics: Metrics | None = None,
) -> tuple[GpuProcessService, HandoffPipeline]:
    """A worker's service and pipeline that hand its frames to the GPU processes listening
    on ``paths``, through a ring made now for this worker of ``node``."""
    segment = Segment.create(node, f"w{worker}", ring_bytes(config))
    try:
        service = GpuProcessService(
            spec, config, paths, RingWriter(segment), worker=worker, metrics=metrics
        )
        return service, HandoffPipeline(config, service)
    except BaseException:
        segment.close()
        raise
