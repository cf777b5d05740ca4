"""Stage 5, batch: frames of one input shape, from any connection, go to the engine together.

:class:`BatchPlanner` is the pure policy. A frame waits at most ``window`` for others of
its shape; a bucket that reaches ``max_batch`` goes at once; frames of another shape never
wait for a batch they cannot join. When the engine is busy, frames simply accumulate, so
under load batches fill by themselves and the window costs nothing.

:class:`Batcher` is the asyncio shell: it dispatches ready batches while fewer than
``max_in_flight`` are running, and sleeps until the next window deadline otherwise.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .aio import wait_event

T = TypeVar("T")
Shape = tuple[int, int]


@dataclass(frozen=True, slots=True)
class ReadyBatch(Generic[T]):
    shape: Shape
    items: list[T]
    enqueued_at: list[float]
    dispatched_at: float


class BatchPlanner(Generic[T]):
    """Per-shape FIFO buckets; ``pop_ready`` returns the batch that should run next."""

    def __init__(self, max_batch: int, window_s: float) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.max_batch = max_batch
        self.window_s = max(0.0, window_s)
        self._buckets: OrderedDict[Shape, deque[tuple[float, T]]] = OrderedDict()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, shape: Shape, item: T, now: float) -> None:
        self._buckets.setdefault(shape, deque()).append((now, item))
        self._count += 1

    def _oldest(self, bucket: deque[tuple[float, T]]) -> float:
        return bucket[0][0]

    def next_deadline(self) -> float | None:
        """When the earliest bucket becomes ready (a full bucket is ready now)."""
        deadline: float | None = None
        for bucket in self._buckets.values():
            t = (
                -float("inf")
                if len(bucket) >= self.max_batch
                else self._oldest(bucket) + self.window_s
            )
            deadline = t if deadline is None else min(deadline, t)
        return deadline

    def pop_ready(self, now: float) -> ReadyBatch[T] | None:
        """The ready bucket holding the oldest frame, up to ``max_batch`` of it, or None."""
        best: Shape | None = None
        best_age = float("inf")
        for shape, bucket in self._buckets.items():
            ready = len(bucket) >= self.max_batch or self._oldest(bucket) + self.window_s <= now
            if ready and self._oldest(bucket) < best_age:
                best, best_age = shape, self._oldest(bucket)
        if best is None:
            return None
        bucket = self._buckets[best]
        taken = [bucket.popleft() for _ in range(min(self.max_batch, len(bucket)))]
        if not bucket:
            del self._buckets[best]
        self._count -= len(taken)
        return ReadyBatch(best, [i for _, i in taken], [t for t, _ in taken], now)

    def drain(self) -> list[T]:
        items = [i for b in self._buckets.values() for _, i in b]
        self._buckets.clear()
        self._count = 0
        return items


class Batcher(Generic[T]):
    """Runs ``run_batch`` on ready batches, at most ``max_in_flight`` at a time."""

    def __init__(
        self,
        run_batch: Callable[[ReadyBatch[T]], Awaitable[None]],
        *,
        max_batch: int,
        window_s: float,
        max_in_flight: int,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.planner: BatchPlanner[T] = BatchPlanner(max_batch, window_s)
        self._run_batch = run_batch
        self._max_in_flight = max_in_flight
        self._in_flight = 0
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def submit(self, shape: Shape, item: T) -> None:
        self.planner.add(shape, item, self._clock())
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="batcher")

    async def stop(self) -> list[T]:
        """Stop dispatching, wait for running batches; returns frames never dispatched."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        # A batch may stop its own batcher (engine switch inside a failed batch): skip it.
        others = {t for t in self._running if t is not asyncio.current_task()}
        if others:
            await asyncio.gather(*others, return_exceptions=True)
        return self.planner.drain()

    async def _dispatch(self, batch: ReadyBatch[T]) -> None:
        try:
            await self._run_batch(batch)
        finally:
            self._in_flight -= 1
            self._wake.set()

    async def _loop(self) -> None:
        while True:
            now = self._clock()
            while self._in_flight < self._max_in_flight:
                batch = self.planner.pop_ready(now)
                if batch is None:
                    break
                self._in_flight += 1
                task = asyncio.create_task(self._dispatch(batch))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
            timeout: float | None = None
            if self._in_flight < self._max_in_flight:
                deadline = self.planner.next_deadline()
                if deadline is not None:
                    timeout = max(0.0, deadline - self._clock())
            self._wake.clear()
            if timeout == 0.0:
                continue
            await wait_event(self._wake, timeout)
