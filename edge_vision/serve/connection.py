"""One WebSocket connection: read → session core → send, a thin asyncio shell.

* the reader parses messages, answers bad ones with ``error`` at once and hands frames
  to the session core (edge_vision.session.core), which decides everything between
  arrival and reply: admission (``latest`` / ``every``), the in-flight limit
  (``session.latest_in_flight`` / ``session.every_in_flight``), decode-ahead,
  superseding, reply order and the session's counters;
* edge_vision.session.runner carries out the core's actions: each taken frame runs
  through the pipeline in a task, and one sender task writes the replies in the core's
  order through :meth:`Connection.send`;
* a ping task keeps the socket alive;
* the session's events (edge_vision.events.session_events): each result, in reply order,
  goes through the session's rules; what they raise goes to the node's sinks and, for a
  protocol 3 client, follows the result as ``event`` messages; a timer task ends the
  tracks of a stream gone quiet.

Nothing here is CPU-bound: parsing is a JSON load, every stage of the pipeline runs in
a worker thread or on the engine. A client that stops reading is closed with 4002 after
``server.send_timeout_s``; its frames never hold up anyone else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.http_websocket import WebSocketError

from ..common.aio import cancel_and_wait, with_timeout, within
from ..common.budget import FrameLedger, frame_cost, wait_for_room
from ..common.close_codes import CloseCode
from ..common.messages import FrameMessage
from ..common.metrics import Metrics
from ..config import Config, session_input_sizes
from ..errors import ClientError, ModelError
from ..events.hub import EventHub
from ..events.session_events import SessionEvents
from ..frames.pipeline import FramePipeline, FrameResult
from ..frames.read import SessionReading
from ..session import reply
from ..session.core import SessionCore
from ..session.receive import (
    ClientMessage,
    MessageBudget,
    PingMessage,
    SettingsMessage,
    check_frame,
    parse_binary,
    parse_text,
)
from ..session.record import Session
from ..session.runner import FrameCore, FrameTicket, SessionRunner
from ..session.versions import CURRENT, ProtocolVersion
from ..state import StateKeeper
from .websocket import ServerWebSocket, is_valid_utf8, reply_close_code

log = logging.getLogger(__name__)


class ConnectionDone(ConnectionError):
    """The socket is gone or being closed; stop this connection's tasks (a
    ConnectionError, which tells the session runner its client is gone)."""


class _InvalidText:
    """A text message that is not UTF-8 (RFC 6455 section 8.1: the connection fails)."""


INVALID_TEXT = _InvalidText()

#: What :meth:`Connection._parse` makes of one message.
Parsed = ClientMessage | ClientError | _InvalidText


@dataclass
class ConnectionContext:
    """What every connection of one app shares."""

    config: Config
    pipeline: FramePipeline
    metrics: Metrics
    keeper: StateKeeper
    label: Callable[[int], str]
    events: EventHub
    node_id: str


class Connection:
    def __init__(
        self,
        ws: web.WebSocketResponse,
        session: Session,
        ctx: ConnectionContext,
        protocol: ProtocolVersion = CURRENT,
    ):
        self.ws = ws
        self.session = session
        self.ctx = ctx
        # The version this client speaks: ask it (flags, close_code) where versions differ.
        self.protocol = protocol
        # Track ids (since protocol 2): the session's one tracker (session.tracker, which a
        # resume carries on), fed in reply order. Reading text (since protocol 2,
        # settings.read): what this session's labels said, kept on that tracker's tracks.
        self.reading = ctx.pipeline.reading.session(session.tracker)
        cfg = ctx.config
        # Zones, rules and events: for the node's sinks whatever version the client speaks;
        # event messages and zones in results for a protocol 3 client (versions.py).
        self.events = SessionEvents(
            session, cfg.events, ctx.events, ctx.label, ctx.node_id, websocket=protocol.events
        )
        # The session's rules (session/core.py), counting into the session itself so a
        # resumed session's counters carry on; the runner carries out what it decides.
        self.core: FrameCore = SessionCore.from_config(session.mode, cfg.session, books=session)
        self.runner = SessionRunner(
            self.core,
            ctx.pipeline,
            settings=session.frame_settings,
            send=self._send_reply,
            reading=self._reading_now,
            on_release=lambda frame: self.memory.release(id(frame)),
            metrics=ctx.metrics,
            name=f"session {session.id}",
        )
        self._send_lock = asyncio.Lock()
        # What this connection's frames hold in the node's memory budget (budget.py).
        self.memory = FrameLedger(ctx.pipeline.budget)
        self._memory_wanted = 0  # bytes a refused frame wanted: wait for them before reading
        self.client_close_code: int | None = None
        self._budget = MessageBudget(  # the read budget (receive.MessageBudget)
            cfg.session.max_messages_per_s, cfg.session.message_burst, time.monotonic()
        )
        self.closed_by_server: str | None = None

    @property
    def in_flight(self) -> int:
        """Frames taken from admission whose reply has not been sent yet."""
        return self.core.in_flight

    async def wait_idle(self) -> None:
        """Until no frame of this connection waits or is in flight (graceful shutdown)."""
        await self.runner.wait_idle()

    # -- sending ----------------------------------------------------------------------

    async def send(self, text: str) -> None:
        if self.ws.closed:
            raise ConnectionDone
        async with self._send_lock:
            try:
                await within(self.ws.send_str(text), self.ctx.config.server.send_timeout_s)
            except TimeoutError:
                log.info(
                    "session %s did not read its results for server.send_timeout_s (%g s); "
                    "closing with 4002",
                    self.session.id,
                    self.ctx.config.server.send_timeout_s,
                )
                await self.close(
                    CloseCode.SLOW_CLIENT, "client is not reading results", "slow_client"
                )
                raise ConnectionDone from None
            except (ConnectionError, RuntimeError):
                raise ConnectionDone from None

    async def close(self, code: int, message: str, reason: str) -> None:
        if self.ws.closed:
            return
        self.closed_by_server = reason
        self.ctx.metrics.connections_closed.labels(reason).inc()
        code = self.protocol.close_code(code)  # a v1 client gets the codes it knows
        try:
            await with_timeout(self.ws.close(code=code, message=message.encode()[:120]), 2.0)
        except (TimeoutError, ConnectionError):
            pass

    # -- the tasks --------------------------------------------------------------------

    async def serve(self) -> None:
        """Run until the socket closes. Returns after every task has stopped."""
        self.runner.start()
        ping = asyncio.create_task(self._ping(), name=f"ping-{self.session.id}")
        watch = asyncio.create_task(self._watch_tracks(), name=f"tracks-{self.session.id}")
        try:
            await self._read()
        finally:
            await cancel_and_wait(ping, watch)
            # Frames the socket closed on (waiting, or taken but never sent) are counted as
            # dropped by the core, so received = answered + dropped + rejected holds after
            # a resume too.
            unsent = self.core.outstanding
            await self.runner.close()
            self.memory.release_all()  # every frame of this connection is done with
            if self.runner.client_gone and self.closed_by_server is None:
                # Found by a send that failed, maybe while the reader waited for room in
                # the queue: the socket itself was never read again to see the close.
                log.info(
                    "session %s: client gone (its socket closed or reset) with %d frames "
                    "not yet answered; they are dropped and the session is released",
                    self.session.id,
                    unsent,
                )

    def end_events(self) -> None:
        """What the session's tracks become as this connection closes (session_events.py):
        they end now when the client ended the session, go on where a newer connection
        took it (resumed, or handed over at shutdown), and end after their keep time when
        the socket was lost and nobody resumed the session by then."""
        session, events, keeper = self.session, self.events, self.ctx.keeper
        if self.closed_by_server in ("superseded", "shutdown"):
            events.close()
        elif self.client_close_code == WSCloseCode.OK and self.closed_by_server is None:
            events.end()
        else:
            events.release(
                lambda: keeper.still_released(session),
                lambda: keeper.close_session(session, ended=False),
            )

    async def _send_reply(self, ticket: FrameTicket) -> None:
        """The core's Send: a result is serialised only now, so tracks see frame order."""
        res = ticket.reply
        if isinstance(res, ClientError):
            await self.send(reply.client_error(res))
        elif isinstance(res, FrameResult):
            text, events = self._result_text(res)
            await self.send(text)
            for event in events:  # what this frame raised, after its result (protocol 3)
                await self.send(event)
        else:
            raise RuntimeError(f"frame {ticket.seq} has no reply to send")

    def _reading_now(self) -> SessionReading | None:
        """The session's reading state for the frame being taken, when it reads text: for
        itself (``settings.read``), or only the boxes a rule with ``text`` could match."""
        own = self.session.read and self.protocol.text_reading
        if not own and not self.events.needs_text:
            return None
        self.reading.select = None if own else self.events.worth_reading
        return self.reading

    async def _watch_tracks(self) -> None:
        """The events' timer: a quiet stream's tracks end (``leave``)."""
        try:
            await self.events.watch(self.send)
        except ConnectionDone:
            return

    async def _charge_memory(self, frame: FrameMessage) -> bool:
        """Charge ``frame`` to the node's memory budget (budget.py); False when it found
        no room and was answered with over_memory_budget (counted as rejected).

        Without room an 'every' frame waits for it, up to ``server.memory_wait_s``; a
        'latest' frame is refused at once (a late frame is worth less) and the read loop
        then waits as long for room (:meth:`_wait_for_memory`). Either way nothing more
        is read meanwhile: aiohttp holds at most one more message and pauses the socket,
        and TCP slows the client."""
        cost = frame_cost(len(frame.image), frame.image_is_base64)
        budget = self.memory.budget
        if self.core.mode == "latest":
            # The frame it replaces is released at once: its bytes count as room.
            credit = sum(self.memory.charge_of(id(f)) for f in self.core.waiting)
            if self.memory.try_charge(id(frame), cost, credit=credit):
                return True
            await self.send(self._over_budget(frame, cost))
            self._memory_wanted = cost  # the read loop waits for room before reading on
            return False
        deadline = time.monotonic() + self.ctx.config.server.memory_wait_s
        while not self.memory.try_charge(id(frame), cost):
            self.ctx.metrics.memory_waits.inc()
            left = deadline - time.monotonic()
            if left <= 0 or not await wait_for_room(budget, cost, left):
                await self.send(self._over_budget(frame, cost))
                return False
        return True

    async def _wait_for_memory(self) -> None:
        """After a 'latest' frame was refused for want of room, read nothing more until
        there is room again (or ``server.memory_wait_s`` passed), holding nothing."""
        if self._memory_wanted:
            wait_s = self.ctx.config.server.memory_wait_s
            await wait_for_room(self.memory.budget, self._memory_wanted, wait_s)
            self._memory_wanted = 0

    def _over_budget(self, frame: FrameMessage, cost: int) -> str:
        err = ClientError(
            "over_memory_budget",
            f"the server's memory budget ({self.memory.budget.limit} bytes) has no room for "
            f"this {cost}-byte frame now; retry shortly",
            frame.id,
        )
        return self._rejected(err)

    def _result_text(self, res: FrameResult) -> tuple[str, list[str]]:
        """The result's message, and the event messages its frame raised."""
        s = self.session
        sends_ids = s.track and self.protocol.track_ids  # not for v1 (versions.py)
        tracks = None
        # In reply order: the frames' own order.
        if sends_ids or res.texts is not None or self.events.running:
            tracks = s.tracker.update(res.detections, res.frame.received_at).tolist()
            if res.texts is not None:  # what was read stays on the tracks it came with
                self.reading.settle(tracks, res.detections, res.texts)
        zones, events = self.events.observe(res, tracks)
        shows_text = s.read and self.protocol.text_reading  # else read for the rules only
        text = reply.result(
            res, self.ctx.label, s.dropped, tracks if sends_ids else None, zones, texts=shows_text
        )
        return text, events

    def _rejected(self, err: ClientError) -> str:
        """A message that may have been a frame, refused on arrival: received and
        rejected in the books (the core's), and the error to answer it with."""
        self.core.refused()
        self.ctx.metrics.frames_rejected.labels(err.code).inc()
        return reply.client_error(err)

    async def _ping(self) -> None:
        interval = self.ctx.config.server.ping_interval_s
        while not self.ws.closed:
            await asyncio.sleep(interval)
            async with self._send_lock:
                try:
                    await with_timeout(self.ws.ping(), self.ctx.config.server.send_timeout_s)
                except (TimeoutError, ConnectionError, RuntimeError):
                    return

    async def _read(self) -> None:
        cfg = self.ctx.config.server
        while not self.ws.closed:
            await self._wait_for_memory()
            try:
                msg = await self.ws.receive(timeout=cfg.idle_timeout_s)
            except TimeoutError:
                await self.close(CloseCode.IDLE_TIMEOUT, "idle timeout", "idle")
                return
            if msg.type is WSMsgType.TEXT or msg.type is WSMsgType.BINARY:
                parsed = self._parse(msg.type, msg.data)
                # Neither the message nor its frame (each up to max_message_bytes) is held
                # here longer than needed: the message not while its frame is handled (a
                # binary frame's image is its own copy, charged to the budget), the frame
                # not while waiting for the next message.
                del msg
                try:
                    queued_in_order = await self._handle(parsed)
                except ConnectionDone:
                    return
                del parsed
                # The read budget: an 'every' frame that was admitted is paced already (its
                # queue's back-pressure); anything else spends from the budget.
                if not queued_in_order:
                    wait = self._budget.take(time.monotonic())
                    if wait > 0:
                        await self._pause_reading(wait)
            elif msg.type is WSMsgType.CLOSE:
                await self._peer_closed(msg.data)
                return
            elif msg.type is WSMsgType.ERROR:
                await self._read_error(msg.data)
                return
            else:  # CLOSING, CLOSED: the socket went away (or we are closing it)
                self.client_close_code = self.ws.close_code
                if self.closed_by_server is None:
                    log.info("session %s: client disconnected", self.session.id)
                return

    async def _pause_reading(self, seconds: float) -> None:
        """Over its message budget: read nothing for ``seconds``. aiohttp's read queue
        fills, it pauses the socket, and TCP holds the sender back (receive.MessageBudget)."""
        m = self.ctx.metrics
        m.read_pauses.inc()
        m.read_paused_seconds.inc(seconds)
        await asyncio.sleep(seconds)

    async def _peer_closed(self, code: int | None) -> None:
        """The client sent a close frame: answer it (autoclose is off, websocket.py), with
        1002 when its code is one that must not be sent (RFC 6455 section 7.4.1)."""
        self.client_close_code = code
        answer = reply_close_code(code)
        if answer == CloseCode.PROTOCOL_ERROR:
            log.info(
                "session %s closed with code %s, which no endpoint may send; answered 1002",
                self.session.id,
                code,
            )
            await self.close(CloseCode.PROTOCOL_ERROR, "invalid close code", "protocol_error")
            return
        log.info("session %s: client closed the connection (code %s)", self.session.id, code)
        try:
            await with_timeout(self.ws.close(code=answer), 2.0)
        except (TimeoutError, ConnectionError):
            pass

    async def _read_error(self, exc: Any) -> None:
        """aiohttp failed the connection (it already sent its close code) or lost it."""
        s, m = self.session, self.ctx.metrics
        if isinstance(exc, WebSocketError) and exc.code == WSCloseCode.MESSAGE_TOO_BIG:
            self.core.refused()  # a message too broken to tell, answered by the close code
            m.frames_received.inc()
            m.frames_rejected.labels("message_too_large").inc()
            m.connections_closed.labels("message_too_large").inc()
            self.closed_by_server = "message_too_large"
            log.info("session %s sent a message over the size limit; closed with 1009", s.id)
            if isinstance(self.ws, ServerWebSocket):
                await self.ws.linger()  # so a client still writing reads the 1009
        elif isinstance(exc, WebSocketError):
            m.connections_closed.labels("protocol_error").inc()
            self.closed_by_server = "protocol_error"
            log.info("session %s broke RFC 6455 (%s); closed with %s", s.id, exc, exc.code)
        else:
            log.info("session %s: connection lost (%s)", s.id, type(exc).__name__)

    def _parse(self, kind: WSMsgType, data: Any) -> Parsed:
        """One message parsed and, for a frame, its cheap checks made (in either mode: in
        latest mode a newer frame may take this one's place before it is decoded, and its
        error would be lost); the error it earned instead, or :data:`INVALID_TEXT`."""
        now = time.perf_counter()
        try:
            parsed = parse_text(data, now) if kind is WSMsgType.TEXT else parse_binary(data, now)
            if isinstance(parsed, FrameMessage):
                check_frame(parsed, self.ctx.config.server.max_pixels)
        except ClientError as e:
            if kind is WSMsgType.TEXT and e.code == "bad_json" and not is_valid_utf8(data):
                return INVALID_TEXT
            return e
        return parsed

    async def _handle(self, parsed: Parsed) -> bool:
        """Answer or admit one parsed message. True for a frame admitted in 'every' mode (it
        waited for room in the queue, so the read budget does not pace it again)."""
        s, m = self.session, self.ctx.metrics
        if parsed is INVALID_TEXT:
            await self._invalid_text()
            raise ConnectionDone
        if isinstance(parsed, ClientError):
            e = parsed
            if e.code == "bad_settings":  # not a frame: an error reply, no frame counter
                m.frames_rejected.labels(e.code).inc()
                await self.send(reply.client_error(e))
                return False
            m.frames_received.inc()  # anything else may have been a frame
            await self.send(self._rejected(e))
            return False
        if isinstance(parsed, FrameMessage):
            s.last_seen = time.time()
            m.frames_received.inc()
            if not await self._charge_memory(parsed):
                return False  # answered with over_memory_budget (received and rejected)
            # Received in the books now; in 'every' mode first waits for room in the queue.
            if not await self.runner.admit(parsed):
                raise ConnectionDone  # the client is gone (a send failed): end the session
            return self.core.mode == "every"
        elif isinstance(parsed, SettingsMessage):
            await self._apply_settings(parsed)
        elif isinstance(parsed, PingMessage):
            try:
                text = reply.pong(parsed.payload)
            except ClientError as e:  # a payload that cannot be echoed
                m.frames_rejected.labels(e.code).inc()
                text = reply.client_error(e)
            await self.send(text)
        return False

    async def _invalid_text(self) -> None:
        """A text message that is not UTF-8 fails the connection with 1007 (RFC 6455
        section 8.1). Counted as received and rejected: a message answered by a code."""
        s, m = self.session, self.ctx.metrics
        self.core.refused()
        m.frames_received.inc()
        m.frames_rejected.labels("invalid_utf8").inc()
        log.info("session %s sent a text message that is not UTF-8; closing with 1007", s.id)
        await self.close(
            CloseCode.INVALID_PAYLOAD, "text message is not valid UTF-8", "invalid_utf8"
        )

    async def _apply_settings(self, msg: SettingsMessage) -> None:
        s = self.session
        sizes = session_input_sizes(self.ctx.config)
        if msg.input_size is not None and msg.input_size not in sizes:
            # Refused as a whole, like any bad_settings: nothing of it is applied.
            err = ClientError("bad_settings", f"'input_size' must be one of {sizes} or null")
            self.ctx.metrics.frames_rejected.labels(err.code).inc()
            await self.send(reply.client_error(err))
            return
        if msg.read:  # the recogniser loads (once per node) before the answer says read
            try:
                await self.ctx.pipeline.reading.reader()
            except ModelError as e:
                err = ClientError("bad_settings", f"'read' cannot be turned on: {e}")
                self.ctx.metrics.frames_rejected.labels(err.code).inc()
                await self.send(reply.client_error(err))
                return
        if msg.events is not None:  # the session's own zones, lines and rules
            problem = None
            if not self.protocol.events:
                number = self.protocol.number
                problem = f"'zones', 'lines' and 'rules' need protocol 3 (this speaks {number})"
            else:
                try:
                    self.events.apply(msg.events)
                except ValueError as e:
                    problem = str(e)
            if problem is not None:
                err = ClientError("bad_settings", problem)
                self.ctx.metrics.frames_rejected.labels(err.code).inc()
                await self.send(reply.client_error(err))
                return
        if msg.confidence is not None:
            s.confidence = msg.confidence
        if msg.classes is not None or msg.clear_classes:
            s.classes = msg.classes
        if msg.track is not None:
            s.track = msg.track
        if msg.input_size is not None or msg.clear_input_size:
            s.input_size = msg.input_size
        if msg.read is not None:
            if msg.read and not s.read:  # turned on: read afresh, nothing carried over
                self.reading = self.ctx.pipeline.reading.session(s.tracker)
            s.read = msg.read
        if msg.mode is not None and msg.mode != s.mode:
            s.mode = msg.mode
            self.runner.mode_changed(msg.mode)  # to latest: all but the newest waiting drop
        self.ctx.keeper.touch(s)
        extra = (
            {"track": s.track, "input_size": s.input_size, "read": s.read}
            if self.protocol.settings_extras  # not for v1 (versions.py)
            else None
        )
        if extra is not None and self.protocol.events:  # since protocol 3
            extra.update(self.events.settings())
        await self.send(reply.settings(s.mode, s.confidence, s.classes, extra))
