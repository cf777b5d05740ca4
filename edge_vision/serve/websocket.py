"""The WebSocket layer under ``/ws``: one set of settings, clean closes (RFC 6455).

:func:`websocket_response` builds every server-side WebSocket with the same settings, so
the test-only echo route (:func:`echo_handler`, registered only with
``server.test_echo_route``) that Autobahn|Testsuite checks is exactly what ``/ws`` runs.

What aiohttp leaves to us, and this module does:

* **1009 that a client still writing receives.** aiohttp answers an oversized message
  with a close frame and then closes the TCP socket at once; the unread rest of the
  message in the kernel's buffer turns that close into a reset, and the client, still
  writing, sees "connection lost" instead of 1009. :class:`ServerWebSocket` lingers:
  after a 1009 it keeps reading and discarding what arrives (aiohttp's protocol drops
  every byte once its parser failed) until the client closes its side or
  ``server.close_linger_s`` passes, then closes (RFC 6455 section 7.1.1: the server
  closes the TCP connection after the closing handshake, and section 7.1.7).
* **1002 for a close code that must not be sent.** aiohttp lets 1006 (and codes from
  5000 up) through as valid; RFC 6455 section 7.4.1 reserves 1004, 1005, 1006 and 1015
  and section 7.4.2 defines nothing from 5000. :func:`reply_close_code` picks the answer
  (``autoclose`` is off so that the answer is ours, not aiohttp's 1000).
* **1007 for invalid UTF-8** (section 8.1): ``decode_text`` is off (frames are parsed as
  bytes, without a str copy), so text is validated here (:func:`is_valid_utf8`).
* **1002 for an unmasked frame** (section 5.1: a server MUST close the connection upon a
  client frame that is not masked). aiohttp's C and pure-Python readers both accept one;
  :class:`MaskedFramesOnly` sits in front of either and follows the frame headers
  (section 5.2) without touching the payload, so the check costs a few operations a
  frame. It reaches aiohttp's parser through two private attributes of its request
  handler, so pyproject.toml pins aiohttp below 3.15 and :func:`mask_check_supported` says
  when a release lacks them (the node then logs once that the check is off).
* **A close that ends.** aiohttp closes the TCP socket with ``transport.close()``, which
  waits for asyncio's buffer to reach the kernel: for a client that never reads, forever,
  with the socket established and its send queue full. :class:`ServerWebSocket` closes
  at once only when the peer has taken every byte (asyncio's buffer and the kernel's
  send queue, Linux ``SIOCOUTQ``, are empty); otherwise it stops reading and waits up to
  ``server.close_timeout_s`` for the peer to take them, then resets the connection
  (``SO_LINGER`` 0: the kernel drops its queue) and reports it (``on_abort``).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct
import termios
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_websocket import WebSocketError
from aiohttp.web_protocol import RequestHandler

from ..common.close_codes import CloseCode
from ..config import ServerConfig

log = logging.getLogger(__name__)

#: Path of the test-only echo route (``server.test_echo_route``).
ECHO_PATH = "/test/echo"

# Close codes a peer may send (RFC 6455 section 7.4.1 and the IANA registry it set up;
# 4000-4999 are private use, section 7.4.2). 1004-1006 and 1015 must never be sent.
_SENDABLE = frozenset((*range(1000, 1004), *range(1007, 1015), *range(3000, 5000)))
_LINGER_POLL_S = 0.05
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets, the queue is dropped


def reply_close_code(peer_code: int | None) -> int:
    """The code to answer a peer's close frame with: 1000, or 1002 for a code the peer
    must not send. ``0``/None: the close frame carried no code (aiohttp reports 0)."""
    if not peer_code:
        return int(CloseCode.NORMAL)
    return int(CloseCode.NORMAL if peer_code in _SENDABLE else CloseCode.PROTOCOL_ERROR)


def is_valid_utf8(data: bytes | str) -> bool:
    """Whether a text message's payload is valid UTF-8 (RFC 3629), as section 8.1 asks."""
    if isinstance(data, str):
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def mask_check_supported() -> bool:
    """Whether this aiohttp's request handler has what :class:`MaskedFramesOnly` needs:
    the parser it feeds a WebSocket's bytes to, and the bytes that came with the upgrade
    request (checked for the 3.14 series, tests/integration/test_unmasked_frames.py)."""
    slots = getattr(RequestHandler, "__slots__", ())
    return "_payload_parser" in slots and "_message_tail" in slots


