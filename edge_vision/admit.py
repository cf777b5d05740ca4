"""Stage 2, admit: which received frames a connection will have served.

Each connection has one admission point with two policies:

* ``latest`` (real-time default): at most one frame waits. A newer frame replaces the
  waiting one, which is *dropped* and counted, so latency stays bounded when a client
  sends faster than the engine serves.
* ``every`` (replay, audits): frames wait in a bounded FIFO and are served in order. When
  it is full the connection stops reading its socket (TCP back-pressure) instead of
  dropping or buffering without bound.

:class:`AdmissionCore` is the pure policy; :class:`Admission` is its asyncio shell.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

from .settings import Mode

T = TypeVar("T")


class AdmissionCore(Generic[T]):
    """Pure admission policy: ``offer`` returns the frames it dropped."""

    def __init__(self, mode: Mode, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.mode: Mode = mode
        self.capacity = capacity
        self._waiting: deque[T] = deque()

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def full(self) -> bool:
        limit = 1 if self.mode == "latest" else self.capacity
        return len(self._waiting) >= limit

    def offer(self, item: T) -> list[T]:
        """Admit ``item``. In latest mode the waiting frame is replaced and returned."""
        dropped: list[T] = []
        if self.mode == "latest":
            dropped.extend(self._waiting)
            self._waiting.clear()
        elif self.full:
            raise RuntimeError("offer() on a full 'every' queue; wait for room first")
        self._waiting.append(item)
        return dropped

    def take(self) -> T | None:
        """The next frame to serve, oldest first."""
        return self._waiting.popleft() if self._waiting else None

    def set_mode(self, mode: Mode) -> list[T]:
        """Switch policy. Going to ``latest`` keeps only the newest waiting frame."""
        self.mode = mode
        dropped: list[T] = []
        if mode == "latest":
            while len(self._waiting) > 1:
                dropped.append(self._waiting.popleft())
        return dropped

    def drain(self) -> list[T]:
        """Remove and return everything waiting (connection closing)."""
        items = list(self._waiting)
        self._waiting.clear()
        return items


class Admission(Generic[T]):
    """Asyncio shell around :class:`AdmissionCore`."""

    def __init__(self, mode: Mode, capacity: int) -> None:
        self.core: AdmissionCore[T] = AdmissionCore(mode, capacity)
        self._changed = asyncio.Condition()

    @property
    def mode(self) -> Mode:
        return self.core.mode

    async def put(self, item: T) -> list[T]:
        """Admit a frame; in ``every`` mode waits for room. Returns the frames dropped."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self.core.full or self.core.mode == "latest")
            dropped = self.core.offer(item)
            self._changed.notify_all()
            return dropped

    async def get(self) -> T:
        """Wait for the next frame to serve."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.core) > 0)
            item = self.core.take()
            self._changed.notify_all()
            if item is None:  # unreachable: wait_for guaranteed an item
                raise RuntimeError("admission queue empty after wait")
            return item

    async def set_mode(self, mode: Mode) -> list[T]:
        async with self._changed:
            dropped = self.core.set_mode(mode)
            self._changed.notify_all()
            return dropped
