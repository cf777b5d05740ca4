"""Redaction by form and by value, and the malformed-request line (serve/auth.py), on
literal text and records."""

from __future__ import annotations

import logging
import sys

import pytest
from aiohttp.http_exceptions import BadHttpMessage

from edge_vision.serve import auth

TOKEN = "ev1.eyJzdWIiOiJhIn0.c2lnbmF0dXJlc2lnbmF0dXJl"


@pytest.mark.parametrize(
    "text",
    [
        f"b'Authorization: Bearer\\x00{TOKEN}'",  # a repr of the header's bytes
        f"Authorization: Bearer\x00{TOKEN}",  # the NUL itself
        f"Authorization:Bearer{TOKEN}",
        f"Authorization: {TOKEN}",
        f"b'{TOKEN}'",  # a header line that is only the token
        f"{{'Authorization': 'Bearer {TOKEN}'}}",
        f"GET /ws?access_token={TOKEN}&mode=every",
        f"edge-vision, edge-vision.token.{TOKEN}",
        "key evk_" + "Q" * 43 + " in a line",
        "redis://edge:" + TOKEN + "@127.0.0.1:6379/0",
    ],
)
def test_every_shape_of_a_credential_is_redacted(text: str) -> None:
    clean = auth.redact_text(text)
    assert TOKEN not in clean and "Q" * 43 not in clean and "REDACTED" in clean


def test_what_is_not_a_credential_is_left_alone() -> None:
    for text in (
        "limits.max_connections_per_token: 128",
        "admin_token: null",
        "session 1a2b: client disconnected",
        "resume=REDACTED&mode=every",
    ):
        assert auth.redact_text(text) == text


def test_secrets_held_in_clear_are_redacted_by_value() -> None:
    auth.redact_values(["plainAdminToken-31337", b"a-token-secret-of-many-bytes", "short"])
    clean = auth.redact_text("x plainAdminToken-31337 y a-token-secret-of-many-bytes short")
    assert clean == "x REDACTED y REDACTED short"  # 'short' is too short to redact


def _record(peer: str) -> logging.LogRecord:
    record = logging.LogRecord(
        "aiohttp.server",
        logging.ERROR,
        __file__,
        1,
        "Error handling request from %s",
        (peer,),
        None,
    )
    try:
        raise BadHttpMessage(f"Invalid header value char:\n\n    b'X: {TOKEN}\\x00'\n    ^")
    except BadHttpMessage:
        record.exc_info = sys.exc_info()
    return record


def test_malformed_requests_are_one_line_without_bytes_and_rate_limited() -> None:
    now = [0.0]
    quiet = auth.QuietMalformedRequests(every_s=10, clock=lambda: now[0])
    first = _record("10.0.0.9")
    assert quiet.filter(first)
    line = first.getMessage()
    assert first.exc_info is None and first.levelno == logging.WARNING
    assert "10.0.0.9" in line and "Invalid header value char" in line and TOKEN not in line
    assert not any(quiet.filter(_record("10.0.0.9")) for _ in range(1999))
    now[0] = 11.0
    later = _record("10.0.0.7")
    assert quiet.filter(later) and "1999 more" in later.getMessage()
    other = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "boom", (), None)
    assert quiet.filter(other) and other.getMessage() == "boom"  # not a parser refusal