class MaskedFramesOnly:
    """In front of aiohttp's WebSocket reader: follows each frame's header (RFC 6455
    section 5.2: 2 bytes, 0, 2 or 8 of length, 4 of mask key when masked) and skips its
    payload; at the first frame without the mask bit, fails the connection with 1002
    (its reader's queue gets the error, as when aiohttp's own parser fails), and reads
    nothing more."""

    __slots__ = ("_fail", "_head", "_inner", "_skip", "failed")

    def __init__(self, inner: Any, fail: Callable[[], None]) -> None:
        self._inner = inner
        self._fail = fail
        self._head = b""  # a frame header not complete yet
        self._skip = 0  # payload bytes of the current frame still to come
        self.failed = False

    def masked(self, data: bytes) -> bool:
        """Follow ``data``; False at the first unmasked frame."""
        i, n = 0, len(data)
        while i < n:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                continue
            need = 2
            head = self._head + data[i : i + 14 - len(self._head)]
            if len(head) >= 2:
                if not head[1] & 0x80:
                    return False
                size = head[1] & 0x7F
                need = 2 + (2 if size == 126 else 8 if size == 127 else 0) + 4
            if len(head) < need:  # the rest of the header comes in a later chunk
                self._head = head
                return True
            if size == 126:
                size = struct.unpack_from(">H", head, 2)[0]
            elif size == 127:
                size = struct.unpack_from(">Q", head, 2)[0]
            i += need - len(self._head)
            self._head = b""
            self._skip = size
        return True

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if self.failed:
            return True, b""
        if not self.masked(bytes(data)):
            self.failed = True
            self._fail()
            return True, b""  # the handler stops reading; aiohttp sends the close code
        result: tuple[bool, bytes] = self._inner.feed_data(data)
        return result

    def feed_eof(self) -> None:
        self._inner.feed_eof()


