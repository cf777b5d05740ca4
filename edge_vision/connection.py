"""One WebSocket connection: receive → admit → (pipeline) → reply, as three small tasks.

* the reader parses messages, answers bad ones with ``error`` at once, admits frames;
* the producer takes admitted frames while fewer than the mode's limit are in flight
  (``session.latest_in_flight`` or ``session.every_in_flight``) and starts their
  processing; in ``latest`` mode one frame decodes at a time and a newer decoded frame
  takes the place of the one still waiting for the engine, which is dropped at once;
* the sender writes replies strictly in admission order.

Nothing here is CPU-bound: parsing is a JSON load, every stage of the pipeline runs in
a worker thread or on the engine. A client that stops reading is closed with 1008 after
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

from . import reply
from .admit import Admission
from .aio import cancel_and_wait, with_timeout, within
from .config import Config
from .errors import ClientError, EngineError, FrameSuperseded
from .metrics import Metrics
from .pipeline import FramePipeline
from .receive import FrameMessage, PingMessage, SettingsMessage, parse_binary, parse_text
from .session import Session
from .state import StateKeeper
from .versions import CURRENT, ProtocolVersion

log = logging.getLogger(__name__)

CLOSE_SLOW_CLIENT = WSCloseCode.POLICY_VIOLATION  # 1008
CLOSE_SUPERSEDED = WSCloseCode.POLICY_VIOLATION


class ConnectionDone(Exception):
    """The socket is gone or being closed; stop this connection's tasks."""


