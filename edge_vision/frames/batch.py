"""Stage 5, batch: frames of one input shape, from any connection, go to the engine together.

:class:`BatchPlanner` is the pure policy. A frame waits at most ``window`` for others of
its shape; a bucket that reaches ``max_batch`` goes at once; frames of another shape never
wait for a batch they cannot join. When the engine is busy, frames simply accumulate, so
under load batches fill by themselves and the window costs nothing.

Fairness: when more frames wait than one batch takes, the frames of the session
(``owner``) served least recently go first, oldest first among equals. A latest-wins
connection that floods always has one decoded frame waiting; first come, first served,
a polite camera's frame would wait for the frame in the engine *and* that one.

:class:`Batcher` is the asyncio shell: it dispatches ready batches while fewer than
``max_in_flight`` are running, and sleeps until the next window deadline otherwise.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..common.aio import wait_event

T = TypeVar("T")
Shape = tuple[int, int]


@dataclass(frozen=True, slots=True)
class ReadyBatch(Generic[T]):
    shape: Shape
    items: list[T]
    dispatched_at: float


class _Entry(Generic[T]):
    """A queued frame; mutable so a newer frame of the same key can take its place."""

    __slots__ = ("item", "key", "owner", "shape", "t")

    def __init__(
        self, t: float, item: T, key: Hashable | None, owner: Hashable | None, shape: Shape
    ) -> None:
        self.t, self.item, self.key, self.owner, self.shape = t, item, key, owner, shape


# Owners whose last turn is remembered. Forgetting the least recently served one is
# harmless: an owner not remembered ranks as served longest ago, which it was.
_REMEMBERED_OWNERS = 4096


def _arrival(entry: _Entry[Any]) -> float:
    return entry.t


class BatchPlanner(Generic[T]):
    """Per-shape buckets; ``pop_ready`` returns the batch that should run next.

    An item added with a ``key`` (a latest-wins connection) replaces that key's item still
    waiting here, keeping its place in the queue: the engine then runs the connection's
    newest frame, not the one that happened to arrive first. The replaced item is
    returned so its owner can count it as dropped.

    An item's ``owner`` (its session; the ``key`` when not given) sets its turn: items of
    the owner served least recently go first (see the module docstring)."""

    def __init__(self, max_batch: int, window_s: float) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.max_batch = max_batch
        self.window_s = max(0.0, window_s)
        self._buckets: OrderedDict[Shape, list[_Entry[T]]] = OrderedDict()
        self._keyed: dict[Hashable, _Entry[T]] = {}
        self._count = 0
        # owner -> number of the batch that last served it, least recently served first
        self._served: OrderedDict[Hashable, int] = OrderedDict()
        self._batches = 0

    def __len__(self) -> int:
        return self._count

    def add(
        self,
        shape: Shape,
        item: T,
        now: float,
        key: Hashable | None = None,
        *,
        owner: Hashable | None = None,
    ) -> T | None:
        """Queue ``item``; returns the item of the same ``key`` it replaced, if any."""
        owner = key if owner is None else owner
        if key is not None:
            entry = self._keyed.get(key)
            if entry is not None:
                old = entry.item
                if entry.shape == shape:  # same place in the queue, newer frame
                    entry.item = item
                    return old
                self._buckets[entry.shape].remove(entry)  # a new frame size: requeue
                if not self._buckets[entry.shape]:
                    del self._buckets[entry.shape]
                self._count -= 1
                self._push(_Entry(entry.t, item, key, owner, shape))
                return old
        self._push(_Entry(now, item, key, owner, shape))
        return None

    def _push(self, entry: _Entry[T]) -> None:
        # In time order, so a bucket's first entry is its oldest (a requeued frame keeps its
        # time); arrivals come in order, so this is an append but for a requeue.
        bisect.insort(self._buckets.setdefault(entry.shape, []), entry, key=_arrival)
        if entry.key is not None:
            self._keyed[entry.key] = entry
        self._count += 1

    def next_deadline(self) -> float | None:
        """When the earliest bucket becomes ready (a full bucket is ready now)."""
        deadline: float | None = None
        for bucket in self._buckets.values():
            t = -float("inf") if len(bucket) >= self.max_batch else bucket[0].t + self.window_s
            deadline = t if deadline is None else min(deadline, t)
        return deadline

    def _turn(self, entry: _Entry[T]) -> tuple[int, float]:
        """Lower goes first: the owner's last batch (-1: none remembered), then age."""
        last = -1 if entry.owner is None else self._served.get(entry.owner, -1)
        return last, entry.t

    def pop_ready(self, now: float) -> ReadyBatch[T] | None:
        """Of the ready buckets, the one holding the frame whose turn comes first; up to
        ``max_batch`` of its frames, in turn order; None when no bucket is ready."""
        best: Shape | None = None
        best_turn: tuple[int, float] | None = None
        for shape, bucket in self._buckets.items():
            ready = len(bucket) >= self.max_batch or bucket[0].t + self.window_s <= now
            if not ready:
                continue
            turn = min(self._turn(e) for e in bucket)
            if best_turn is None or turn < best_turn:
                best, best_turn = shape, turn
        if best is None:
            return None
        bucket = self._buckets[best]
        taken = sorted(bucket, key=self._turn)[: self.max_batch]
        if len(taken) == len(bucket):
            del self._buckets[best]
        else:
            chosen = {id(e) for e in taken}
            bucket[:] = [e for e in bucket if id(e) not in chosen]
        for e in taken:
            if e.key is not None:
                self._keyed.pop(e.key, None)
            if e.owner is not None:
                self._served[e.owner] = self._batches
                self._served.move_to_end(e.owner)
        while len(self._served) > _REMEMBERED_OWNERS:
            self._served.popitem(last=False)
        self._batches += 1
        self._count -= len(taken)
        return ReadyBatch(best, [e.item for e in taken], now)

    def drain(self) -> list[T]:
        items = [e.item for b in self._buckets.values() for e in b]
        self._buckets.clear()
        self._keyed.clear()
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

    def submit(
        self,
        shape: Shape,
        item: T,
        key: Hashable | None = None,
        *,
        owner: Hashable | None = None,
    ) -> T | None:
        """Queue ``item``; returns the waiting item of the same ``key`` it replaced."""
        replaced = self.planner.add(shape, item, self._clock(), key, owner=owner)
        self._wake.set()
        return replaced

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
