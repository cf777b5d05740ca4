"""Replay against a running server, as a camera client: frames go through the product's
client, :class:`~edge_vision.client.EdgeVisionClient` (docs/client.md), which connects
(retrying 503 and refused connections, as ``Retry-After`` says), matches answers to
frames by id and keeps the books; this module turns its answers, drops and close reasons
into replay's outcomes and messages."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any

from ...client import Answer, DropCause, EdgeVisionClient, FrameError, FrameId, Result
from ...common.aio import cancel_and_wait
from ...common.settings import Mode
from ...errors import (
    ConnectFailed,
    ConnectionClosed,
    FrameDropped,
    FrameRejected,
    HandshakeRefused,
    MessageTooBig,
    ServerShuttingDown,
    ServerUnavailable,
    WrongPath,
)
from .books import Encoded, Outcome
from .options import ReplayError, ReplayOptions
from .target import Deliver

log = logging.getLogger("edge_vision.tools.replay")

#: Frames sent to a server in --realtime mode and not yet settled before sending pauses
#: (bounds memory if a server stops answering; a live camera would block the same way).
REALTIME_WINDOW = 128


def websocket_url(url: str, mode: Mode) -> str:
    """``ws://host:port[/ws]`` (or http/https) → the /ws URL with ``?mode=``."""
    from yarl import URL

    try:
        u = URL(url)
    except (ValueError, TypeError) as e:
        raise ReplayError(f"--url {url!r} is not a URL: {e}") from None
    schemes = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}
    if u.scheme not in schemes or not u.host:
        raise ReplayError(f"--url {url!r} must be ws://host:port/ws (or wss://, http://)")
    u = u.with_scheme(schemes[u.scheme])
    if u.path in ("", "/"):
        u = u.with_path("/ws")
    if "mode" not in u.query:
        u = u.update_query(mode=mode)
    return str(u)


