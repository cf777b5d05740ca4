"""The Python client of the edge_vision protocol, for camera boxes and tools (docs/client.md).

::

    async with EdgeVisionClient("ws://node:8080/ws", token=TOKEN) as client:
        print(client.hello.model, client.hello.features)
        await client.settings(confidence=0.4)
        pending = await client.send(jpeg_bytes)       # a future, matched by frame id
        result = await pending                        # or: async for r in client.results()

What it does for you (docs/protocol.md):

* **connect** with ``Authorization: Bearer <token>`` when given, and ``?protocol=N``;
  HTTP 503 (warming up, full, stopping) and refused TCP connections are retried within
  ``retry_s``, waiting what ``Retry-After`` says (bounded by ``max_retry_wait_s``),
  else an exponential backoff;
* **hello** parsed into :class:`Hello`; **settings** answered with the effective
  :class:`Settings`; **frames** as JPEG/PNG bytes or numpy arrays (encoded to JPEG here),
  in the binary form or as JSON;
* **results matched by id**: answers come in the order frames were sent, so a result for a
  later frame settles every earlier one still waiting as dropped (latest-wins);
  :attr:`EdgeVisionClient.books` counts what became of the frames sent, and ``on_drop``
  hears of each drop as it is decided;
* **resume**: after the server's ``closing`` + 1001 (shutdown) or a lost connection, it
  reconnects (to any node behind the balancer) with the session's resume token; frames in
  flight then are dropped (the server counts them so too), later ones go to the new node;
* **every close reason is a typed exception** (edge_vision/errors.py, under
  :class:`~edge_vision.errors.ConnectionClosed`), raised by :meth:`results`, :meth:`send`
  and the futures of frames, settings and pings waiting then.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp
import orjson

from .common.aio import cancel_and_wait
from .common.close_codes import CloseCode
from .common.settings import Mode
from .errors import (
    AccessForbidden,
    AuthenticationFailed,
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
    FrameDropped,
    FrameRejected,
    HandshakeRefused,
    IdleTimeout,
    MessageTooBig,
    ProtocolNotServed,
    ProtocolViolation,
    ServerFailed,
    ServerOverloaded,
    ServerShuttingDown,
    ServerUnavailable,
    ServerUnreachable,
    SessionEnded,
    SessionSuperseded,
    SlowClient,
    TokenExpired,
)
from .session.receive import (
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    encode_binary_frame,
    encode_json_frame,
)
from .session.versions import RESUME_ENTRY, SUBPROTOCOL

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

log = logging.getLogger(__name__)


T = TypeVar("T")
Wire = Literal["binary", "json"]
FrameId = int | str
#: Why a frame went unanswered: ``latest``, a later frame was answered first (the server's
#: latest-wins dropped it); ``closed``, the connection closed while it was in flight.
DropCause = Literal["latest", "closed"]

#: Close codes of protocol 2 (edge_vision/common/close_codes.py) → the exception a client raises;
#: 1001 and 1008 depend on more than the code (see EdgeVisionClient._classify).
_CLOSED_BY_CODE: Mapping[int, type[ConnectionClosed]] = {
    CloseCode.NORMAL: SessionEnded,
    CloseCode.PROTOCOL_ERROR: ProtocolViolation,
    CloseCode.INVALID_PAYLOAD: ProtocolViolation,
    CloseCode.MESSAGE_TOO_BIG: MessageTooBig,
    CloseCode.SUPERSEDED: SessionSuperseded,
    CloseCode.TOKEN_EXPIRED: TokenExpired,
    CloseCode.SLOW_CLIENT: SlowClient,
    CloseCode.IDLE_TIMEOUT: IdleTimeout,
    # RFC 6455 section 7.4.1 codes edge_vision does not send, but a proxy or peer may.
    1011: ServerFailed,
    1013: ServerOverloaded,
}

_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class Settings:
    """A session's effective settings (docs/protocol.md, ``settings``)."""

    mode: Mode
    confidence: float
    classes: tuple[int, ...] | None
    # Since protocol 2; None where the node or the connection's version has no such setting.
    track: bool | None = None
    input_size: int | None = None  # None also: the node's own limits.input_size
    read: bool | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Settings:
        classes = obj.get("classes")
        return cls(
            obj["mode"],
            float(obj["confidence"]),
            None if classes is None else tuple(classes),
            obj.get("track"),
            obj.get("input_size"),
            obj.get("read"),
        )


