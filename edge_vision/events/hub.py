"""The node's events: every event a session raises goes through here to every sink.

:meth:`EventHub.emit` never blocks and never waits: it is called on the reply path of a
frame. An event is serialised once and put into each sink's outbox
(:class:`~.outbox.Outbox`); one delivery task per sink empties its outbox in order,
batch by batch, through the sink (:mod:`.sinks`). A delivery that fails is retried with
exponential backoff (0.1 s doubling up to 5 s) until the sink takes it, so events wait,
bounded, while a broker is down and all arrive once it is back, oldest first: at least
once, in order (a batch cut short by a broker going away may be sent again, which the
events' ids tell).

An event of a rule with ``crop: true`` first has its crop made (:mod:`.crop`) in a worker
thread, by one crop task in arrival order, so crops never hold up the loop and such a rule's
events keep their order; while more than :data:`MAX_CROPS_WAITING` wait, an event goes
without its crop (counted).

The hub also runs the timers that end a released session's tracks
(:meth:`EventHub.later`), so ``leave`` is raised for a camera that went away.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..common.aio import cancel_and_wait, with_timeout
from ..common.messages import FrameMessage
from ..common.metrics import Metrics
from ..config import EventsConfig
from .crop import crop_jpeg
from .metrics import EventMetrics
from .outbox import Outbox, OutboxStore, Queued
from .sinks import Sink, SinkError

log = logging.getLogger(__name__)

#: Events waiting for their crop; beyond this an event goes without one.
MAX_CROPS_WAITING = 32
_FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 5.0


@dataclass(frozen=True, slots=True)
class CropJob:
    """What a crop is made from: the frame as sent, and the box."""

    frame: FrameMessage
    box: Sequence[float]


class EventHub:
    """See the module docstring. ``sinks`` may be empty: events then reach only the
    sessions' WebSockets."""

    def __init__(
        self, config: EventsConfig, sinks: Sequence[Sink], metrics: Metrics | None = None
    ) -> None:
        self.config = config
        self.sinks = list(sinks)
        self.metrics = metrics.extension(EventMetrics) if metrics is not None else None
        self._store = OutboxStore(config.outbox_dir) if config.outbox_dir and sinks else None
        self.outboxes = {s.name: Outbox(s.name, config.outbox_max, self._store) for s in sinks}
        self._crops: asyncio.Queue[tuple[dict[str, Any], CropJob]] = asyncio.Queue()
        self._crops_pending = 0  # queued for their crop, or being cropped
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: set[asyncio.Task[None]] = set()
        self._overflow_logged: dict[str, float] = {}

    async def start(self) -> None:
        """Open the outboxes (loading what an earlier run left) and start delivering."""
        if self._store is not None:
            await self._store.open()
        for sink in self.sinks:
            outbox = self.outboxes[sink.name]
            found = await outbox.open()
            if found:
                log.info("events: %d for %s left from the last run, delivering", found, sink.name)
            self._gauge(sink.name)
            log.info("events go to %s", sink.describe())
            self._tasks.append(
                asyncio.create_task(self._deliver(sink, outbox), name=f"events-{sink.name}")
            )
        self._tasks.append(asyncio.create_task(self._make_crops(), name="events-crops"))

    async def close(self, drain_s: float = 0.0) -> None:
        """Stop: first give the sinks up to ``drain_s`` to take what waits; what is left
        stays in the outbox file (with ``events.outbox_dir``) for the next run."""
        if drain_s > 0 and self.outboxes:
            with contextlib.suppress(TimeoutError):
                drained = asyncio.gather(*(o.wait_empty() for o in self.outboxes.values()))
                await with_timeout(drained, drain_s)
        await cancel_and_wait(*self._timers, *self._tasks)
        self._tasks.clear()
        for sink in self.sinks:
            await sink.close()
        if self._store is not None:
            await self._store.flush()
            await self._store.close()

    # -- events in ----------------------------------------------------------------------

    def emit(self, body: dict[str, Any], crop: CropJob | None = None, *, source: str) -> None:
        """Send ``body`` (an event, :mod:`.event`) to every sink; never blocks."""
        if self.metrics is not None:
            self.metrics.raised.labels(body.get("on", ""), source).inc()
        if not self.sinks:
            return
        if crop is not None:
            if self._crops.qsize() < MAX_CROPS_WAITING:
                self._crops.put_nowait((body, crop))
                self._crops_pending += 1
                return
            body["crop"] = None
            if self.metrics is not None:
                self.metrics.crops_skipped.inc()
        self._queue(body)

    def _queue(self, body: dict[str, Any]) -> None:
        data = orjson.dumps(body)
        rule, at = str(body.get("rule", "")), float(body.get("at") or time.time())
        for name, outbox in self.outboxes.items():
            dropped = outbox.put(rule, at, data)
            if dropped:
                self._overflowed(name, len(dropped))
            self._gauge(name)

    def _overflowed(self, sink: str, n: int) -> None:
        if self.metrics is not None:
            self.metrics.dropped.labels(sink, "outbox_full").inc(n)
        now = time.monotonic()
        if now - self._overflow_logged.get(sink, -60.0) >= 60.0:  # once a minute at most
            self._overflow_logged[sink] = now
            log.warning(
                "events: the %s outbox is full (events.outbox_max = %d): its oldest events "
                'are dropped (edge_vision_events_dropped_total{reason="outbox_full"})',
                sink,
                self.config.outbox_max,
            )

    async def _make_crops(self) -> None:
        max_bytes = self.config.crop_max_bytes
        while True:
            body, job = await self._crops.get()
            f = job.frame
            try:
                jpg = await asyncio.to_thread(
                    crop_jpeg, f.image, f.image_is_base64, job.box, max_bytes
                )
            except Exception:  # a frame that cannot be cropped: the event goes without
                log.exception("events: the crop of event %s failed", body.get("event_id"))
                jpg = None
            body["crop"] = None if jpg is None else _b64(jpg)
            self._crops_pending -= 1
            self._queue(body)

    # -- events out ---------------------------------------------------------------------

    async def _deliver(self, sink: Sink, outbox: Outbox) -> None:
        backoff = _FIRST_BACKOFF_S
        m = self.metrics
        while True:
            await outbox.wait()
            items = outbox.peek(sink.batch)
            try:
                await sink.send(items)
            except SinkError as e:
                taken = items[: e.taken]
                self._delivered(sink.name, taken)
                done = list(taken)
                if e.rejected and e.taken < len(items):
                    done.append(items[e.taken])
                    if m is not None:
                        m.dropped.labels(sink.name, "rejected").inc()
                outbox.done(done)
                self._gauge(sink.name)
                if e.rejected:
                    continue
                if m is not None:
                    m.retried.labels(sink.name).inc()
                    m.up.labels(sink.name).set(0)
                if backoff == _FIRST_BACKOFF_S:
                    log.warning("events: %s is unavailable (%s); retrying", sink.name, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            if backoff != _FIRST_BACKOFF_S:
                log.info("events: %s is back", sink.name)
            backoff = _FIRST_BACKOFF_S
            self._delivered(sink.name, items)
            outbox.done(items)
            self._gauge(sink.name)
            if m is not None:
                m.up.labels(sink.name).set(1)

    def _delivered(self, sink: str, items: Sequence[Queued]) -> None:
        if self.metrics is None or not items:
            return
        now = time.time()
        self.metrics.delivered.labels(sink).inc(len(items))
        for i in items:
            self.metrics.latency.labels(sink).observe(max(0.0, now - i.at))

    def _gauge(self, sink: str) -> None:
        if self.metrics is not None:
            self.metrics.queued.labels(sink).set(len(self.outboxes[sink]))

    # -- timers -------------------------------------------------------------------------

    def later(self, delay_s: float, job: Callable[[], Awaitable[None]]) -> None:
        """Run ``job`` after ``delay_s`` (cancelled when the hub closes)."""

        async def run() -> None:
            await asyncio.sleep(delay_s)
            try:
                await job()
            except Exception:
                log.exception("events: a timer's job failed")

        task = asyncio.create_task(run(), name="events-timer")
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    def waiting(self) -> dict[str, int]:
        """The events not taken yet, per sink (and ``crops``: still being cropped, before
        any outbox); empty when there are none."""
        out = {name: len(o) for name, o in self.outboxes.items() if len(o)}
        if self._crops_pending:
            out["crops"] = self._crops_pending
        return out

    def status(self) -> dict[str, Any]:
        """For /readyz: each sink's queue."""
        return {name: {"queued": len(o)} for name, o in self.outboxes.items()}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