@dataclass
class ConnectionContext:
    """What every connection of one app shares."""

    config: Config
    pipeline: FramePipeline
    metrics: Metrics
    keeper: StateKeeper
    label: Callable[[int], str]


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
        cfg = ctx.config
        self.admission: Admission[FrameMessage] = Admission(session.mode, cfg.session.every_queue)
        self._send_lock = asyncio.Lock()
        self._in_flight = 0
        self._capacity = asyncio.Condition()
        self._idle = asyncio.Event()
        self._idle.set()
        self._decode_idle = asyncio.Event()
        self._decode_idle.set()
        self._ordered: asyncio.Queue[asyncio.Task[tuple[str | None, bool]]] = asyncio.Queue()
        self.client_close_code: int | None = None
        self.closed_by_server: str | None = None

    @property
    def in_flight(self) -> int:
        """Frames taken from admission whose reply has not been sent yet."""
        return self._in_flight

    async def wait_idle(self) -> None:
        """Until no frame of this connection is in flight (graceful shutdown)."""
        await self._idle.wait()

    # -- sending ----------------------------------------------------------------------

    async def send(self, text: str) -> None:
        if self.ws.closed:
            raise ConnectionDone
        async with self._send_lock:
            try:
                await within(self.ws.send_str(text), self.ctx.config.server.send_timeout_s)
            except TimeoutError:
                await self.close(CLOSE_SLOW_CLIENT, "client is not reading results", "slow_client")
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

    # -- the three tasks --------------------------------------------------------------

    async def serve(self) -> None:
        """Run until the socket closes. Returns after every task has stopped."""
        tasks = [
            asyncio.create_task(self._produce(), name=f"produce-{self.session.id}"),
            asyncio.create_task(self._send_in_order(), name=f"send-{self.session.id}"),
            asyncio.create_task(self._ping(), name=f"ping-{self.session.id}"),
        ]
        try:
            await self._read()
        finally:
            await cancel_and_wait(*tasks)
            while not self._ordered.empty():
                self._ordered.get_nowait().cancel()
            # Frames the socket closed on (waiting, or taken but never sent) are counted as
            # dropped, so received = answered + dropped + rejected holds after a resume too.
            self._count_dropped(len(self.admission.core.drain()) + self._in_flight)
            self._in_flight = 0
            self._idle.set()

    def _limit(self) -> int:
        s = self.ctx.config.session
        return s.latest_in_flight if self.admission.mode == "latest" else s.every_in_flight

    async def _produce(self) -> None:
        while True:
            # Latest-wins decodes one frame at a time; the newest decoded frame then takes
            # the place of this connection's frame still waiting for the engine, so the
            # engine always gets the freshest frame and a slow engine costs drops, not age.
            await self._decode_idle.wait()
            async with self._capacity:
                await self._capacity.wait_for(lambda: self._in_flight < self._limit())
            frame = await self.admission.get()
            latest = self.admission.mode == "latest"
            # Counted once a frame is taken (only this task adds, so room is still there):
            # an idle connection waiting for its next frame has nothing in flight.
            self._in_flight += 1
            self._idle.clear()
            if latest:
                self._decode_idle.clear()
            task = asyncio.create_task(self._process(frame, time.perf_counter(), latest))
            self._ordered.put_nowait(task)

    async def _send_in_order(self) -> None:
        while True:
            task = await self._ordered.get()
            text, is_result = await task
            if text is None:  # superseded: already counted and its place given back
                continue
            try:
                await self.send(text)
            except (ConnectionDone, asyncio.CancelledError):
                if is_result:  # computed but never delivered: the client sees it as dropped
                    self._count_dropped(1)
                raise
            else:
                if is_result:  # answered means delivered
                    self.session.answered += 1
                    self.ctx.metrics.frames_answered.inc()
            finally:
                await self._release()

    async def _release(self) -> None:
        """A frame taken from admission is done with: its place goes to the next one."""
        async with self._capacity:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
            self._capacity.notify_all()

    async def _process(
        self, frame: FrameMessage, taken_at: float, latest: bool
    ) -> tuple[str | None, bool]:
        """The reply for one frame and whether it is a result (else an error); no reply
        (None) when a newer frame of this connection took its place."""
        s = self.session
        try:
            res = await self.ctx.pipeline.process(
                frame,
                s.frame_settings(),
                taken_at,
                supersede_key=self if latest else None,
                on_prepared=self._decode_idle.set,
            )
        except FrameSuperseded:
            # Its place is given back now rather than in reply order: held until the frame
            # ahead of it was sent, it kept the newest frame from being taken, so the engine
            # next ran an older one and a frame waited for two. (Counted after the release:
            # if cancelled before it, the shutdown count in serve() includes it.)
            await self._release()
            self._count_dropped(1)
            return None, False
        except ClientError as e:
            return self._rejected(e.with_frame_id(frame.id)), False
        except EngineError as e:
            return self._rejected(ClientError("engine_unavailable", str(e), frame.id)), False
        except Exception:
            log.exception("frame %r of session %s failed", frame.id, s.id)
            err = ClientError("internal", "the server failed on this frame", frame.id)
            return self._rejected(err), False
        self.ctx.metrics.observe_timing(res.timing)
        return reply.result(res, self.ctx.label, s.dropped), True

    def _rejected(self, err: ClientError) -> str:
        self.session.rejected += 1
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
            try:
                msg = await self.ws.receive(timeout=cfg.idle_timeout_s)
            except TimeoutError:
                await self.close(WSCloseCode.GOING_AWAY, "idle timeout", "idle")
                return
            if msg.type is WSMsgType.TEXT or msg.type is WSMsgType.BINARY:
                try:
                    await self._handle(msg.type, msg.data)
                except ConnectionDone:
                    return
            elif msg.type is WSMsgType.ERROR:
                self._read_error(msg.data)
                return
            else:  # CLOSE, CLOSING, CLOSED
                self.client_close_code = self.ws.close_code
                return

    def _read_error(self, exc: Any) -> None:
        if isinstance(exc, WebSocketError) and exc.code == WSCloseCode.MESSAGE_TOO_BIG:
            self.session.rejected += 1
            self.ctx.metrics.frames_rejected.labels("message_too_large").inc()
            self.ctx.metrics.connections_closed.labels("message_too_large").inc()
            self.closed_by_server = "message_too_large"
            log.info(
                "session %s sent a message over the size limit; closed with 1009", self.session.id
            )
        else:
            log.info("session %s: protocol error %s", self.session.id, exc)

    async def _handle(self, kind: WSMsgType, data: Any) -> None:
        now = time.perf_counter()
        s, m = self.session, self.ctx.metrics
        try:
            parsed = parse_text(data, now) if kind is WSMsgType.TEXT else parse_binary(data, now)
        except ClientError as e:
            if e.code != "bad_settings":  # anything but settings may have been a frame
                s.received += 1
                m.frames_received.inc()
            await self.send(self._rejected(e))
            return
        if isinstance(parsed, FrameMessage):
            s.received += 1
            s.last_seen = time.time()
            m.frames_received.inc()
            self._count_dropped(len(await self.admission.put(parsed)))
        elif isinstance(parsed, SettingsMessage):
            await self._apply_settings(parsed)
        elif isinstance(parsed, PingMessage):
            await self.send(reply.pong(parsed.payload))

    def _count_dropped(self, n: int) -> None:
        if n:
            self.session.dropped += n
            self.ctx.metrics.frames_dropped.inc(n)

    async def _apply_settings(self, msg: SettingsMessage) -> None:
        s = self.session
        if msg.confidence is not None:
            s.confidence = msg.confidence
        if msg.classes is not None or msg.clear_classes:
            s.classes = msg.classes
        if msg.mode is not None and msg.mode != s.mode:
            s.mode = msg.mode
            self._count_dropped(len(await self.admission.set_mode(msg.mode)))
            async with self._capacity:
                self._capacity.notify_all()
        self.ctx.keeper.touch(s)
        await self.send(reply.settings(s.mode, s.confidence, s.classes))
