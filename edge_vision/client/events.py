"""The events a session's rules raise (protocol 3, docs/events.md), as the client hands
them out: to a callback as each arrives, and to :meth:`EventStream.follow`'s iterator."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable

from .values import Event

log = logging.getLogger(__name__)


class EventStream:
    """Events in arrival order, across resumes: the newest ``buffer`` are kept until taken
    (the oldest go first when it is full); ``on_event`` hears of each at once."""

    def __init__(self, buffer: int, on_event: Callable[[Event], None] | None) -> None:
        self._events: deque[Event] = deque(maxlen=buffer)
        self._ready = asyncio.Event()
        self._on_event = on_event

    def push(self, event: Event) -> None:
        self._events.append(event)
        self._ready.set()
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:  # the caller's bug must not stop the client's reading
                log.exception("on_event for event %s failed", event.event_id)

    def wake(self) -> None:
        """The client is done: iterators stop waiting."""
        self._ready.set()

    async def follow(
        self, failure: Callable[[], BaseException | None], closed: Callable[[], bool]
    ) -> AsyncIterator[Event]:
        """Every event, until the client is closed (then it ends) or its session ended
        otherwise (then it raises what ended it, ``failure()``)."""
        while True:
            while self._events:
                yield self._events.popleft()
            if closed():
                return
            problem = failure()
            if problem is not None:
                raise problem
            self._ready.clear()
            await self._ready.wait()
