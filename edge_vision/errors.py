"""The one exception tree of edge_vision.

    EdgeVisionError
    ├── ConfigError            bad configuration; stops start-up with a message naming the key
    │   └── ListenFailed       the node cannot listen on server.host:server.port (in use, not
    │                          this machine's address): one line saying what to do, exit 2
    ├── ModelError             a model file that cannot be used (missing, unsupported outputs)
    ├── EngineError            an engine failed to load or to run
    │   ├── EngineUnavailable  no engine can serve right now (GPU lost, Triton down, no fallback)
    │   └── EngineMismatch     the engine serves another model than the configured one (Triton's
    │                          model metadata differs from the ONNX model): stops start-up
    ├── StateUnavailable       the state store (Redis) cannot be reached; frames keep flowing
    ├── UnsupportedProtocol    a client asked for a protocol version this node does not serve
    │                          (HTTP 400 before the upgrade; edge_vision/session/versions.py)
    ├── ClientError            bad input from one client; becomes an ``error`` message with a
    │                          stable ``code`` and never a traceback in the log
    └── ProtocolClientError    raised by the protocol client, edge_vision.client (docs/client.md)
        ├── ConnectFailed              no session could be opened
        │   ├── ServerUnreachable      no TCP connection (refused, no route, DNS, TLS)
        │   └── HandshakeRefused       an HTTP status instead of the upgrade (.status, .body)
        │       ├── WrongPath              no WebSocket at the URL's path (the page, a 404):
        │       │                          .ws_url names the node's /ws
        │       ├── AuthenticationFailed   401: no or a bad token
        │       ├── AccessForbidden        403: wrong scope or origin
        │       ├── ProtocolNotServed      400 unsupported_protocol (.protocols served)
        │       └── ServerUnavailable      503 past the retry budget (warming up, full, stopping)
        ├── ConnectionClosed           the session's socket closed (.code, .reason, .resumable)
        │   ├── SessionEnded           1000
        │   ├── ServerShuttingDown     1001 after ``closing`` (.resume_token): resume elsewhere
        │   ├── IdleTimeout            4003 (protocol 1: 1001 without ``closing``)
        │   ├── SlowClient             4002 (protocol 1: 1008 "not reading")
        │   ├── SessionSuperseded      4000 (protocol 1: 1008 "resumed elsewhere")
        │   ├── TokenExpired           4001
        │   ├── MessageTooBig          1009, or refused before sending (.size, .limit)
        │   ├── ServerOverloaded       1013 (RFC 6455 peers, proxies; edge_vision sends none)
        │   ├── ServerFailed           1011 (RFC 6455 peers, proxies; edge_vision sends none)
        │   ├── ProtocolViolation      1002, 1007, 1008 otherwise
        │   └── ConnectionLost         no close frame (1006): the network or the server died
        ├── FrameDropped               the server dropped this frame (latest-wins, or closed on it)
        └── FrameRejected              the server answered this frame with ``error`` (.code)

Programmer misuse raises ``TypeError`` / ``RuntimeError`` as usual.

The client error codes are part of the protocol (docs/protocol.md); they never change meaning.
"""

from __future__ import annotations

from typing import Final

#: Error codes sent to clients. Stable: clients may switch on them.
ERROR_CODES: Final[dict[str, str]] = {
    "bad_json": "the text message is not valid JSON",
    "bad_message": "the message is not a JSON object or its binary header is malformed",
    "unknown_type": "the message 'type' is not one the server knows",
    "bad_field": "a required field is missing or has the wrong type",
    "bad_base64": "the 'image' field is not valid base64",
    "bad_image": "the bytes are not a decodable JPEG or PNG image",
    "unsupported_image": "the image format is not JPEG or PNG",
    "image_too_large": "the image has more pixels than the server accepts",
    "bad_settings": "a settings value is out of range",
    "engine_unavailable": "no inference engine can serve the frame right now",
    "internal": "the server failed on this frame; the connection lives on",
    # since protocol 2 (docs/security.md, "Memory budget")
    "over_memory_budget": "the node's memory budget has no room for the frame now; retry",
    "decoded_too_large": "the image would decode to more bytes than the server accepts",
}


class EdgeVisionError(Exception):
    """Base of every error edge_vision raises on purpose."""


class ConfigError(EdgeVisionError):
    """The configuration is invalid; the message names the key and the allowed values."""


class ListenFailed(ConfigError):
    """The node cannot listen where it was told (``server.host``, ``server.port``): the
    port is in use, the address is not this machine's, or the port needs privileges. The
    message names the address, the operating system's reason and what to do."""


class ModelError(EdgeVisionError):
    """A model cannot be loaded or its outputs match no known head."""


class EngineError(EdgeVisionError):
    """An engine failed to load or to run a batch."""


class EngineUnavailable(EngineError):
    """No engine can serve right now; frames are answered with ``engine_unavailable``."""


class EngineMismatch(EngineError):
    """The engine's model contradicts the configured one (input/output names, dtypes, dims).

    A configuration error, not an outage: start-up stops even when a fallback engine is
    configured, because serving on the fallback would hide it.
    """


class StateUnavailable(EdgeVisionError):
    """The state store cannot be reached; state is degraded, frames keep flowing."""


class UnsupportedProtocol(EdgeVisionError):
    """A client asked for a protocol version this node does not serve (``?protocol=``)."""

    def __init__(self, asked: str, supported: tuple[int, ...]) -> None:
        served = ", ".join(map(str, supported))
        super().__init__(f"protocol {asked!r} is not served; this node serves {served}")
        self.asked = asked
        self.supported = supported