@dataclass(frozen=True, slots=True)
class Counters:
    """A session's books: received = answered + dropped + rejected (+ in flight)."""

    received: int = 0
    answered: int = 0
    dropped: int = 0
    rejected: int = 0


_COUNTERS = frozenset(f.name for f in fields(Counters))


@dataclass(slots=True)
class Books:
    """What became of the frames this client sent, across resumes (docs/client.md, "Books"):
    sent = answered + dropped + rejected + lost + :attr:`pending`.

    ``dropped``: a later frame was answered first (latest-wins; the server's ``dropped``
    counts the same frames). ``lost``: in flight when a connection closed (the server counts
    these as dropped too). ``unmatched``: results for no frame waiting (a server that
    answered a frame twice)."""

    sent: int = 0
    answered: int = 0
    dropped: int = 0
    rejected: int = 0
    lost: int = 0
    unmatched: int = 0

    @property
    def pending(self) -> int:
        return self.sent - self.answered - self.dropped - self.rejected - self.lost


@dataclass(frozen=True, slots=True)
class Limits:
    """What the node accepts (hello ``limits``)."""

    max_message_bytes: int
    max_pixels: int
    input_size: int
    max_batch: int
    formats: tuple[str, ...]
    binary_frames: bool


@dataclass(frozen=True, slots=True)
class Hello:
    """The server's first message, typed; ``raw`` keeps every field (also new ones)."""

    protocol: int
    protocols: tuple[int, ...]
    features: frozenset[str]
    session_id: str
    resume_token: str
    resumed: bool
    node: str
    model: str
    labels: tuple[str, ...]
    engine: Mapping[str, Any]
    settings: Settings
    limits: Limits
    counters: Counters
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Hello:
        lim = obj.get("limits") or {}
        protocol = int(obj.get("protocol", 1))
        return cls(
            protocol=protocol,
            protocols=tuple(obj.get("protocols") or (protocol,)),
            # Nodes before protocol 2 announce no features; what they had is implied.
            features=frozenset(obj.get("features") or ("binary_frames", "resume")),
            session_id=str(obj["session_id"]),
            resume_token=str(obj["resume_token"]),
            resumed=bool(obj.get("resumed")),
            node=str(obj.get("node", "")),
            model=str(obj.get("model", "")),
            labels=tuple(obj.get("labels") or ()),
            engine=dict(obj.get("engine") or {}),
            settings=Settings.from_json(obj["settings"]),
            limits=Limits(
                max_message_bytes=int(lim.get("max_message_bytes", 0)),
                max_pixels=int(lim.get("max_pixels", 0)),
                input_size=int(lim.get("input_size", 0)),
                max_batch=int(lim.get("max_batch", 1)),
                formats=tuple(lim.get("formats") or ("jpeg", "png")),
                binary_frames=bool(lim.get("binary_frames", True)),
            ),
            counters=Counters(  # counters a newer node adds are in raw, not here
                **{k: int(v) for k, v in (obj.get("counters") or {}).items() if k in _COUNTERS}
            ),
            raw=dict(obj),
        )

    def label(self, class_id: int) -> str:
        return self.labels[class_id] if 0 <= class_id < len(self.labels) else str(class_id)