def unsent_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes written to ``transport`` that its peer has not taken yet: asyncio's buffer,
    plus, on Linux, the kernel's send queue (SIOCOUTQ: sent but not acknowledged, or not
    sent yet). 0 once the socket is closed."""
    pending = 0
    if isinstance(transport, asyncio.WriteTransport):
        pending = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    try:
        fd = sock.fileno() if sock is not None else -1
        if fd >= 0:
            queued = fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0")
            pending += struct.unpack("i", queued)[0]
    except OSError:  # closed meanwhile, or not a TCP socket
        pass
    return pending


def reset(transport: asyncio.BaseTransport) -> None:
    """Close ``transport`` with a TCP reset: neither asyncio's buffer nor the kernel's
    send queue is kept for a peer that does not read (RFC 793 abort)."""
    sock = transport.get_extra_info("socket")
    try:
        if sock is not None and sock.fileno() >= 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:
        pass
    if isinstance(transport, asyncio.WriteTransport):
        transport.abort()
    else:
        transport.close()


class ServerWebSocket(web.WebSocketResponse):
    """aiohttp's WebSocketResponse, lingering after a 1009 and resetting a close the peer
    does not take (see the module docstring)."""

    def __init__(
        self,
        *,
        linger_s: float,
        close_timeout_s: float = 5.0,
        on_abort: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._linger_s = linger_s
        self._close_timeout_s = close_timeout_s
        self.on_abort = on_abort  # called with the bytes dropped when a close is reset
        self._closing_transport: asyncio.BaseTransport | None = None
        self._settled: asyncio.Future[None] | None = None
        self.unmasked = False  # the client sent a frame without a mask (closed with 1002)
        self._request: web.BaseRequest | None = None
        self._first_close_code: int | None = None
        self._linger_until: float | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._handshake_done = False
        self._handshake_failed = False

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter:
        if self._handshake_failed:  # aiohttp calls prepare() again after the handler
            raise ConnectionResetError("the client went away during the handshake")
        self._request = request
        try:
            writer = await super().prepare(request)
        except BaseException:
            self._handshake_failed = True
            raise
        self._handshake_done = True
        return writer

    def _post_start(self, request: web.BaseRequest, protocol: str | None, writer: Any) -> None:
        # The bytes that came with the upgrade request are fed to aiohttp's parser inside
        # _post_start, before the check can stand in front of it: they are checked first.
        handler = request.protocol
        if not _MASK_CHECK:
            super()._post_start(request, protocol, writer)
            return
        check = MaskedFramesOnly(None, self._unmasked_frame)
        early_ok = check.masked(bytes(getattr(handler, "_message_tail", b"")))
        super()._post_start(request, protocol, writer)
        parser = getattr(handler, "_payload_parser", None)
        if parser is None:
            return  # the connection is already gone
        check._inner = parser
        handler._payload_parser = check
        if not early_ok:
            check.failed = True
            self._unmasked_frame()

    def _unmasked_frame(self) -> None:
        """Fail the connection (RFC 6455 section 7.1.7) the way aiohttp fails it for a
        frame its own parser refuses: the error in the reader's queue, then 1002."""
        self.unmasked = True
        error = WebSocketError(WSCloseCode.PROTOCOL_ERROR, "client frame is not masked")
        if self._reader is not None:
            self._reader.set_exception(error)

    async def close(
        self, *, code: int = CloseCode.NORMAL, message: bytes = b"", drain: bool = True
    ) -> bool:
        if not self._handshake_done:
            # The client went away during the upgrade; aiohttp still calls close() (from
            # write_eof) and would raise "Call .prepare() first".
            return False
        if self._first_close_code is None and not self.closed:
            self._first_close_code = code
        return await super().close(code=code, message=message, drain=drain)

    def _close_transport(self) -> None:
        # aiohttp's one place that closes the TCP socket (web_ws.py); after our 1009 it is
        # deferred so the client's remaining bytes are read and dropped, not reset.
        transport = self._request.transport if self._request is not None else None
        if transport is None or transport.is_closing():
            super()._close_transport()
            return
        if self._linger_s <= 0 or self._first_close_code != CloseCode.MESSAGE_TOO_BIG:
            self._close_when_taken(transport)
            return
        if self._linger_timer is None:
            loop = asyncio.get_running_loop()
            self._linger_until = loop.time() + self._linger_s
            # Bounded even if nobody awaits linger(): the socket closes after linger_s.
            self._linger_timer = loop.call_later(self._linger_s, transport.close)
            if isinstance(transport, asyncio.ReadTransport):
                transport.resume_reading()  # discarding needs reading

    def _close_when_taken(self, transport: asyncio.BaseTransport) -> None:
        """Close now if the peer took every byte; else once it has, or reset it after
        ``close_timeout_s`` (the module docstring)."""
        if unsent_bytes(transport) == 0:
            transport.close()
            return
        if self._closing_transport is not None:
            return  # already waiting for this peer
        loop = asyncio.get_running_loop()
        self._closing_transport = transport
        self._settled = loop.create_future()
        if isinstance(transport, asyncio.ReadTransport) and transport.is_reading():
            transport.pause_reading()  # nothing it sends now is read; it only costs memory
        self._watch_close(loop, transport, loop.time() + self._close_timeout_s)

    def _watch_close(
        self, loop: asyncio.AbstractEventLoop, transport: asyncio.BaseTransport, deadline: float
    ) -> None:
        left = unsent_bytes(transport)
        if left == 0:
            transport.close()  # taken (or gone): the ordinary close, FIN after the data
        elif loop.time() >= deadline:
            reset(transport)
            log.debug("reset a connection whose peer did not take %d bytes", left)
            if self.on_abort is not None:
                self.on_abort(left)
        else:
            loop.call_later(_LINGER_POLL_S, self._watch_close, loop, transport, deadline)
            return
        if self._settled is not None and not self._settled.done():
            self._settled.set_result(None)

    async def settle(self) -> None:
        """Return once a close this socket started is over: the peer took what was sent
        and the socket closed, or it was reset after ``close_timeout_s``. The handler
        waits here, so that aiohttp does not close the socket with bytes still queued
        (the kernel would then keep them, and the connection, for minutes)."""
        await self.linger()
        if self._settled is not None:
            await asyncio.shield(self._settled)

    @property
    def lingering(self) -> bool:
        """A 1009 was sent and the socket is kept open to drain the client's message."""
        return self._linger_timer is not None

    async def linger(self) -> None:
        """Return once a lingering socket is gone: closed by the client, or after
        ``linger_s`` by us. Returns at once when not lingering. The handler must wait
        here: aiohttp closes the socket as soon as the handler returns."""
        if self._linger_until is None or self._request is None:
            return
        loop = asyncio.get_running_loop()
        # Polled: aiohttp signals the peer's close to nobody but its own reader, which has
        # already failed here.
        while self._request.transport is not None and loop.time() < self._linger_until:  # noqa: ASYNC110
            await asyncio.sleep(_LINGER_POLL_S)
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        transport = self._request.transport
        if transport is not None:
            transport.close()