class ClientError(EdgeVisionError):
    """Bad input from a client: answered with an ``error`` message, the connection lives on."""

    def __init__(self, code: str, message: str, frame_id: object = None) -> None:
        if code not in ERROR_CODES:
            raise RuntimeError(f"unknown client error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.frame_id = frame_id

    def with_frame_id(self, frame_id: object) -> ClientError:
        """The same error, attributed to a frame whose id became known later."""
        return ClientError(self.code, self.message, frame_id)


# -- raised by the protocol client (edge_vision/client.py) -------------------------------


class ProtocolClientError(EdgeVisionError):
    """Base of what :mod:`edge_vision.client` raises."""


class ConnectFailed(ProtocolClientError):
    """No session could be opened at ``url``."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url = url


class ServerUnreachable(ConnectFailed):
    """No TCP connection to the server (refused, no route, name not resolved, TLS)."""


class HandshakeRefused(ConnectFailed):
    """The server answered the upgrade with an HTTP status; ``body`` is its short reason."""

    def __init__(self, url: str, status: int, body: str, message: str | None = None) -> None:
        super().__init__(
            url, message or f"the server at {url} refused the WebSocket: HTTP {status}: {body}"
        )
        self.status = status
        self.body = body


class WrongPath(HandshakeRefused):
    """The URL's path serves no WebSocket: the overlay page (HTTP 200) or nothing (404).
    ``ws_url`` is where an edge_vision node serves it (the same address, path ``/ws``)."""

    def __init__(self, url: str, status: int, body: str, message: str, ws_url: str) -> None:
        super().__init__(url, status, body, message)
        self.ws_url = ws_url


class AuthenticationFailed(HandshakeRefused):
    """HTTP 401: the node needs a token (``Authorization: Bearer``) and had none or a bad one."""


class AccessForbidden(HandshakeRefused):
    """HTTP 403: the token lacks the ``stream`` scope, or the Origin is not allowed."""


class ProtocolNotServed(HandshakeRefused):
    """HTTP 400 ``unsupported_protocol``: ``protocols`` lists the versions the node serves."""

    def __init__(self, url: str, status: int, body: str, protocols: tuple[int, ...]) -> None:
        super().__init__(url, status, body)
        self.protocols = protocols


class ServerUnavailable(HandshakeRefused):
    """HTTP 503 for longer than the retry budget: warming up, at its limit, or stopping."""


class ConnectionClosed(ProtocolClientError):
    """The server closed the session's socket (docs/protocol.md, "Close codes").

    ``code`` as received (a protocol 1 connection receives protocol 1 codes), ``reason``
    the close frame's text, ``resumable`` whether reconnecting with the session's resume
    token is the right move."""

    resumable = False

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(f"the server closed the connection ({code}: {reason or 'no reason'})")
        self.code = code
        self.reason = reason


class SessionEnded(ConnectionClosed):
    """1000: the session is over (the client or the server closed it normally)."""


class ServerShuttingDown(ConnectionClosed):
    """1001 after a ``closing`` message: reconnect, to any node, and resume."""

    resumable = True

    def __init__(self, code: int | None, reason: str = "", resume_token: str = "") -> None:
        super().__init__(code, reason)
        self.resume_token = resume_token


class IdleTimeout(ConnectionClosed):
    """Nothing came from the client for ``server.idle_timeout_s``."""

    resumable = True


class SlowClient(ConnectionClosed):
    """The client did not read its results for ``server.send_timeout_s``."""

    resumable = True


class SessionSuperseded(ConnectionClosed):
    """A newer connection resumed this session; do not take it back automatically."""


class TokenExpired(ConnectionClosed):
    """The credential this connection was admitted with expired: reconnect with a new one."""

    resumable = True


class MessageTooBig(ConnectionClosed):
    """A message larger than the node's ``server.max_message_bytes`` (announced in hello's
    ``limits.max_message_bytes``).

    Raised by the client's ``send`` before anything is sent, with ``size`` and ``limit``
    in bytes (``code`` None: the connection stays open, the next frame may go); or for the
    server's 1009 close (``size`` and ``limit`` None), when the client did not know the
    limit."""

    resumable = True

    def __init__(
        self,
        code: int | None,
        reason: str = "",
        *,
        size: int | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(code, reason)
        self.size = size
        self.limit = limit
        if size is not None and limit is not None:
            self.args = (
                f"a frame of {size:,} bytes is over this node's limit of {limit:,} bytes a "
                "message (its server.max_message_bytes, announced in hello); nothing was sent "
                "and the connection stays open: send a smaller image (scale it down, or JPEG "
                "rather than PNG)",
            )


class ServerOverloaded(ConnectionClosed):
    """1013: the node is overloaded; reconnect with backoff."""

    resumable = True


class ServerFailed(ConnectionClosed):
    """1011: the server failed in a way that is not the client's fault."""

    resumable = True


class ProtocolViolation(ConnectionClosed):
    """The server says this client broke the protocol (1002, 1007, or 1008 otherwise)."""


class ConnectionLost(ConnectionClosed):
    """The socket ended without a close frame (1006): network or server gone."""

    resumable = True


class FrameDropped(ProtocolClientError):
    """The server answered a later frame first (latest-wins dropped this one), or the
    connection closed before this frame's answer; the server counts it as dropped."""

    def __init__(self, frame_id: object, why: str = "a newer frame took its place") -> None:
        super().__init__(f"frame {frame_id!r} was dropped: {why}")
        self.frame_id = frame_id


class FrameRejected(ProtocolClientError):
    """The server answered this frame with an ``error`` message (``code``: ERROR_CODES)."""

    def __init__(self, frame_id: object, code: str, message: str) -> None:
        super().__init__(f"frame {frame_id!r} was rejected: {code}: {message}")
        self.frame_id = frame_id
        self.code = code
        self.message = message