@dataclass(frozen=True, slots=True)
class Detection:
    """One box in the frame's own pixels (x right, y down)."""

    box: tuple[float, float, float, float]
    score: float
    class_id: int
    label: str
    track: int | None = None  # a track id, when the node tracks (feature "track")
    text: str | None = None  # the text read in the box, with settings read=True ("read")
    text_score: float | None = None


@dataclass(frozen=True, slots=True)
class Result:
    """The answer to one frame; ``raw`` keeps every field of the message."""

    id: FrameId
    ts: float | None
    width: int
    height: int
    detections: tuple[Detection, ...]
    timing: Mapping[str, float]
    dropped: int
    raw: Mapping[str, Any] = field(repr=False)
    #: ``time.perf_counter()`` when the answer arrived (for latencies; 0 if not received).
    received_at: float = field(default=0.0, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], received_at: float = 0.0) -> Result:
        dets = tuple(
            Detection(
                box=(
                    float(d["box"][0]),
                    float(d["box"][1]),
                    float(d["box"][2]),
                    float(d["box"][3]),
                ),
                score=float(d["score"]),
                class_id=int(d["class"]),
                label=str(d.get("label", d["class"])),
                track=d.get("track"),
                text=d.get("text"),
                text_score=d.get("text_score"),
            )
            for d in obj.get("detections") or ()
        )
        return cls(
            id=obj["id"],
            ts=obj.get("ts"),
            width=int(obj["width"]),
            height=int(obj["height"]),
            detections=dets,
            timing=dict(obj.get("timing") or {}),
            dropped=int(obj.get("dropped", 0)),
            raw=dict(obj),
            received_at=received_at,
        )


@dataclass(frozen=True, slots=True)
class FrameError:
    """An ``error`` message; ``id`` None when it could not be tied to a frame."""

    id: FrameId | None
    code: str
    message: str


Answer = Result | FrameError


def jpeg_from_array(image: NDArray[np.uint8], quality: int = 85, colorspace: str = "RGB") -> bytes:
    """An ``(H, W, 3)`` uint8 array as JPEG bytes (simplejpeg; ``colorspace`` "RGB"/"BGR")."""
    import numpy as np
    import simplejpeg

    arr = np.ascontiguousarray(image)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise TypeError(f"expected an (H, W, 3) uint8 array, got {arr.dtype} {arr.shape}")
    data: bytes = simplejpeg.encode_jpeg(arr, quality=quality, colorspace=colorspace)
    return data


