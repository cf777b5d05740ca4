"""One session's events while a connection serves it: the glue between the session (its
tracker, its record), its rules (:class:`~.session_rules.SessionRules`) and the node's
hub (:class:`~.hub.EventHub`).

The connection (edge_vision.serve.connection) calls :meth:`SessionEvents.observe` with
each result in reply order, after the session's tracker gave its detections their ids;
what the rules raise goes to the hub (the sinks) and, for a protocol 3 client, back as
``event`` messages after the result. Tracks the tracker forgets (a frame that missed them
past the keep time, :meth:`SessionEvents.watch`'s timer on a quiet stream, the session's
end) raise ``leave``.

When the connection closes:

* the client ended the session (close code 1000): every live track ends now
  (:meth:`SessionEvents.end`);
* the socket was lost and the session may be resumed (:meth:`SessionEvents.release`):
  after the tracks' keep time, if no connection resumed the session meanwhile (here or,
  as the state store says, on another node), its tracks end then;
* a newer connection took the session over (resume, shutdown hand-over): nothing ends,
  the tracks go on there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from ..config import EventsConfig, SessionEventsSettings
from ..frames.results import FrameResult
from ..session import reply
from ..session.record import Session
from .event import event_body
from .hub import CropJob, EventHub
from .rules import Firing
from .session_rules import SessionRules

log = logging.getLogger(__name__)

#: Longest pause of the timer that ends a quiet stream's tracks.
_TICK_S = 0.5


def wall_time(perf: float) -> float:
    """A ``time.perf_counter()`` reading of this process as Unix seconds."""
    return time.time() - (time.perf_counter() - perf)


class SessionEvents:
    """See the module docstring. ``websocket``: the client speaks protocol 3 and gets
    ``event`` messages and zones."""

    def __init__(
        self,
        session: Session,
        config: EventsConfig,
        hub: EventHub,
        label: Callable[[int], str],
        node_id: str,
        *,
        websocket: bool,
    ) -> None:
        self.session = session
        self.config = config
        self.hub = hub
        self.label = label
        self.node_id = node_id
        self.websocket = websocket
        own = None
        if session.events:
            try:
                own = SessionEventsSettings.model_validate(session.events)
            except ValidationError as e:  # written by another release: run the node's only
                log.warning("session %s: its own rules cannot be read (%s)", session.id, e)
        try:
            self.rules = SessionRules.build(config, own, label)
        except ValueError as e:  # its names clash with this node's: the node's rules run
            log.warning("session %s: its own rules do not fit this node (%s)", session.id, e)
            self.rules = SessionRules.build(config, None, label)
        try:
            self.rules.restore(session.memory())
        except ValueError as e:
            log.warning("session %s: its rules' memory cannot be read (%s)", session.id, e)
        session.rule_memory_source = self.rules.state
        session.tracker.reports_ended = bool(self.rules.rules)

    # -- what the connection asks -------------------------------------------------------

    @property
    def running(self) -> bool:
        """The session has rules to run."""
        return bool(self.rules.rules)

    @property
    def zones(self) -> bool:
        """Results carry the zones each detection is in (a protocol 3 client, zones)."""
        return self.websocket and bool(self.rules.zones)

    @property
    def needs_text(self) -> bool:
        return self.rules.needs_text

    def worth_reading(
        self, detections: npt.NDArray[np.floating], width: int, height: int
    ) -> list[bool]:
        return self.rules.worth_reading(detections, width, height)

    def settings(self) -> dict[str, Any]:
        """The session's own zones, lines and rules, as the ``settings`` answer says."""
        return self.session.events_settings()

    # -- frames and time ------------------------------------------------------------------

    def observe(
        self, res: FrameResult, track_ids: list[int] | None
    ) -> tuple[list[tuple[str, ...]] | None, list[str]]:
        """One result, in reply order, with the ids the session's tracker gave (None when
        it was not asked: no rules). Returns the zones of each detection (None: results
        carry none) and the ``event`` messages to send after the result."""
        rules = self.rules
        if not rules.active:
            return None, []
        frame = res.frame
        t = wall_time(frame.received_at)
        if track_ids is None:
            zones = rules.zones_for(res.detections, res.width, res.height)
            return (zones if self.zones else None), []
        texts = None
        if res.texts is not None:
            texts = [r.text if r is not None else None for r in res.texts]
        zones, fired = rules.observe(
            res.detections,
            track_ids,
            texts,
            res.width,
            res.height,
            t,
            frame.id,
            frame.ts,
        )
        ended = self.session.tracker.take_ended()
        if ended:
            fired += rules.ended(ended, t)
        return (zones if self.zones else None), self._raise(fired, frame)

    def expire(self) -> list[str]:
        """The timer: end the tracks a quiet stream has not shown for their keep time.
        Returns the ``event`` messages to send."""
        tracker = self.session.tracker
        tracker.expire(time.perf_counter())
        ended = tracker.take_ended()
        if not ended:
            return []
        return self._raise(self.rules.ended(ended, time.time()), None)

    async def watch(self, send: Callable[[str], Awaitable[None]]) -> None:
        """Run :meth:`expire` while the connection lives (a task the connection owns),
        sending what it raises through ``send``."""
        tracker = self.session.tracker
        while True:
            await asyncio.sleep(min(_TICK_S, tracker.expire_after() / 2))
            if not self.running:
                continue
            for text in self.expire():
                await send(text)

    def _raise(self, fired: list[Firing], frame: Any) -> list[str]:
        """Every firing to the hub (the node's rules always; a session's own only with
        ``events.session_rules_to_sinks``) and, for a protocol 3 client, as messages."""
        out = []
        for f in fired:
            body = event_body(f, self.node_id, self.session.id)
            if not f.rule.own or self.config.session_rules_to_sinks:
                crop = CropJob(frame, f.obs.box) if f.rule.crop and frame is not None else None
                # The hub may add the crop to its own copy: the WebSocket never carries one.
                self.hub.emit(dict(body), crop, source="session" if f.rule.own else "node")
            elif self.hub.metrics is not None:
                self.hub.metrics.raised.labels(f.rule.on, "session").inc()
            if self.websocket:
                out.append(reply.event(body))
        return out

    # -- settings ---------------------------------------------------------------------

    def apply(self, changes: Mapping[str, Any]) -> None:
        """A ``settings`` message's ``zones``, ``lines`` and ``rules`` (a key with null
        clears it). ValueError, saying why, when they are refused: nothing changes then."""
        if not self.config.session_rules:
            raise ValueError(
                "this server takes no zones or rules of a session's own (events.session_rules)"
            )
        merged = {**self.session.events_settings(), **changes}
        merged = {k: v for k, v in merged.items() if v is not None}
        try:
            own = SessionEventsSettings.model_validate(merged)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from None
        rules = SessionRules.build(self.config, own, self.label)  # ValueError: names
        rules.carry_from(self.rules)
        self.rules = rules
        self.session.events = {k: v for k, v in own.public().items() if v}
        self.session.rule_memory_source = rules.state
        self.session.tracker.reports_ended = bool(rules.rules)

    # -- the end of the connection -------------------------------------------------------

    def close(self) -> None:
        """The connection is done with the session: its memory stays as plain data
        (unless a newer connection of this node runs the session's rules already)."""
        if self.session.rule_memory_source == self.rules.state:
            self.session.rule_memory = self.rules.state()
            self.session.rule_memory_source = None

    def end(self) -> None:
        """The session ended (its client closed it): every live track ends now."""
        ended = self.session.tracker.end_all()
        ended += self.session.tracker.take_ended()
        fired = self.rules.ended(sorted(set(ended)), time.time())
        fired += self.rules.end_all(time.time())
        self._raise_to_sinks(fired)
        self.close()

    def release(
        self, still_released: Callable[[], Awaitable[bool]], rewrite: Callable[[], None]
    ) -> None:
        """The socket was lost; the session may be resumed. After the tracks' keep time,
        if ``still_released()`` says no connection took the session meanwhile, its
        tracks end (``leave`` to the sinks), the session keeps its ids, and ``rewrite()``
        writes its record again so that a later resume does not end them twice."""
        self.close()
        if not self.running:
            return
        tracker = self.session.tracker

        async def end_if_released() -> None:
            if not await still_released() or self.session.connected:
                return  # resumed: its tracks go on there
            now = time.time()
            ended = sorted(set(tracker.end_all() + tracker.take_ended()))
            self._raise_to_sinks(self.rules.ended(ended, now) + self.rules.end_all(now))
            self.session.rule_memory = self.rules.state()
            rewrite()

        self.hub.later(tracker.expire_after() + _TICK_S, end_if_released)

    def _raise_to_sinks(self, fired: list[Firing]) -> None:
        websocket, self.websocket = self.websocket, False  # the socket is gone
        try:
            self._raise(fired, None)
        finally:
            self.websocket = websocket
