"""The client's handshake without I/O: the URL and subprotocol entries it offers, how long a
503 asks it to wait, and which typed exception a refusal or a close stands for."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp
import orjson

from ..common.close_codes import CloseCode
from ..common.settings import Mode
from ..errors import (
    AccessForbidden,
    AuthenticationFailed,
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
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
    WrongPath,
)
from ..session.versions import RESUME_ENTRY, SUBPROTOCOL

#: Close codes of protocol 2 (edge_vision/common/close_codes.py) → the exception a client raises;
#: 1001 and 1008 depend on more than the code (see classify_close).
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


def with_query(url: str, **params: str | None) -> str:
    """``url`` with the given query parameters set (those given None are left as they are)."""
    given = {k: v for k, v in params.items() if v is not None}
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in given]
    query += list(given.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


def why(e: aiohttp.ClientError) -> str:
    """A failed TCP connection's reason as the OS says it ("Connection refused"); errno is
    negative for name-resolution errors (getaddrinfo's own codes), which carry their text."""
    if isinstance(e, aiohttp.ClientConnectorError):
        errno = e.os_error.errno
        why = os.strerror(errno) if errno and errno > 0 else e.os_error.strerror
        return why or str(e.os_error) or type(e.os_error).__name__
    return str(e) or type(e).__name__


def retry_after(headers: Mapping[str, str] | None) -> float | None:
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


def handshake(
    url: str, protocol: int, mode: Mode | None, resume_token: str | None
) -> tuple[str, tuple[str, ...]]:
    """The URL and the subprotocol entries of a handshake (docs/protocol.md,
    "Connecting"): since protocol 2 the resume token is a subprotocol entry, kept out
    of URLs and so out of access logs; a protocol 1 client sends ``?resume=``."""
    if protocol >= 2:
        with_protocol = with_query(url, protocol=str(protocol), mode=mode)
        if resume_token:
            return with_protocol, (SUBPROTOCOL, RESUME_ENTRY + resume_token)
        return with_protocol, ()
    return with_query(url, protocol=str(protocol), mode=mode, resume=resume_token), ()


#: Statuses that mean the URL's path serves no WebSocket: a page (200), or nothing (404).
WRONG_PATH_STATUSES = frozenset({200, 404})


def node_ws_url(url: str) -> str:
    """Where an edge_vision node at ``url``'s address serves its WebSocket: path ``/ws``."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/ws", "", ""))


def wrong_path(where: str, status: int, body: str = "") -> WrongPath:
    """HTTP 200 or 404 instead of the upgrade: the path is the overlay page, another page,
    or nothing; the message names the node's ``/ws`` (and never repeats a page's HTML)."""
    ws = node_ws_url(where)
    path = urlsplit(where).path
    at_ws = path.rstrip("/").endswith("/ws")
    if path in ("", "/"):
        message = f"{where} is the overlay page; the WebSocket is at {ws}"
    elif status == 200 and at_ws:
        message = (
            f"{where} answered with a page (HTTP 200), not the WebSocket upgrade: is an "
            "edge_vision node there, or does a proxy in front drop the Upgrade header?"
        )
    elif status == 200:
        message = f"{where} is a page (HTTP 200), not the WebSocket; it is at {ws}"
    elif at_ws:
        message = (
            f"nothing serves a WebSocket at {where} (HTTP 404): is an edge_vision node "
            "there, or does a proxy in front serve its /ws under another path?"
        )
    else:
        message = f"nothing serves a WebSocket at {where} (HTTP 404); it is at {ws}"
    short = "" if body.lstrip().startswith("<") else body[:200]
    return WrongPath(where, status, short, message, ws)


def gave_up(error: ConnectFailed, elapsed: float, retry_s: float, body: str = "") -> ConnectFailed:
    """The last failure once the retry budget is spent, saying how long it tried and what to
    check; ``body``: the server's reason for a 503."""
    tried = f"tried for {elapsed:.1f} s (retry_s={retry_s:g})"
    where = error.url
    if isinstance(error, ServerUnavailable):
        body = body or "service unavailable"
        return ServerUnavailable(
            where,
            503,
            body,
            f"the server at {where} still refuses the WebSocket (HTTP 503: {body}); {tried}: "
            "it is warming up, at a connection limit or stopping (its /readyz says which); "
            "retry later, or give a longer retry_s",
        )
    if isinstance(error, ServerUnreachable):
        return ServerUnreachable(
            where,
            f"{error}; {tried}: check the host and port, and that 'edge-vision serve' runs "
            "there (its log names the URL to use)",
        )
    return error


def refusal_error(where: str, status: int, body: str) -> HandshakeRefused:
    """A refused upgrade (HTTP ``status`` with the server's short ``body``) as its exception."""
    if status in WRONG_PATH_STATUSES:
        return wrong_path(where, status, body)
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


def classify_close(code: int | None, reason: str, closing_token: str | None) -> ConnectionClosed:
    """The typed exception a close with ``code`` and ``reason`` stands for; ``closing_token``:
    the resume token of a ``closing`` message that came first (a shutdown), else None."""
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
