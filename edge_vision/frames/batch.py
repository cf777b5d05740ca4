"""Stage 5, batch: frames of one input shape, from any connection, go to the engine together.

:class:`BatchPlanner` is the pure policy. A frame waits at most ``window`` for others of
its shape; a bucket that reaches ``max_batch`` goes at once; frames of another shape never
wait for a batch they cannot join. When the engine is busy, frames simply accumulate, so
under load batches fill by themselves and the window costs nothing.

Fairness: when more frames wait than one batch takes, the turn goes by what each session
(``owner``) has cost the node: start-time fair queuing (Goyal et al., SIGCOMM 1996) on a
virtual clock of host seconds. Every frame a session has run advances its tag by the host
time its decode and letterbox took (``cost``, at least :data:`MIN_COST_S`, so frames that
cost the host nothing still take turns in order); the waiting frame whose session's tag is
lowest goes first, oldest first among equals; a session back from idle starts at the tag
of the frame that started last, so idling earns no credit. Sessions whose frames cost
alike take turns (the least recently served first, as before); one whose frames each took
half a second of CPU to decode (a 21 MP PNG of zeros) gets a turn for every hundred or so
of a camera whose frames decode in milliseconds, instead of one each while it also takes
the host's cores. A latest-wins connection that floods always has one decoded frame
waiting; first come, first served, a polite camera's frame would wait for the frame in the
engine *and* that one.

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

    __slots__ = ("cost", "item", "key", "owner", "shape", "t")

    def __init__(
        self,
        t: float,
        item: T,
        key: Hashable | None,
        owner: Hashable | None,
        shape: Shape,
        cost: float,
    ) -> None:
        self.t, self.item, self.key, self.owner, self.shape = t, item, key, owner, shape
        self.cost = cost


# Owners whose tag is remembered. Forgetting the least recently served one is harmless:
# an owner not remembered starts at the clock, as one back from idle does.
_REMEMBERED_OWNERS = 4096

#: The least a frame is charged (seconds): frames whose preparation cost the host nothing
#: (decoded on the device) or too little to measure still advance their session's tag, so
#: sessions of such frames take turns.
MIN_COST_S = 0.001


def _arrival(entry: _Entry[Any]) -> float:
    return entry.t


class BatchPlanner(Generic[T]):
    """Per-shape buckets; ``pop_ready`` returns the batch that should run next.

    An item added with a ``key`` (a latest-wins connection) replaces that key's item still
    waiting here, keeping its place in the queue: the engine then runs the connection's
    newest frame, not the one that happened to arrive first. The replaced item is
    returned so its owner can count it as dropped.

    An item's ``owner`` (its session; the ``key`` when not given) sets its turn, and its
    ``cost`` (host seconds) is charged to that owner when it runs: items of the owner that
    has cost least go first (see the module docstring)."""

    def __init__(self, max_batch: int, window_s: float) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.max_batch = max_batch
        self.window_s = max(0.0, window_s)
        self._buckets: OrderedDict[Shape, list[_Entry[T]]] = OrderedDict()
        self._keyed: dict[Hashable, _Entry[T]] = {}
        self._count = 0
        # owner -> its tag (host seconds charged, on the virtual clock), least recently
        # served first
        self._tags: OrderedDict[Hashable, float] = OrderedDict()
        self._clock = 0.0  # the tag at which the last batch's frames started

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
        cost: float = 0.0,
    ) -> T | None:
        """Queue ``item``; returns the item of the same ``key`` it replaced, if any.
        ``cost``: the host seconds the item took to prepare, charged to ``owner`` when it
        runs."""
        owner = key if owner is None else owner
        cost = max(MIN_COST_S, cost)
        if key is not None:
            entry = self._keyed.get(key)
            if entry is not None:
                old = entry.item
                if entry.shape == shape:  # same place in the queue, newer frame
                    entry.item, entry.cost = item, cost
                    return old
                self._buckets[entry.shape].remove(entry)  # a new frame size: requeue
                if not self._buckets[entry.shape]:
                    del self._buckets[entry.shape]
                self._count -= 1
                self._push(_Entry(entry.t, item, key, owner, shape, cost))
                return old
        self._push(_Entry(now, item, key, owner, shape, cost))
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

    def _start_tag(self, owner: Hashable | None) -> float:
        """Where the owner's next frame starts on the virtual clock: its tag, or the clock
        when it has less (back from idle, new, forgotten, or no owner at all)."""
        tag = self._clock if owner is None else self._tags.get(owner, self._clock)
        return max(tag, self._clock)

    def _turn(self, entry: _Entry[T]) -> tuple[float, float, float]:
        """Lower goes first: the owner's start tag; among equals (sessions back from idle
        start at the clock, where others wait) the owner that has cost least (one not
        remembered first), then age."""
        own = -float("inf") if entry.owner is None else self._tags.get(entry.owner, -float("inf"))
        return self._start_tag(entry.owner), own, entry.t

    def pop_ready(self, now: float) -> ReadyBatch[T] | None:
        """Of the ready buckets, the one holding the frame whose turn comes first; up to
        ``max_batch`` of its frames, in turn order; None when no bucket is ready."""
        best: Shape | None = None
        best_turn: tuple[float, float, float] | None = None
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
        # Every frame of an owner in this batch starts at the owner's tag from before it;
        # the owner is charged for all of them.
        starts = {e.owner: self._start_tag(e.owner) for e in taken}
        spent: dict[Hashable, float] = {}
        for e in taken:
            if e.key is not None:
                self._keyed.pop(e.key, None)
            if e.owner is not None:
                spent[e.owner] = spent.get(e.owner, 0.0) + e.cost
        for owner, cost in spent.items():
            self._tags[owner] = starts[owner] + cost
            self._tags.move_to_end(owner)
        self._clock = max(self._clock, *starts.values())
        while len(self._tags) > _REMEMBERED_OWNERS:
            self._tags.popitem(last=False)
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
        cost: float = 0.0,
    ) -> T | None:
        """Queue ``item``; returns the waiting item of the same ``key`` it replaced.
        ``cost``: host seconds charged to ``owner`` when it runs (the module docstring)."""
        replaced = self.planner.add(shape, item, self._clock(), key, owner=owner, cost=cost)
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
