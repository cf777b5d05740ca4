"""Stage 6, infer: frames from every connection, batched by shape onto the active engine.

:class:`InferenceService` is the batching front. Frames come in one at a time
(:meth:`InferenceService.infer`), are batched by shape across connections
(edge_vision.frames.batch: latest-wins replacement, least recently served session first), and
each caller gets its own slice of the batch outputs plus how the batch went (size, wait,
engine time), or :data:`SUPERSEDED` when a newer frame of its session took its place
before the engine ran it. A caller may hand in its frame's post-processing
(:meth:`InferenceService.infer_then`): the posts of one batch then run together in one
job on the service's post threads, so a batch costs the event loop one hand-off there
and back instead of one a frame. Which engine serves, its warm-up, keep-warm, degrade and retry
are the :class:`~edge_vision.frames.supervisor.EngineSupervisor`'s (``service.supervisor``);
the service answers for it (``status``, ``engine``, ``head``, ``start``, ``close``, ...)
so the server and the pipeline hold one object.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import numpy as np
import numpy.typing as npt

from ..common.metrics import Metrics
from ..common.threads import role_pool
from ..config import Config
from ..engines import Engine, create_engine
from ..engines.choice import resolve_engine
from ..errors import EngineError, EngineUnavailable
from ..model.heads import Head
from ..model.spec import ModelSpec
from .batch import Batcher, ReadyBatch
from .supervisor import EngineFactory, EngineStatus, EngineSupervisor

log = logging.getLogger(__name__)

U8Array = npt.NDArray[np.uint8]


@dataclass(slots=True)
class BatchInfo:
    size: int
    wait_s: float  # time the frame spent in the batcher
    infer_s: float  # engine time for the whole batch
    engine: str
    post_s: float = 0.0  # the batch's post job, which post-processes its frames in turn
    number: int = 0  # the service's count of batches run: frames with one number ran together


class Superseded:
    """A newer frame of the same session took this frame's place in the engine's queue
    before the engine ran it (the one value: :data:`SUPERSEDED`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SUPERSEDED"


SUPERSEDED: Final = Superseded()

Inferred = tuple[list[np.ndarray], BatchInfo]  # the frame's outputs, and its batch's story
R = TypeVar("R")
#: A frame's post-processing: its outputs (batch axis removed) -> what its caller gets.
Post = Callable[[list[np.ndarray]], Any]


def _outputs(outputs: list[np.ndarray]) -> list[np.ndarray]:
    return outputs


@dataclass(slots=True)
class _Job:
    frame: U8Array
    future: asyncio.Future[tuple[Any, BatchInfo] | Superseded]
    owner: Hashable | None  # its session, for the batcher's turns
    post: Post
    cost: float = 0.0  # host seconds its preparation took, charged to its owner's turns
    # This frame's own submit time: a frame that took a superseded frame's place in the
    # queue keeps that place (fairness) but reports only its own wait.
    submitted: float = field(default_factory=time.perf_counter)

    @property
    def shape(self) -> tuple[int, int]:
        return self.frame.shape[0], self.frame.shape[1]


def frames_for(engine: Engine, jobs: Sequence[_Job]) -> list[Any]:
    """The jobs' frames as ``engine`` takes them: canvases the GPU decoder left on the
    device are copied to the host for an engine that cannot read them (ONNX Runtime
    after a degrade, frames decoded before the switch)."""
    frames: list[Any] = [j.frame for j in jobs]
    if engine.accepts_device_frames:
        return frames
    return [f if isinstance(f, np.ndarray) else f.host() for f in frames]


class InferenceService:
    """Batches frames across connections onto the engine its supervisor keeps serving."""

    def __init__(
        self,
        spec: ModelSpec,
        config: Config,
        *,
        engine_factory: EngineFactory = create_engine,
        metrics: Metrics | None = None,
        post_threads: int | None = None,
    ) -> None:
        config = resolve_engine(config)  # engine.kind auto: this machine's engine
        self.config = config
        self.metrics = metrics
        self._batcher: Batcher[_Job] | None = None
        # Post jobs (one a batch) run here, beside the engine's batches in flight; OpenCV and
        # numpy release the GIL. Made at start, shut at close.
        self._post: ThreadPoolExecutor | None = None
        # One a batch in flight (a worker's share of the GPU), unless the caller serves a
        # whole node (the GPU process: every worker's post runs here).
        self._post_threads = post_threads or max(2, config.engine.in_flight)
        self._posting: set[asyncio.Task[None]] = set()
        self._batches = 0
        self.supervisor = EngineSupervisor(
            spec, config, self, engine_factory=engine_factory, metrics=metrics
        )

    # -- the supervisor's, answered here ----------------------------------------------

    @property
    def spec(self) -> ModelSpec:
        return self.supervisor.spec

    @property
    def engine(self) -> Engine | None:
        return self.supervisor.engine

    @property
    def head(self) -> Head | None:
        return self.supervisor.head

    @property
    def status(self) -> EngineStatus:
        return self.supervisor.status

    def on_engine_change(self, listener: Callable[[Engine], None]) -> None:
        self.supervisor.on_engine_change(listener)

    async def start(self) -> None:
        if self._post is None:
            self._post = role_pool(self._post_threads, "post")
        await self.supervisor.start()

    async def close(self) -> None:
        await self.supervisor.close()  # stops the front: every post job has ended
        if self._post is not None:
            await asyncio.to_thread(self._post.shutdown, True)
            self._post = None

    async def health(self) -> str | None:
        return await self.supervisor.health()

    async def retry_primary(self) -> bool:
        return await self.supervisor.retry_primary()

    # -- what the supervisor asks of the front (supervisor.Front) ----------------------

    def serve_on(self, engine: Engine) -> Awaitable[None] | None:
        old = self._batcher
        self._batcher = Batcher(
            self._run_batch,
            max_batch=engine.max_batch,
            window_s=self.config.engine.batch_window_ms / 1000.0,
            max_in_flight=engine.max_in_flight,
        )
        self._batcher.start()
        return None if old is None else self._move_waiting(old)

    async def _move_waiting(self, old: Batcher[_Job]) -> None:
        """Frames still queued on a replaced batcher go to the current one, keyless: the
        session's newer frame may already wait there, and must not be replaced by this."""
        for job in await old.stop():
            if self._batcher is not None:
                self._batcher.submit(job.shape, job, owner=job.owner, cost=job.cost)

    async def keep_warm(self, frame: U8Array) -> None:
        await self.infer(frame)

    async def stop(self) -> None:
        if self._batcher is not None:
            for job in await self._batcher.stop():
                if not job.future.done():
                    job.future.set_exception(EngineUnavailable("the server is shutting down"))
        if self._posting:  # batches the engine ran are still answered
            await asyncio.gather(*self._posting, return_exceptions=True)

    # -- frames ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return self._batcher.in_flight if self._batcher else 0

    @property
    def max_batch(self) -> int:
        """The serving engine's max batch (:func:`~edge_vision.model.spec.decide_max_batch`,
        narrowed by the engine), which its batcher uses; 1 before an engine serves."""
        engine = self.supervisor.engine
        return engine.max_batch if engine is not None else 1

    async def infer(
        self,
        frame: U8Array,
        supersede_key: Hashable | None = None,
        *,
        owner: Hashable | None = None,
    ) -> Inferred | Superseded:
        """One letterboxed frame → its outputs (batch axis removed) and the batch's story.

        With ``supersede_key`` (a latest-wins session) the frame takes the place of that
        key's frame still waiting for the engine, whose call returns :data:`SUPERSEDED`.
        ``owner`` (the session; the key when not given) sets the frame's turn."""
        return await self.infer_then(frame, _outputs, supersede_key, owner=owner)

    async def infer_then(
        self,
        frame: U8Array,
        post: Callable[[list[np.ndarray]], R],
        supersede_key: Hashable | None = None,
        *,
        owner: Hashable | None = None,
        cost: float = 0.0,
    ) -> tuple[R, BatchInfo] | Superseded:
        """:meth:`infer`, then ``post`` on the frame's outputs in the batch's post job
        (a post thread); its exception is this frame's alone. ``cost``: the host seconds
        the frame's decode and letterbox took, charged to ``owner``'s turns (batch.py)."""
        if self._batcher is None or not self.status.ready:
            raise EngineUnavailable("the engine is not ready")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[Any, BatchInfo] | Superseded] = loop.create_future()
        job = _Job(frame, fut, supersede_key if owner is None else owner, post, cost)
        replaced = self._batcher.submit(
            job.shape, job, supersede_key, owner=job.owner, cost=job.cost
        )
        if replaced is not None and not replaced.future.done():
            replaced.future.set_result(SUPERSEDED)
        return cast("tuple[R, BatchInfo] | Superseded", await fut)

    async def _run_batch(self, batch: ReadyBatch[_Job]) -> None:
        jobs = [j for j in batch.items if not j.future.cancelled()]
        if not jobs:
            return
        engine = self.supervisor.engine
        if engine is None:
            raise RuntimeError("batch dispatched with no engine")
        t0 = time.perf_counter()
        outputs: list[np.ndarray] | None
        try:
            outputs = await engine.infer(frames_for(engine, jobs))
        except EngineError as e:
            outputs = await self._degrade_and_rerun(engine, e, jobs)
            if outputs is None:
                for j in jobs:
                    if not j.future.done():
                        j.future.set_exception(EngineUnavailable(str(e)))
                return
        infer_s = time.perf_counter() - t0
        self._batches += 1
        self.supervisor.used()
        active = self.supervisor.engine.kind if self.supervisor.engine else engine.kind
        if self.metrics is not None:
            self.metrics.observe_batch(
                len(jobs), infer_s, max(0.0, batch.dispatched_at - min(j.submitted for j in jobs))
            )
        # The batch leaves the engine's in-flight count now: its post job runs in a task of
        # its own, so the next batch can take the slot meanwhile.
        task = asyncio.create_task(
            self._answer(jobs, outputs, infer_s, active, batch, self._batches)
        )
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)

    async def _answer(
        self,
        jobs: Sequence[_Job],
        outputs: list[np.ndarray],
        infer_s: float,
        engine: str,
        batch: ReadyBatch[_Job],
        number: int = 0,
    ) -> None:
        """Post-process the batch's frames in one post job and answer each; whatever goes
        wrong around that job fails every frame still waiting, never leaves one hanging."""
        try:
            if self._post is None:
                raise EngineUnavailable("the inference service is closed")
            started = time.perf_counter()
            posted = await asyncio.get_running_loop().run_in_executor(
                self._post, _post_batch, jobs, outputs
            )
            post_s = time.perf_counter() - started
        except asyncio.CancelledError:
            for job in jobs:
                job.future.cancel()
            raise
        except BaseException as e:
            error = e if isinstance(e, Exception) else RuntimeError(repr(e))
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)
            if not isinstance(e, Exception):
                raise
            return
        for job, (value, failed) in zip(jobs, posted, strict=True):
            if job.future.done():
                continue
            if failed is not None:
                job.future.set_exception(failed)
                continue
            wait_s = max(0.0, batch.dispatched_at - job.submitted)
            info = BatchInfo(len(jobs), wait_s, infer_s, engine, post_s, number)
            job.future.set_result((value, info))

    async def _degrade_and_rerun(
        self, failed: Engine, error: EngineError, jobs: Sequence[_Job]
    ) -> list[np.ndarray] | None:
        engine = await self.supervisor.degrade(failed, error)
        if engine is None:
            return None
        try:
            return await engine.infer(frames_for(engine, jobs))
        except EngineError as e:
            log.error("fallback engine failed: %s", e)
            return None


def _post_batch(
    jobs: Sequence[_Job], outputs: list[np.ndarray]
) -> list[tuple[Any, Exception | None]]:
    """Each job's post on its rows of the batch outputs (post thread), in batch order:
    (value, its exception). A frame whose caller already stopped waiting is skipped (a
    best-effort look at its future's flag)."""
    done: list[tuple[Any, Exception | None]] = []
    for i, job in enumerate(jobs):
        value: Any = None
        error: Exception | None = None
        if not job.future.done():
            try:
                value = job.post([o[i] for o in outputs])
            except StopIteration as e:  # a future cannot carry StopIteration
                error = RuntimeError(f"post-processing raised {e!r}")
            except Exception as e:  # noqa: BLE001 - this frame's failure, handed to its caller
                error = e
        done.append((value, error))
    return done
