"""The engine supervisor: which engine serves, and keeping it able to.

:class:`EngineSupervisor` opens the configured engine (or the fallback), warms it up
before anything says ready, finds the model's head from the warm-up's output shapes,
keeps it warm while idle, degrades to the fallback when it fails, retries the configured
engine while degraded, and tells listeners (the pipeline's decode and memory) whenever an
engine becomes active. Frames never pass through here: the batching front
(:class:`~edge_vision.frames.infer.InferenceService`) serves them on :attr:`EngineSupervisor.engine`
and is told through :class:`Front` when that changes.

Degrade, don't die: when the configured engine fails at start or at run time and
``engine.fallback`` is ``onnxruntime``, the supervisor switches to the ONNX Runtime CPU
engine, keeps serving, and says so (``degraded`` in /readyz and /metrics, a warning in the
log). :meth:`EngineSupervisor.retry_primary` tries the configured engine again. An
:class:`~edge_vision.errors.EngineMismatch` (the engine serves another model than the
configured one) is a configuration error and stops start-up instead of degrading.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..common.aio import cancel_and_wait
from ..common.metrics import Metrics
from ..config import Config
from ..engines import Engine, create_engine
from ..errors import EngineError, EngineMismatch
from ..model.heads import Head, choose_head
from ..model.shape import choose_input_shape
from ..model.spec import ModelSpec

log = logging.getLogger(__name__)

U8Array = npt.NDArray[np.uint8]


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


class Front(Protocol):
    """What serves frames on the supervisor's engine (the batching front)."""

    def serve_on(self, engine: Engine) -> Awaitable[None] | None:
        """Send new work to ``engine`` from now on. Returns, when an engine served before,
        what finishes its work (awaited in the background before that engine closes)."""
        ...

    async def keep_warm(self, frame: U8Array) -> None:
        """Run ``frame`` the way frames are served (the engine sat idle)."""
        ...

    async def stop(self) -> None:
        """Shutting down: stop serving; frames still waiting fail."""
        ...


class EngineSupervisor:
    """Opens, warms, keeps warm, degrades and retries the engine (module docstring)."""

    def __init__(
        self,
        spec: ModelSpec,
        config: Config,
        front: Front,
        *,
        engine_factory: EngineFactory = create_engine,
        metrics: Metrics | None = None,
    ) -> None:
        self.spec = spec
        self.config = config
        self._front = front
        self._factory = engine_factory
        self.metrics = metrics
        self.engine: Engine | None = None
        #: The model's output head (post.choose_head), chosen when the first engine is warm.
        self.head: Head | None = None
        self.status = EngineStatus(configured=config.engine.kind)
        self._last_used = time.monotonic()
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

    def used(self) -> None:
        """The engine just ran a batch: keep-warm counts idle time from now."""
        self._last_used = time.monotonic()

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
        old_engine = self.engine
        self.engine = engine
        old_work = self._front.serve_on(engine)
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
        if old_work is not None or retired is not None:
            # Finishing the old engine's work waits for its running batches, and with
            # several in flight one of them may be waiting for this very switch (a second
            # failed batch wants _switch_lock in degrade): hand over in the background so
            # the two never wait on each other.
            task = asyncio.create_task(self._retire(old_work, retired), name="retire")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, old_work: Awaitable[None] | None, engine: Engine | None) -> None:
        if old_work is not None:
            await old_work
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
        self.used()
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
        await self._front.stop()
        if self.engine is not None:
            await self.engine.close()
        self.status.ready = False

    # -- degrade and retry ----------------------------------------------------------

    async def degrade(self, failed: Engine, error: EngineError) -> Engine | None:
        """``failed`` failed at run time: switch to the fallback unless another batch
        already did. The engine to run again on, or None when none can serve."""
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
        return self.engine

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

    # -- keep-warm ------------------------------------------------------------------

    async def _keep_warm(self) -> None:
        idle = self.config.engine.keep_warm_idle_s
        while True:
            await asyncio.sleep(max(0.5, idle / 4))
            if time.monotonic() - self._last_used >= idle and self.engine is not None:
                try:
                    await self._front.keep_warm(np.full((*self._warm_shape(), 3), 0, np.uint8))
                except EngineError as e:
                    log.warning("keep-warm inference failed: %s", e)

    def _warm_shape(self) -> tuple[int, int]:
        lim = self.spec.limits
        return choose_input_shape(16 * lim.target, 9 * lim.target, lim)