_MASK_CHECK = mask_check_supported()
if not _MASK_CHECK:  # pragma: no cover - an aiohttp outside the pinned range
    log.warning(
        "aiohttp %s: unmasked client frames cannot be refused with 1002 (RFC 6455 5.1); "
        "install the range pyproject.toml pins",
        aiohttp.__version__,
    )


def websocket_response(
    server: ServerConfig,
    protocols: Iterable[str] = (),
    on_abort: Callable[[int], None] | None = None,
) -> ServerWebSocket:
    """The WebSocket every route of this server speaks (``/ws`` and the echo route);
    ``protocols``: the subprotocols it may echo back; ``on_abort``: sees each close that
    had to be reset (the bytes the peer never took)."""
    return ServerWebSocket(
        protocols=tuple(protocols),
        linger_s=server.close_linger_s,
        close_timeout_s=server.close_timeout_s,
        on_abort=on_abort,
        # aiohttp refuses a message of max_msg_size bytes; ours is the largest accepted.
        max_msg_size=server.max_message_bytes + 1,
        compress=False,  # JPEG does not deflate; results are small
        autoping=True,
        autoclose=False,  # we answer close frames ourselves (reply_close_code)
        timeout=2.0,  # for the client's close frame after ours
        decode_text=False,  # parsed as bytes; UTF-8 checked where it matters
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def echo_handler(server: ServerConfig, protocols: Iterable[str] = ()) -> Handler:
    """A test-only route that echoes every message, with ``/ws``'s WebSocket settings and
    close handling, for Autobahn|Testsuite (``server.test_echo_route``; never in
    production: it answers anyone with whatever they send)."""

    async def echo(request: web.Request) -> web.StreamResponse:
        ws = websocket_response(server, protocols)
        await ws.prepare(request)
        started = time.monotonic()
        while True:
            msg = await ws.receive()
            if msg.type is WSMsgType.TEXT:
                if not is_valid_utf8(msg.data):
                    await ws.close(code=CloseCode.INVALID_PAYLOAD, message=b"invalid UTF-8")
                    break
                data = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
                await ws.send_frame(data, WSMsgType.TEXT)
            elif msg.type is WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
            elif msg.type is WSMsgType.CLOSE:
                await ws.close(code=reply_close_code(msg.data))
                break
            else:  # ERROR (aiohttp already sent its close code), CLOSING, CLOSED
                break
        await ws.settle()
        log.debug(
            "echo connection closed with %s after %.1f s", ws.close_code, time.monotonic() - started
        )
        return ws

    return echo
