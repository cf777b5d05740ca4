"""Every WebSocket close code the server sends, each with one meaning (docs/protocol.md).

RFC 6455 section 7.4.1 defines 1000-1015; section 7.4.2 leaves 4000-4999 to applications.
Until protocol 1, 1008 meant both "you stopped reading" and "your session was resumed
elsewhere", and 1001 both "shutting down" and "idle": a client could not tell whether to
resume, slow down or give up. From protocol 2 each reason has its own code, below, and
the close frame's reason text only adds words for people.

Kept in one table so that code, docs and tests cannot drift: ``tests/integration/test_auth.py``
checks that every code here is documented in docs/protocol.md and that no two share a
number.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class CloseCode(IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    INVALID_PAYLOAD = 1007
    MESSAGE_TOO_BIG = 1009
    SUPERSEDED = 4000
    TOKEN_EXPIRED = 4001
    SLOW_CLIENT = 4002
    IDLE_TIMEOUT = 4003


@dataclass(frozen=True)
class CloseReason:
    code: CloseCode
    meaning: str
    #: What a well-behaved client does next.
    client_action: str
    #: True when reconnecting with the same resume token is the right move.
    resumable: bool


CLOSE_REASONS: dict[CloseCode, CloseReason] = {
    r.code: r
    for r in (
        CloseReason(
            CloseCode.NORMAL,
            "normal closure; a client closing with 1000 ends its session",
            "nothing: the session is over",
            False,
        ),
        CloseReason(
            CloseCode.GOING_AWAY,
            "the server is shutting down (a `closing` message with the resume token came first)",
            "reconnect, to any node, and resume",
            True,
        ),
        CloseReason(
            CloseCode.PROTOCOL_ERROR,
            "the client broke RFC 6455 framing",
            "fix the client",
            False,
        ),
        CloseReason(
            CloseCode.INVALID_PAYLOAD,
            "a text message that is not valid UTF-8 (RFC 6455 section 8.1)",
            "fix the client",
            False,
        ),
        CloseReason(
            CloseCode.MESSAGE_TOO_BIG,
            "a message larger than `server.max_message_bytes` (hello: limits)",
            "send smaller frames, then reconnect and resume",
            True,
        ),
        CloseReason(
            CloseCode.SUPERSEDED,
            "a newer connection resumed this session (another tab, device or node)",
            "do not reconnect automatically: that would take the session back and forth",
            False,
        ),
        CloseReason(
            CloseCode.TOKEN_EXPIRED,
            "the credential this connection was admitted with has expired",
            "get a fresh token, reconnect with it and resume",
            True,
        ),
        CloseReason(
            CloseCode.SLOW_CLIENT,
            "the client did not read its results for `server.send_timeout_s`",
            "read results promptly, then reconnect and resume",
            True,
        ),
        CloseReason(
            CloseCode.IDLE_TIMEOUT,
            "nothing arrived from the client for `server.idle_timeout_s`",
            "reconnect and resume when there is something to send",
            True,
        ),
    )
}


def meaning(code: int) -> str:
    """The documented meaning of a close code, or ``"unknown"``."""
    try:
        return CLOSE_REASONS[CloseCode(code)].meaning
    except ValueError:
        return "unknown"