class RemoteTarget:
    """A running server over its WebSocket, as a camera client (docs/protocol.md).

    No resume: a server that shuts down or a lost connection ends the replay (the frames
    in flight are unanswered), so a run's numbers are one server's."""

    def __init__(self, opts: ReplayOptions, mode: Mode, deliver: Deliver) -> None:
        self.url = websocket_url(opts.url or "", mode)
        self.description = self.url.split("?", 1)[0]
        self.opts = opts
        self.mode = mode
        self.deliver = deliver
        self.window = REALTIME_WINDOW if mode == "latest" else (opts.in_flight or 8)
        self.failure: ReplayError | None = None
        self.ts_mismatches = 0
        self.server_dropped = 0
        self.failed = asyncio.Event()
        # The mode is in the URL already (a --url with its own ?mode= keeps it).
        self.client = EdgeVisionClient(
            self.url,
            token=opts.token,
            retry_s=opts.timeout_s,
            resume=False,
            wire=opts.wire,
            reply_timeout_s=opts.timeout_s,
            on_drop=self._dropped,
        )
        self._seqs: dict[FrameId, int] = {}  # frame id -> seq, until it is settled
        self._room = asyncio.Event()  # set when a frame settles: the send window has room
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def duplicates(self) -> int:
        """Results for frames already settled (the client's ``books.unmatched``)."""
        return self.client.books.unmatched

    async def start(self) -> None:
        try:
            hello = await self.client.connect()
        except ConnectFailed as e:
            raise ReplayError(self._refused(e)) from None
        except ConnectionClosed as e:
            raise ReplayError(
                f"the server at {self.description} closed the connection before its "
                f"hello (close code {e.code})"
            ) from None
        settings: dict[str, Any] = {}
        if self.opts.read:
            settings["read"] = True
        if self.opts.confidence is not None:
            settings["confidence"] = self.opts.confidence
        if self.opts.classes is not None:
            settings["classes"] = self.opts.classes
        if settings:
            try:
                await self.client.settings(**settings)
            except FrameRejected as e:
                raise ReplayError(f"the server refused: {e.code}: {e.message}") from None
            except TimeoutError:
                raise ReplayError(
                    f"the server at {self.description} sent no settings within "
                    f"{self.opts.timeout_s:g} s"
                ) from None
            except ConnectionClosed as e:
                raise ReplayError(self._closed_reason(e)) from None
        self.description = (
            f"{self.description} ({hello.model}, {hello.engine.get('active')}, {self.opts.wire})"
        )
        self._watcher = asyncio.create_task(self._watch(), name="replay-receive")

    def _refused(self, e: ConnectFailed) -> str:
        where = self.description
        if isinstance(e, ServerUnavailable):
            return f"the server at {where} is not accepting connections (HTTP 503: {e.body})"
        if isinstance(e, HandshakeRefused):
            if e.status in (401, 403):
                hint = "check --token" if self.opts.token else "it needs --token"
                return f"the server at {where} refused authorisation (HTTP {e.status}); {hint}"
            if isinstance(e, WrongPath):  # the page, or nothing: the client names /ws
                return str(e)
            return f"the server at {where} refused the WebSocket (HTTP {e.status}: {e.body})"
        return str(e)  # unreachable, or no hello: the client's own words

    async def send(self, seq: int, enc: Encoded) -> None:
        while self.client.pending >= self.window and not self.failed.is_set():
            self._room.clear()
            await self._room.wait()
        if self.failed.is_set():
            self.deliver(seq, Outcome("unanswered", reason="connection lost"))
            return
        fid = enc.frame.index
        self._seqs[fid] = seq
        sent_at = time.perf_counter()
        try:
            future = await self.client.send(enc.jpeg, frame_id=fid, ts=enc.frame.ts)
        except ConnectionClosed as e:
            self._fail(self._closed_reason(e))
            return
        future.add_done_callback(partial(self._settled, fid, enc.frame.ts, sent_at))

    def _settled(
        self, fid: FrameId, ts_sent: float, sent_at: float, future: asyncio.Future[Result]
    ) -> None:
        """A frame's future is done: answered, rejected, or dropped (``_dropped`` said so)."""
        exc = future.exception() if not future.cancelled() else None
        if isinstance(exc, FrameDropped):
            return
        seq = self._seqs.pop(fid, None)
        if seq is None:  # settled already (an abort)
            return
        if isinstance(exc, FrameRejected):
            error = {"code": exc.code, "message": exc.message}
            latency = (time.perf_counter() - sent_at) * 1e3
            self.deliver(seq, Outcome("error", error=error, latency_ms=latency))
        elif exc is not None or future.cancelled():
            self.deliver(seq, Outcome("unanswered", reason="connection lost"))
        else:
            res = future.result()
            if res.ts != ts_sent:
                self.ts_mismatches += 1
            self.server_dropped = res.dropped
            latency = (res.received_at - sent_at) * 1000.0
            self.deliver(seq, Outcome("answered", result=dict(res.raw), latency_ms=latency))
        self._room.set()

    def _dropped(self, fid: FrameId, cause: DropCause) -> None:
        seq = self._seqs.pop(fid, None)
        if seq is not None:
            if cause == "latest":  # the server answered a later frame first
                self.deliver(seq, Outcome("dropped", reason="dropped"))
            else:
                self.deliver(seq, Outcome("unanswered", reason="connection lost"))
        self._room.set()

    async def _watch(self) -> None:
        """Fail the replay when the session ends, or when frames wait and nothing is heard
        from the server for ``--timeout``; errors tied to no frame are logged."""
        answers = self.client.results()
        while True:
            nxt: asyncio.Task[Answer] = asyncio.ensure_future(anext(answers))
            while True:
                done, _ = await asyncio.wait({nxt}, timeout=self.opts.timeout_s)
                if done:
                    break
                if self.client.pending:
                    await cancel_and_wait(nxt)
                    self._fail(f"no answer from {self.description} for {self.opts.timeout_s:g} s")
                    return
            try:
                answer = nxt.result()
            except StopAsyncIteration:  # closed by us
                return
            except ConnectionClosed as e:
                self._fail(self._closed_reason(e))
                return
            if isinstance(answer, FrameError) and answer.id is None:
                log.warning("server error not tied to a frame: %s: %s", answer.code, answer.message)

    def _closed_reason(self, e: ConnectionClosed) -> str:
        where = self.description
        if isinstance(e, ServerShuttingDown):
            return f"the server at {where} is shutting down"
        if isinstance(e, MessageTooBig) and e.size is not None:  # refused before sending
            return (
                f"a frame of {e.size} bytes is over the limit of {e.limit} bytes a message of "
                f"the server at {where} (lower --jpeg-quality, or use --wire binary)"
            )
        if isinstance(e, MessageTooBig):  # docs/protocol.md close codes
            limit = self.client.hello.limits.max_message_bytes
            return (
                f"the server at {where} closed the connection: a frame was larger "
                f"than its limit of {limit} bytes (lower --jpeg-quality, or use --wire binary)"
            )
        if e.code == 1008:
            return f"the server at {where} closed the connection (1008: policy)"
        return f"the server at {where} closed the connection (code {e.code})"

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = ReplayError(message)
        self.failed.set()
        self.abort("connection lost")
        self._room.set()

    def abort(self, reason: str) -> None:
        for seq in sorted(self._seqs.values()):
            self.deliver(seq, Outcome("unanswered", reason=reason))
        self._seqs.clear()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.client.close()
        await cancel_and_wait(self._watcher)
