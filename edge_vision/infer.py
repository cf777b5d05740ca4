"""Stage 6, infer: the engine behind a batcher, with warm-up, keep-warm and degrade.

:class:`InferenceService` owns the active engine. Frames come in one at a time
(:meth:`InferenceService.infer`), are batched by shape across connections, and each
caller gets its own slice of the batch outputs plus how the batch went (size, wait,
engine time).

Degrade, don't die: when the configured engine fails at start or at run time and
``engine.fallback`` is ``onnxruntime``, the service switches to the ONNX Runtime CPU
engine, keeps serving, and says so (``degraded`` in /readyz and /metrics, a warning in the
log). :meth:`InferenceService.retry_primary` tries the configured engine again. An
:class:`~edge_vision.errors.EngineMismatch` (the engine serves another model than the
configured one) is a configuration error and stops start-up instead of degrading.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .aio import cancel_and_wait
from .batch import Batcher, ReadyBatch
from .config import Config
from .engines import Engine, create_engine
from .errors import EngineError, EngineMismatch, EngineUnavailable, FrameSuperseded
from .metrics import Metrics
from .models import ModelSpec
from .post import Head, choose_head
from .shape import choose_input_shape

log = logging.getLogger(__name__)

U8Array = npt.NDArray[np.uint8]


@dataclass(slots=True)
class BatchInfo:
    size: int
    wait_s: float  # time the frame spent in the batcher
    infer_s: float  # engine time for the whole batch
    engine: str


@dataclass(slots=True)
class _Job:
    frame: U8Array
    future: asyncio.Future[tuple[list[np.ndarray], BatchInfo]]
    # This frame's own submit time: a frame that took a superseded frame's place in the
    # queue keeps that place (fairness) but reports only its own wait.
    submitted: float = field(default_factory=time.perf_counter)


def frames_for(engine: Engine, jobs: Sequence[_Job]) -> list[Any]:
    """The jobs' frames as ``engine`` takes them: canvases the GPU decoder left on the
    device are copied to the host for an engine that cannot read them (ONNX Runtime
    after a degrade, frames decoded before the switch)."""
    frames: list[Any] = [j.frame for j in jobs]
    if engine.accepts_device_frames:
        return frames
    return [f if isinstance(f, np.ndarray) else f.cpu().numpy() for f in frames]


@dataclass
class EngineStatus:
    configured: str
    active: str | None = None
    ready: bool = False
    degraded: bool = False
    reason: str | None = None
    warmup_s: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


EngineFactory = Callable[[str, ModelSpec, Config], Engine]


class InferenceService:
    """Batches frames across connections onto the active engine."""

    def __init__(
        self,
        spec: ModelSpec,
        config: Config,
        *,
        engine_factory: EngineFactory = create_engine,
        metrics: Metrics | None = None,
    ) -> None:
        self.spec = spec
        self.config = config
        self._factory = engine_factory
        self.metrics = metrics
        self.engine: Engine | None = None
        #: The model's output head (post.choose_head), chosen when the first engine is warm.
        self.head: Head | None = None
        self.status = EngineStatus(configured=config.engine.kind)
        self._batcher: Batcher[_Job] | None = None
        self._last_infer = time.monotonic()
        self._keep_warm_task: asyncio.Task[None] | None = None
        self._retry_task: asyncio.Task[None] | None = None
        self._switch_lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._listeners: list[Callable[[Engine], None]] = []

    def on_engine_change(self, listener: Callable[[Engine], None]) -> None:
        """Call ``listener(engine)`` whenever an engine becomes active (start, degrade)."""
        self._listeners.append(listener)
        if self.engine is not None:
            listener(self.engine)

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Load the configured engine (or the fallback), warm it up, then report ready."""
        kind = self.config.engine.kind
        try:
            engine = await self._load(kind)
        except EngineMismatch:
            raise  # a configuration error: serving on the fallback would hide it
        except EngineError as e:
            if not self._can_fall_back(kind):
                raise
            log.warning("engine %s failed to start (%s); degrading to onnxruntime", kind, e)
            engine = await self._load("onnxruntime")
            self.status.degraded, self.status.reason = True, f"{kind} failed to start: {e}"
        await self._activate(engine)
        if self.config.engine.keep_warm_idle_s > 0:
            self._keep_warm_task = asyncio.create_task(self._keep_warm(), name="keep-warm")
        if self.config.engine.retry_primary_s > 0 and self._can_fall_back(kind):
            self._retry_task = asyncio.create_task(self._retry_while_degraded(), name="retry")

    def _can_fall_back(self, kind: str) -> bool:
        return self.config.engine.fallback == "onnxruntime" and kind != "onnxruntime"

    async def _load(self, kind: str) -> Engine:
        engine = self._factory(kind, self.spec, self.config)
        if self.metrics is not None:
            engine.bind_metrics(self.metrics)
        try:
            await engine.start()
        except BaseException:
            await engine.close()
            raise
        return engine

    async def _activate(self, engine: Engine) -> None:
        t0 = time.perf_counter()
        shapes = await self.warm_up(engine)
        if self.head is None:  # once: a fallback engine runs the same model
            self.head = choose_head(self.spec.head, shapes, self.config.model)
            self.spec = self.spec.with_head(self.head.name)
        old_batcher, old_engine = self._batcher, self.engine
        self.engine = engine
        self._batcher = Batcher(
            self._run_batch,
            max_batch=engine.max_batch,
            window_s=self.config.engine.batch_window_ms / 1000.0,
            max_in_flight=engine.max_in_flight,
        )
        self._batcher.start()
        self.status.active = engine.kind
        self.status.ready = True
        for listener in self._listeners:
            listener(engine)
        self.status.warmup_s = time.perf_counter() - t0
        self.status.details = engine.describe()
        log.info(
            "engine %s ready (head %s, warm-up %.2f s)",
            engine.kind,
            self.spec.head,
            self.status.warmup_s,
        )
        retired = old_engine if old_engine is not engine else None
        if old_batcher is not None or retired is not None:
            # Stopping the old batcher waits for its running batches, and with several in
            # flight one of them may be waiting for this very switch (a second failed batch
            # wants _switch_lock in _degrade_and_rerun): hand over in the background so the
            # two never wait on each other.
            task = asyncio.create_task(self._retire(old_batcher, retired), name="retire")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, batcher: Batcher[_Job] | None, engine: Engine | None) -> None:
        """Move frames still queued on a replaced batcher over, then close its engine."""
        if batcher is not None:
            for job in await batcher.stop():
                if self._batcher is not None:
                    self._batcher.submit((job.frame.shape[0], job.frame.shape[1]), job)
        if engine is not None:
            await engine.close()

    async def warm_up(self, engine: Engine) -> list[tuple[int, ...]]:
        """Run every warm-up shape once so the first real frame pays no first-run cost."""
        lim = self.spec.limits
        shapes = sorted(
            {choose_input_shape(w, h, lim) for h, w in self.config.engine.warmup_shapes}
            or {choose_input_shape(lim.target, lim.target, lim)}
        )
        await engine.prepare(shapes)
        out_shapes: list[tuple[int, ...]] = []
        for h, w in shapes:
            frame = np.full((h, w, 3), self.spec.pad_value, np.uint8)
            outputs = await engine.infer([frame])
            out_shapes = [tuple(o.shape) for o in outputs]
        self._last_infer = time.monotonic()
        return out_shapes

    async def health(self) -> str | None:
        """None when frames can be served; otherwise the reason (for /readyz)."""
        if not self.status.ready or self.engine is None:
            return self.status.reason or "engine not ready"
        return await self.engine.health()

    async def close(self) -> None:
        await cancel_and_wait(self._keep_warm_task, self._retry_task)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        if self._batcher is not None:
            for job in await self._batcher.stop():
                if not job.future.done():
                    job.future.set_exception(EngineUnavailable("the server is shutting down"))
        if self.engine is not None:
            await self.engine.close()
        self.status.ready = False

    async def retry_primary(self) -> bool:
        """Try the configured engine again after a degrade; True when it is active."""
        kind = self.config.engine.kind
        async with self._switch_lock:
            if self.engine is not None and self.engine.kind == kind:
                return True
            try:
                engine = await self._load(kind)
            except EngineError as e:
                self.status.reason = f"{kind} retry failed: {e}"
                return False
            try:
                await self._activate(engine)
            except EngineError as e:
                # Warm-up failed (the engine went away again between load and warm-up):
                # stay on the current engine and keep retrying, never kill the retry loop.
                await engine.close()
                self.status.reason = f"{kind} retry failed during warm-up: {e}"
                return False
            self.status.degraded, self.status.reason = False, None
            return True

    async def _retry_while_degraded(self) -> None:
        while True:
            await asyncio.sleep(self.config.engine.retry_primary_s)
            if self.status.degraded and await self.retry_primary():
                log.info("engine %s is back; no longer degraded", self.config.engine.kind)

    async def _keep_warm(self) -> None:
        idle = self.config.engine.keep_warm_idle_s
        while True:
            await asyncio.sleep(max(0.5, idle / 4))
            if time.monotonic() - self._last_infer >= idle and self.engine is not None:
                try:
                    await self.infer(np.full((*self._warm_shape(), 3), 0, np.uint8))
                except EngineError as e:
                    log.warning("keep-warm inference failed: %s", e)

    def _warm_shape(self) -> tuple[int, int]:
        lim = self.spec.limits
        return choose_input_shape(16 * lim.target, 9 * lim.target, lim)

    # -- frames ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return self._batcher.in_flight if self._batcher else 0

    @property
    def max_batch(self) -> int:
        """The serving engine's max batch (:func:`~edge_vision.models.decide_max_batch`,
        narrowed by the engine), which its batcher uses; 1 before an engine serves."""
        return self.engine.max_batch if self.engine is not None else 1

    async def infer(
        self, frame: U8Array, supersede_key: Hashable | None = None
    ) -> tuple[list[np.ndarray], BatchInfo]:
        """One letterboxed frame → its outputs (batch axis removed) and the batch's story.

        With ``supersede_key`` (a latest-wins session) the frame takes the place of that
        key's frame still waiting for the engine, whose call raises FrameSuperseded."""
        if self._batcher is None or not self.status.ready:
            raise EngineUnavailable("the engine is not ready")
        fut: asyncio.Future[tuple[list[np.ndarray], BatchInfo]] = (
            asyncio.get_running_loop().create_future()
        )
        replaced = self._batcher.submit(
            (frame.shape[0], frame.shape[1]), _Job(frame, fut), supersede_key
        )
        if replaced is not None and not replaced.future.done():
            replaced.future.set_exception(FrameSuperseded())
        return await fut

    async def _run_batch(self, batch: ReadyBatch[_Job]) -> None:
        jobs = [j for j in batch.items if not j.future.cancelled()]
        if not jobs:
            return
        engine = self.engine
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
        self._last_infer = time.monotonic()
        active = self.engine.kind if self.engine else engine.kind
        if self.metrics is not None:
            self.metrics.observe_batch(
                len(jobs), infer_s, max(0.0, batch.dispatched_at - min(j.submitted for j in jobs))
            )
        for i, job in enumerate(jobs):
            if job.future.done():
                continue
            info = BatchInfo(
                len(jobs), max(0.0, batch.dispatched_at - job.submitted), infer_s, active
            )
            job.future.set_result(([o[i] for o in outputs], info))

    async def _degrade_and_rerun(
        self, failed: Engine, error: EngineError, jobs: Sequence[_Job]
    ) -> list[np.ndarray] | None:
        if not self._can_fall_back(failed.kind):
            log.error("engine %s failed: %s", failed.kind, error)
            return None
        async with self._switch_lock:
            if self.engine is failed:
                log.warning(
                    "engine %s failed at run time (%s); degrading to onnxruntime",
                    failed.kind,
                    error,
                )
                try:
                    fallback = await self._load("onnxruntime")
                except EngineError as e:
                    log.error("fallback engine failed too: %s", e)
                    return None
                self.status.degraded = True
                self.status.reason = f"{failed.kind} failed at run time: {error}"
                await self._activate(fallback)
        if self.engine is None:
            return None
        try:
            return await self.engine.infer(frames_for(self.engine, jobs))
        except EngineError as e:
            log.error("fallback engine failed: %s", e)
            return None
