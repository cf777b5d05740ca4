"""The connection: :class:`EdgeVisionClient`, its handshake, retries, resume and the
matching of answers to frames (the values it hands out: :mod:`.values`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import orjson

from ..common.aio import cancel_and_wait
from ..common.settings import Mode
from ..errors import (
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
    FrameDropped,
    FrameRejected,
    HandshakeRefused,
    MessageTooBig,
    ProtocolNotServed,
    ProtocolViolation,
    ServerShuttingDown,
    ServerUnavailable,
    ServerUnreachable,
    SessionEnded,
)
from ..session.receive import (
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    encode_binary_frame,
    encode_json_frame,
)
from .events import EventStream
from .handshake import (
    WRONG_PATH_STATUSES,
    classify_close,
    gave_up,
    handshake,
    refusal_error,
    retry_after,
    why,
)
from .values import (
    Answer,
    Books,
    DropCause,
    Event,
    FrameError,
    FrameId,
    Hello,
    Result,
    Settings,
    Wire,
    jpeg_from_array,
)

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray


log = logging.getLogger(__name__)

T = TypeVar("T")

_UNSET: Any = object()


class EdgeVisionClient:
    """One camera session with an edge_vision node (or a balancer in front of several).

    ``url``: the node's ``ws://host:port/ws``. ``token``: sent as ``Authorization: Bearer``.
    ``protocol``: the version to speak (a node of an older release may answer with 1,
    which this client speaks too). ``mode``: admission, ``latest`` or ``every`` (default
    the node's). ``retry_s``: how long connecting (and resuming) retries 503 and refused
    connections. ``resume``: reconnect and resume after a shutdown or a lost connection.
    ``wire``: ``binary`` (default where the node has it) or ``json``.
    ``reply_timeout_s``: how long :meth:`settings` and :meth:`ping` wait for their answer.
    ``results_buffer``: answers kept for :meth:`results` until taken (the oldest go first
    when it is full; futures still get theirs). ``resume_token``: resume that session
    (from an earlier hello, e.g. of another process) instead of starting one.
    ``session``: an aiohttp session to use (default: one of its own). ``on_drop``: called
    with a frame's id and :data:`DropCause` as soon as the frame is known unanswered,
    before its future raises :class:`~edge_vision.errors.FrameDropped`. ``on_event``:
    called with each :class:`Event` the session's rules raise (protocol 3), as it arrives.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        protocol: int = PROTOCOL_VERSION,
        mode: Mode | None = None,
        retry_s: float = 30.0,
        max_retry_wait_s: float = 5.0,
        resume: bool = True,
        wire: Wire | None = None,
        reply_timeout_s: float = 30.0,
        results_buffer: int = 1024,
        resume_token: str | None = None,
        session: aiohttp.ClientSession | None = None,
        on_drop: Callable[[FrameId, DropCause], None] | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        if protocol not in SUPPORTED_VERSIONS:
            raise ValueError(
                f"protocol {protocol} is not one this client speaks: {SUPPORTED_VERSIONS}"
            )
        self.url = url
        self.token = token
        self.protocol = protocol
        self.mode = mode
        self.retry_s = retry_s
        self.max_retry_wait_s = max_retry_wait_s
        self.auto_resume = resume
        self.wire = wire
        self.reply_timeout_s = reply_timeout_s
        self._first_resume_token = resume_token
        #: How often this client resumed its session after a close (shutdown, lost link).
        self.resumes = 0
        #: How many 503s and refused connections were retried, all connects together.
        self.retries = 0
        #: What became of the frames sent (answered, dropped, rejected, lost, pending).
        self.books = Books()
        self._on_drop = on_drop
        self._own_session = session is None
        self._session = session
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._hello: Hello | None = None
        self._ids = itertools.count()
        self._pending: OrderedDict[FrameId, asyncio.Future[Result]] = OrderedDict()
        self._settings_waiting: deque[asyncio.Future[Settings]] = deque()
        self._pings_waiting: deque[asyncio.Future[Any]] = deque()
        self._answers: deque[Answer] = deque(maxlen=results_buffer)
        self._events = EventStream(results_buffer, on_event)
        self._answer_ready = asyncio.Event()
        self._connected = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self._receiver: asyncio.Task[None] | None = None
        self._closing_token: str | None = None
        self._failure: BaseException | None = None  # the end of this client, for good
        self._closed = False

    # -- connecting ---------------------------------------------------------------------

    @property
    def hello(self) -> Hello:
        """The hello of the current connection (a resume brings a new one)."""
        if self._hello is None:
            raise RuntimeError("not connected: call connect() or use 'async with'")
        return self._hello

    async def __aenter__(self) -> EdgeVisionClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> Hello:
        """Open the session; retries 503 and refused connections for ``retry_s``."""
        if self._closed:
            raise RuntimeError("this client was closed; make a new one")
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            hello = await self._open(resume_token=self._first_resume_token)
        except BaseException:
            if self._own_session:  # 'async with' calls no __aexit__ when entering fails
                await self._session.close()
                self._session = None
            raise
        self._receiver = asyncio.create_task(self._receive(), name="edge-vision-client")
        return hello

    async def _open(self, resume_token: str | None) -> Hello:
        assert self._session is not None
        url, subprotocols = handshake(self.url, self.protocol, self.mode, resume_token)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        started = time.monotonic()
        deadline = started + self.retry_s
        backoff = 0.1
        where = self.url
        said: str | None = None  # the failure last said at WARNING
        while True:
            wait: float | None
            error: ConnectFailed
            try:
                ws = await self._session.ws_connect(
                    url,
                    headers=headers,
                    protocols=subprotocols,
                    max_msg_size=0,
                    autoping=True,
                    timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
                )
                break
            except aiohttp.WSServerHandshakeError as e:
                if e.status == 503:  # retried, waiting what Retry-After says
                    error = ServerUnavailable(where, e.status, "service unavailable")
                    wait = retry_after(e.headers)
                else:
                    raise await self._refusal(url, headers, e.status) from None
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as e:
                error = ServerUnreachable(where, f"cannot reach the server at {where}: {why(e)}")
                wait = None
            except aiohttp.ClientError as e:
                raise ConnectFailed(where, f"cannot connect to {where}: {e}") from None
            if wait is None:
                wait, backoff = backoff, min(backoff * 2, self.max_retry_wait_s)
            wait = min(max(wait, 0.05), self.max_retry_wait_s)
            now = time.monotonic()
            if now + wait > deadline:  # the last failure, how long it tried, what to check
                unavailable = isinstance(error, ServerUnavailable)
                body = await self._refusal_body(url, headers, 503) if unavailable else ""
                raise gave_up(error, now - started, self.retry_s, body) from None
            self.retries += 1
            # Each new failure is said at WARNING (the default log level shows it), with
            # the retry budget left; its repeats at INFO.
            if str(error) != said:
                said = str(error)
                shown = said
                if isinstance(error, ServerUnavailable):  # why: warming up, full, stopping
                    body = await self._refusal_body(url, headers, 503) or error.body
                    shown = f"the server at {where} refused the WebSocket: HTTP 503: {body}"
                log.warning(
                    "%s; retrying for up to %.1f s more (retry_s=%g)",
                    shown,
                    deadline - now,
                    self.retry_s,
                )
            else:
                log.info("%s; retrying in %.2f s (%.1f s left)", said, wait, deadline - now)
            await asyncio.sleep(wait)
        try:
            msg = await ws.receive(timeout=self.reply_timeout_s)
        except TimeoutError:
            await ws.close()
            raise ConnectFailed(where, f"the server at {where} sent no hello") from None
        if msg.type is not aiohttp.WSMsgType.TEXT:
            raise self._closed_error(ws, msg, closing_token=None)
        obj = orjson.loads(msg.data)
        if obj.get("type") != "hello":
            await ws.close()
            raise ConnectFailed(where, f"the server at {where} sent {obj.get('type')!r}, not hello")
        hello = Hello.from_json(obj)
        if hello.protocol not in SUPPORTED_VERSIONS:
            await ws.close()
            raise ProtocolNotServed(where, 200, "hello names another version", hello.protocols)
        self._ws, self._hello = ws, hello
        self._connected.set()
        return hello

    async def _refusal(self, url: str, headers: Mapping[str, str], status: int) -> HandshakeRefused:
        """The refusal as an exception, with the server's short reason (none for a wrong
        path: a page's HTML says nothing to a camera)."""
        if status in WRONG_PATH_STATUSES:
            return refusal_error(self.url, status, "")
        return refusal_error(self.url, status, await self._refusal_body(url, headers, status))

    async def _refusal_body(self, url: str, headers: Mapping[str, str], status: int) -> str:
        """The server's short reason for refusing with ``status``: aiohttp keeps no body of
        a refused upgrade, so the same request is made once more as a plain GET."""
        assert self._session is not None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            timeout = aiohttp.ClientTimeout(total=5.0)
            async with self._session.get(url, headers=headers, timeout=timeout) as r:
                if r.status == status:
                    return (await r.text())[:500].strip()
        return ""

    # -- sending ------------------------------------------------------------------------

    async def _socket(self) -> aiohttp.ClientWebSocketResponse:
        """The open socket; during a resume, waits for the new one."""
        while True:
            if self._failure is not None:
                raise self._failure
            if self._closed:
                raise RuntimeError("this client was closed")
            if self._ws is not None and self._connected.is_set() and not self._ws.closed:
                return self._ws
            if self._receiver is None:
                raise RuntimeError("not connected: call connect() or use 'async with'")
            await self._connected.wait()

    async def _send(self, data: str | bytes) -> None:
        ws = await self._socket()
        async with self._send_lock:
            try:
                if isinstance(data, bytes):
                    await ws.send_bytes(data)
                else:
                    await ws.send_str(data)
            except (ConnectionError, RuntimeError) as e:
                # The receiver sees the close and decides: resume, or fail for good.
                log.info("send failed (%s); the connection is closing", e)

    async def send(
        self,
        image: bytes | NDArray[np.uint8],
        *,
        frame_id: FrameId | None = None,
        ts: float | None = _UNSET,
        wire: Wire | None = None,
        quality: int = 85,
    ) -> asyncio.Future[Result]:
        """Send one frame; the future resolves with its :class:`Result`, or raises
        :class:`~edge_vision.errors.FrameDropped` / :class:`~edge_vision.errors.FrameRejected`
        / the :class:`~edge_vision.errors.ConnectionClosed` that ended the session.

        ``image``: JPEG or PNG bytes, or an ``(H, W, 3)`` uint8 RGB array (encoded to JPEG
        at ``quality``). ``frame_id``: default 0, 1, 2, ... ``ts``: default the wall clock in
        milliseconds; None sends ``null``.

        A message over the node's limit (hello's ``limits.max_message_bytes``) raises
        :class:`~edge_vision.errors.MessageTooBig` with its size and the limit, and nothing
        is sent: the connection stays open."""
        if isinstance(image, bytes):
            data = image
        else:  # milliseconds of CPU for a large frame: not on the caller's event loop
            data = await asyncio.to_thread(jpeg_from_array, image, quality)
        limit = self.hello.limits.max_message_bytes  # 0: the node did not say
        if limit and len(data) > limit:  # every form of the message is larger than the image
            raise MessageTooBig(None, size=len(data), limit=limit)
        fid: FrameId = next(self._ids) if frame_id is None else frame_id
        if fid in self._pending:
            raise ValueError(f"frame id {fid!r} is still waiting for its answer")
        stamp = time.time() * 1000.0 if ts is _UNSET else ts
        form = wire or self.wire or ("binary" if "binary_frames" in self.hello.features else "json")
        message: str | bytes = (
            encode_binary_frame(fid, stamp, data)
            if form == "binary"
            else encode_json_frame(fid, stamp, data)
        )
        size = len(message) if isinstance(message, bytes) else len(message.encode())
        if limit and size > limit:  # the node would close the connection on it (1009)
            raise MessageTooBig(None, size=size, limit=limit)
        await self._socket()  # raises the failure if the session is over
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending[fid] = future
        self.books.sent += 1
        await self._send(message)
        return future

    async def detect(
        self, image: bytes | NDArray[np.uint8], *, frame_id: FrameId | None = None, **kw: Any
    ) -> Result:
        """Send one frame and wait for its result."""
        return await (await self.send(image, frame_id=frame_id, **kw))

    async def settings(
        self,
        *,
        mode: Mode | None = None,
        confidence: float | None = None,
        classes: Sequence[int] | None = _UNSET,
        **more: Any,
    ) -> Settings:
        """Change settings (only those given; ``classes=None`` clears the filter); returns
        the effective settings. ``more``: settings of newer nodes (e.g. ``track=False``)."""
        body: dict[str, Any] = {"type": "settings", **more}
        if mode is not None:
            body["mode"] = mode
        if confidence is not None:
            body["confidence"] = confidence
        if classes is not _UNSET:
            body["classes"] = None if classes is None else list(classes)
        await self._socket()
        future: asyncio.Future[Settings] = asyncio.get_running_loop().create_future()
        self._settings_waiting.append(future)
        await self._send(orjson.dumps(body).decode())
        settings = await self._answer_within(future)
        if mode is not None:
            self.mode = settings.mode  # a resumed session keeps it anyway; so do we
        return settings

    async def ping(self, payload: Any = None) -> Any:
        """An application ping; returns the pong's payload."""
        await self._socket()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pings_waiting.append(future)
        await self._send(orjson.dumps({"type": "ping", "payload": payload}).decode())
        return await self._answer_within(future)

    async def _answer_within(self, future: asyncio.Future[T]) -> T:
        """The answer to a settings or ping message within ``reply_timeout_s``. One that
        times out stays queued, cancelled: its late answer is matched to it and dropped,
        so answers stay in step with requests (the server answers them in order)."""
        return await asyncio.wait_for(future, self.reply_timeout_s)

    # -- receiving ----------------------------------------------------------------------

    async def results(self) -> AsyncIterator[Answer]:
        """Every answer (:class:`Result` or :class:`FrameError`) in arrival order, across
        resumes; ends after :meth:`close`, raises the close reason if the session ended
        otherwise."""
        while True:
            while self._answers:
                yield self._answers.popleft()
            if self._failure is not None:
                if isinstance(self._failure, SessionEnded) and self._closed:
                    return
                raise self._failure
            if self._closed:
                return
            self._answer_ready.clear()
            await self._answer_ready.wait()

    def events(self) -> AsyncIterator[Event]:
        """Every event the session's rules raise (protocol 3, docs/events.md), in arrival
        order, across resumes; ends after :meth:`close`, like :meth:`results`."""
        return self._events.follow(lambda: self._failure, lambda: self._closed)

    @property
    def pending(self) -> int:
        """Frames sent whose answer has not come yet."""
        return len(self._pending)

    async def _receive(self) -> None:
        try:
            await self._receive_until_done()
        except (ValueError, KeyError, TypeError, IndexError) as e:  # a server broke the protocol
            log.warning("edge_vision client: %r", e)
            if self._ws is not None:
                await self._ws.close(code=1002)
            self._finish(ProtocolViolation(1002, f"the server's message broke the protocol: {e}"))

    async def _receive_until_done(self) -> None:
        while True:
            ws = self._ws
            assert ws is not None
            closed = await self._read(ws)
            if self._closed:
                self._finish(SessionEnded(1000, "closed by this client"))
                return
            self._settle_all(closed)
            if self.auto_resume and isinstance(closed, ServerShuttingDown | ConnectionLost):
                token = closed.resume_token if isinstance(closed, ServerShuttingDown) else ""
                self._connected.clear()
                try:
                    await self._open(resume_token=token or self.hello.resume_token)
                except ConnectFailed as e:
                    log.info("could not resume the session: %s", e)
                    self._finish(closed)
                    return
                self.resumes += 1
                continue
            self._finish(closed)
            return

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> ConnectionClosed:
        """Dispatch messages until the socket closes; the close as an exception."""
        self._closing_token = None
        while True:
            msg = await ws.receive()
            if msg.type is aiohttp.WSMsgType.TEXT:
                self._dispatch(orjson.loads(msg.data), time.perf_counter())
            elif msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.PING):
                continue
            else:
                return self._closed_error(ws, msg, self._closing_token)

    def _closed_error(
        self, ws: aiohttp.ClientWebSocketResponse, msg: aiohttp.WSMessage, closing_token: str | None
    ) -> ConnectionClosed:
        # A close frame's code and text come as the CLOSE message's data and extra.
        code: int | None
        if msg.type is aiohttp.WSMsgType.CLOSE:
            code, reason = int(msg.data), str(msg.extra or "")
        else:
            code, reason = ws.close_code, str(ws.exception() or "")
        return classify_close(code, reason, closing_token)

    def _dispatch(self, obj: dict[str, Any], received_at: float) -> None:
        kind = obj.get("type")
        if kind == "result":
            res = Result.from_json(obj, received_at)
            self._settle_until(res.id, lambda f: f.set_result(res))
            self._answer(res)
        elif kind == "error":
            err = FrameError(obj.get("id"), str(obj.get("code")), str(obj.get("message")))
            if err.id is not None and err.id in self._pending:
                future = self._pending.pop(err.id)
                self.books.rejected += 1
                if not future.done():
                    future.set_exception(FrameRejected(err.id, err.code, err.message))
                    future.exception()  # retrieved: a frame nobody awaits logs nothing
            elif err.code == "bad_settings" and self._settings_waiting:
                future_s = self._settings_waiting.popleft()
                if not future_s.done():
                    future_s.set_exception(FrameRejected(None, err.code, err.message))
            self._answer(err)
        elif kind == "settings":
            settings = Settings.from_json(obj)
            if self._settings_waiting:
                future_s = self._settings_waiting.popleft()
                if not future_s.done():
                    future_s.set_result(settings)
        elif kind == "pong":
            if self._pings_waiting:
                future_p = self._pings_waiting.popleft()
                if not future_p.done():
                    future_p.set_result(obj.get("payload"))
        elif kind == "closing":
            self._closing_token = str(obj.get("resume_token") or "")
        elif kind == "event":  # since protocol 3
            self._events.push(Event.from_json(obj))
        # Unknown types: a newer server's additions, ignored (docs/protocol.md, "Versions").

    def _settle_until(
        self, frame_id: FrameId, settle: Callable[[asyncio.Future[Result]], None]
    ) -> None:
        """Answers come in send order: frames before ``frame_id`` still waiting were dropped."""
        if frame_id not in self._pending:
            self.books.unmatched += 1
            log.warning("answer for frame %r that is not waiting", frame_id)
            return
        while self._pending:
            fid, future = self._pending.popitem(last=False)
            if fid == frame_id:
                self.books.answered += 1
                if not future.done():
                    settle(future)
                return
            self.books.dropped += 1
            self._dropped(fid, "latest", future, FrameDropped(fid))

    def _settle_all(self, closed: ConnectionClosed) -> None:
        """The socket closed: frames in flight were dropped; settings and pings fail."""
        while self._pending:
            fid, future = self._pending.popitem(last=False)
            self.books.lost += 1
            why = f"the connection closed ({closed.code})"
            self._dropped(fid, "closed", future, FrameDropped(fid, why))
        for waiting in (self._settings_waiting, self._pings_waiting):
            while waiting:
                self._fail_future(waiting.popleft(), closed)

    def _dropped(
        self, fid: FrameId, cause: DropCause, future: asyncio.Future[Result], exc: FrameDropped
    ) -> None:
        if self._on_drop is not None:
            try:
                self._on_drop(fid, cause)
            except Exception:  # the caller's bug must not stop the matching of answers
                log.exception("on_drop for frame %r failed", fid)
        self._fail_future(future, exc)

    @staticmethod
    def _fail_future(future: asyncio.Future[Any], exc: BaseException) -> None:
        if not future.done():
            future.set_exception(exc)
            future.exception()  # retrieved: nobody has to await a dropped frame's future

    def _answer(self, answer: Answer) -> None:
        self._answers.append(answer)
        self._answer_ready.set()

    def _finish(self, failure: ConnectionClosed) -> None:
        self._failure = failure
        self._settle_all(failure)
        self._connected.set()  # wake senders: they raise the failure
        self._answer_ready.set()
        self._events.wake()

    # -- closing ------------------------------------------------------------------------

    async def close(self, end_session: bool = True) -> None:
        """Close the socket: with 1000 the session ends (not resumable); with
        ``end_session=False`` 1001, so the session can be resumed with its token."""
        if self._closed:
            return
        self._closed = True
        ws = self._ws
        try:
            if ws is not None and not ws.closed:
                await ws.close(code=1000 if end_session else 1001)
            if self._receiver is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(self._receiver, 5.0)
        except TimeoutError:
            if self._receiver is not None:
                await cancel_and_wait(self._receiver)
        finally:
            if self._failure is None:
                self._finish(SessionEnded(1000, "closed by this client"))
            if self._own_session and self._session is not None:
                await self._session.close()