def _with_query(url: str, **params: str | None) -> str:
    """``url`` with the given query parameters set (those given None are left as they are)."""
    given = {k: v for k, v in params.items() if v is not None}
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in given]
    query += list(given.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


def _why(e: aiohttp.ClientError) -> str:
    """A failed TCP connection's reason as the OS says it ("Connection refused"); errno is
    negative for name-resolution errors (getaddrinfo's own codes), which carry their text."""
    if isinstance(e, aiohttp.ClientConnectorError):
        errno = e.os_error.errno
        why = os.strerror(errno) if errno and errno > 0 else e.os_error.strerror
        return why or str(e.os_error) or type(e.os_error).__name__
    return str(e) or type(e).__name__


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds from a ``Retry-After: <seconds>`` header (RFC 9110 section 10.2.3); None
    for an absent header or an HTTP-date (we then back off on our own)."""
    value = (headers or {}).get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


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
    before its future raises :class:`~edge_vision.errors.FrameDropped`.
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

    def _handshake(self, resume_token: str | None) -> tuple[str, tuple[str, ...]]:
        """The URL and the subprotocol entries of a handshake (docs/protocol.md,
        "Connecting"): since protocol 2 the resume token is a subprotocol entry, kept out
        of URLs and so out of access logs; a protocol 1 client sends ``?resume=``."""
        if self.protocol >= 2:
            url = _with_query(self.url, protocol=str(self.protocol), mode=self.mode)
            if resume_token:
                return url, (SUBPROTOCOL, RESUME_ENTRY + resume_token)
            return url, ()
        url = _with_query(
            self.url, protocol=str(self.protocol), mode=self.mode, resume=resume_token
        )
        return url, ()

    async def _open(self, resume_token: str | None) -> Hello:
        assert self._session is not None
        url, subprotocols = self._handshake(resume_token)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        deadline = time.monotonic() + self.retry_s
        backoff = 0.1
        where = self.url
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
                if e.status == 503:  # retried: the status and Retry-After say enough
                    error = ServerUnavailable(where, e.status, "service unavailable")
                    wait = _retry_after(e.headers)
                else:
                    raise await self._refusal(url, headers, e.status) from None
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as e:
                error = ServerUnreachable(where, f"cannot reach the server at {where}: {_why(e)}")
                wait = None
            except aiohttp.ClientError as e:
                raise ConnectFailed(where, f"cannot connect to {where}: {e}") from None
            if wait is None:
                wait, backoff = backoff, min(backoff * 2, self.max_retry_wait_s)
            wait = min(max(wait, 0.05), self.max_retry_wait_s)
            if time.monotonic() + wait > deadline:
                raise error
            self.retries += 1
            log.info("%s; retrying in %.2f s", error, wait)
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
        """The refusal as an exception, with the server's short reason: aiohttp keeps no
        body of a refused upgrade, so the same request is made once more as a plain GET."""
        assert self._session is not None
        body = ""
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            timeout = aiohttp.ClientTimeout(total=5.0)
            async with self._session.get(url, headers=headers, timeout=timeout) as r:
                if r.status == status:
                    body = (await r.text())[:500].strip()
        where = self.url
        if status == 401:
            return AuthenticationFailed(where, status, body)
        if status == 403:
            return AccessForbidden(where, status, body)
        if status == 400 and "unsupported_protocol" in body:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                served = tuple(int(v) for v in orjson.loads(body)["protocols"])
                return ProtocolNotServed(where, status, body, served)
            return ProtocolNotServed(where, status, body, ())
        return HandshakeRefused(where, status, body)

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
        milliseconds; None sends ``null``."""
        if isinstance(image, bytes):
            data = image
        else:  # milliseconds of CPU for a large frame: not on the caller's event loop
            data = await asyncio.to_thread(jpeg_from_array, image, quality)
        fid: FrameId = next(self._ids) if frame_id is None else frame_id
        if fid in self._pending:
            raise ValueError(f"frame id {fid!r} is still waiting for its answer")
        stamp = time.time() * 1000.0 if ts is _UNSET else ts
        form = wire or self.wire or ("binary" if "binary_frames" in self.hello.features else "json")
        message = (
            encode_binary_frame(fid, stamp, data)
            if form == "binary"
            else encode_json_frame(fid, stamp, data)
        )
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

    @property
    def pending(self) -> int:
        """Frames sent whose answer has not come yet."""
        return len(self._pending)

    async def _receive(self) -> None:
        try:
            await self._receive_until_done()
        except (
            ValueError,
            KeyError,
            TypeError,
            IndexError,
        ) as e:  # a server that broke the protocol
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
        return self._classify(code, reason, closing_token)

    def _classify(
        self, code: int | None, reason: str, closing_token: str | None
    ) -> ConnectionClosed:
        if closing_token is not None and code == 1001:
            return ServerShuttingDown(code, reason or "server shutting down", closing_token)
        if code is None or code == 1006:
            return ConnectionLost(code, reason or "the connection ended without a close frame")
        if code == 1001:  # protocol 1: idle timeout (a shutdown sends closing first)
            return IdleTimeout(code, reason)
        if code == 1008:  # protocol 1 used 1008 for several reasons; its text tells them apart
            if "resumed elsewhere" in reason:
                return SessionSuperseded(code, reason)
            if "not reading" in reason:
                return SlowClient(code, reason)
            return ProtocolViolation(code, reason)
        return _CLOSED_BY_CODE.get(code, ConnectionClosed)(code, reason)

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
