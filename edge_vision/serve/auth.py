"""Who may connect: API keys, signed expiring tokens, origins. Pure functions, no I/O.

Credentials (docs/security.md, docs/protocol.md "Authentication", since protocol 2):

* **API keys**: long random strings configured as their SHA-256 (``auth.api_keys``), so a
  config file or ``--print-config`` never holds a usable key. Each has a name (the
  subject) and scopes.
* **Signed tokens**: ``ev1.<payload>.<signature>``, the payload base64url JSON
  ``{"sub": ..., "exp": <unix s>, "iat": <unix s>, "scp": ["stream", ...]}`` and the
  signature HMAC-SHA256 (RFC 2104) over ``ev1.<payload>`` with the node's token secret.
  ``edge-vision token --subject cam-3 --ttl 8h --scope stream`` mints one.

Scopes: ``stream`` opens ``/ws``; ``admin`` reads ``/metrics`` and ``/api/*`` (and
implies nothing else). Every comparison of a secret is constant-time
(:func:`hmac.compare_digest`), and every configured key is compared, so timing says
nothing about which key nearly matched.

Where a client puts its credential, in the order looked at: ``Authorization: Bearer``
(replay, camera boxes), a ``Sec-WebSocket-Protocol`` entry ``edge-vision.token.<credential>``
(browsers cannot set headers on a WebSocket; the server echoes back only the real
subprotocol, never this entry), and as a last resort ``?access_token=`` (RFC 6750
section 2.3).

Logs are safe by construction (docs/security.md, "Logs"): :func:`redact_text` (installed
as a log filter by :func:`install_log_redaction`) replaces every credential by its form,
whatever surrounds it (``ev1.`` tokens, ``evk_`` API keys, subprotocol entries, any
``Authorization`` value, whatever follows ``Bearer``, secret query parameters, a URL's
password), and the secrets the node holds in clear (the token secret,
``server.admin_token``) by their value. A malformed HTTP request, which nobody
authenticated, costs one rate-limited log line without its bytes or a traceback
(:class:`QuietMalformedRequests`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from aiohttp.http_exceptions import HttpProcessingError

from ..errors import ConfigError
from ..session.versions import QUERY_TOKEN, RESUME_ENTRY, TOKEN_ENTRY

Scope = Literal["stream", "admin"]
SCOPES: tuple[Scope, ...] = ("stream", "admin")

TOKEN_PREFIX = "ev1"
#: Query parameters that carry secrets: never logged as given.
SECRET_QUERY_PARAMS = frozenset({QUERY_TOKEN, "resume", "token"})
MIN_SECRET_BYTES = 32
MAX_CREDENTIAL_CHARS = 4096
#: How deep a token's claims may nest (ours are 2 deep: the scope list in the payload).
MAX_CLAIM_DEPTH = 8
#: The latest ``exp`` a token may carry (year 9999): a claim past it is malformed, not a
#: number to compare (10**400 is a valid JSON integer).
MAX_EXP = 253_402_300_799

_SUBJECT = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
_B64URL = re.compile(r"[A-Za-z0-9_-]*")


class AuthError(Exception):
    """A refused handshake: ``status`` (401 or 403) and a short reason for the body."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection is: what it may do and until when."""

    subject: str
    scopes: frozenset[str]
    kind: Literal["api_key", "token", "anonymous"]
    expires_at: float | None = None

    @property
    def limit_key(self) -> str:
        """What ``limits.max_connections_per_token`` counts: one API key, or every token
        minted for one subject."""
        return f"{self.kind}:{self.subject}"

    def require(self, scope: Scope) -> None:
        if scope not in self.scopes:
            raise AuthError(403, f"credential for '{self.subject}' lacks the '{scope}' scope")


ANONYMOUS = Principal("anonymous", frozenset(SCOPES), "anonymous")


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    sha256: bytes
    scopes: frozenset[str]


def _b64e(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64d(text: str) -> bytes:
    if not _B64URL.fullmatch(text):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: bytes, signed_part: str) -> bytes:
    return hmac.new(secret, signed_part.encode("ascii"), hashlib.sha256).digest()


def mint_token(
    secret: bytes, subject: str, ttl_s: float, scopes: Iterable[str], now: float | None = None
) -> str:
    """A signed token for ``subject`` valid ``ttl_s`` seconds from ``now``."""
    if not _SUBJECT.fullmatch(subject):
        raise ValueError("subject: 1-128 letters, digits or . _ : @ -")
    scope_list = sorted(set(scopes))
    unknown = [s for s in scope_list if s not in SCOPES]
    if unknown or not scope_list:
        raise ValueError(f"scopes must be some of {', '.join(SCOPES)}; got {scope_list}")
    if ttl_s <= 0:
        raise ValueError("ttl must be positive")
    issued = int(time.time() if now is None else now)
    payload = {"sub": subject, "iat": issued, "exp": issued + int(ttl_s), "scp": scope_list}
    body = _b64e(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
    signed = f"{TOKEN_PREFIX}.{body}"
    return f"{signed}.{_b64e(_sign(secret, signed))}"


def _nesting(value: object) -> int:
    """How deep lists and objects nest in a parsed JSON value (iterative: no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def verify_token(secret: bytes, token: str, now: float | None = None) -> Principal:
    """The principal a signed token names; :class:`AuthError` 401 when it is malformed,
    forged or expired (the signature is checked before anything in it is believed)."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        raise AuthError(401, "malformed token")
    signed = f"{parts[0]}.{parts[1]}"
    try:
        signature = _b64d(parts[2])
        expected = _sign(secret, signed)
        if not hmac.compare_digest(signature, expected):
            raise AuthError(401, "invalid token signature")
        payload = json.loads(_b64d(parts[1]))
    except (ValueError, binascii.Error, RecursionError):  # RecursionError: claims nested deep
        raise AuthError(401, "malformed token") from None
    if not isinstance(payload, dict) or _nesting(payload) > MAX_CLAIM_DEPTH:
        raise AuthError(401, "malformed token")
    sub, exp, scp = payload.get("sub"), payload.get("exp"), payload.get("scp")
    if (
        not isinstance(sub, str)
        or not isinstance(exp, int)
        or not 0 < exp <= MAX_EXP
        or not isinstance(scp, list)
        or not all(isinstance(s, str) for s in scp)
    ):
        raise AuthError(401, "malformed token")
    if (time.time() if now is None else now) >= exp:
        raise AuthError(401, "token expired")
    return Principal(sub, frozenset(s for s in scp if s in SCOPES), "token", float(exp))


def hash_api_key(key: str) -> str:
    """The hex SHA-256 that ``auth.api_keys[].sha256`` holds for ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


class Authenticator:
    """Checks a presented credential against the configured keys and the token secret."""

    def __init__(self, api_keys: Sequence[ApiKey], token_secret: bytes | None) -> None:
        self.api_keys = list(api_keys)
        self.token_secret = token_secret

    def authenticate(self, credential: str | None, now: float | None = None) -> Principal:
        if not credential:
            raise AuthError(401, "credentials required (Authorization: Bearer, or a token)")
        if len(credential) > MAX_CREDENTIAL_CHARS:
            raise AuthError(401, "credential too long")
        if credential.startswith(TOKEN_PREFIX + "."):
            if self.token_secret is None:
                raise AuthError(401, "this server accepts no signed tokens")
            return verify_token(self.token_secret, credential, now)
        digest = hashlib.sha256(credential.encode()).digest()
        found: ApiKey | None = None
        for key in self.api_keys:  # every key compared: no early exit to time
            if hmac.compare_digest(digest, key.sha256):
                found = key
        if found is None:
            raise AuthError(401, "invalid credentials")
        return Principal(found.name, found.scopes, "api_key")


def read_token_secret(file: Path | None, env_name: str, environ: Mapping[str, str]) -> bytes | None:
    """The HMAC secret: the file's contents (stripped) if a file is named, else the
    environment variable; None if neither is set. Too short a secret stops start-up."""
    if file is not None:
        try:
            value = file.read_bytes().strip()
        except OSError as e:
            raise ConfigError(f"cannot read auth.token_secret_file {file}: {e.strerror}") from e
        where = f"auth.token_secret_file {file}"
    else:
        text = environ.get(env_name, "")
        if not text:
            return None
        value = text.strip().encode()
        where = f"the {env_name} environment variable"
    if len(value) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"the token secret in {where} is {len(value)} bytes; at least {MIN_SECRET_BYTES} "
            "are needed (edge-vision token --new-secret prints one)"
        )
    return value


# -- where credentials come from -------------------------------------------------------


def offered_subprotocols(header: str) -> list[str]:
    """``Sec-WebSocket-Protocol`` entries as the client listed them (RFC 6455 4.1)."""
    return [p.strip() for p in header.split(",") if p.strip()]


@dataclass(frozen=True, slots=True)
class Presented:
    """What a handshake carries: the credential and where it was, the resume token if
    the client sent it as a subprotocol entry, and the real subprotocols offered."""

    credential: str | None
    source: Literal["header", "subprotocol", "query", "none"]
    resume_token: str | None
    protocols: tuple[str, ...]


def presented(headers: Mapping[str, str], query: Mapping[str, str]) -> Presented:
    """Take apart one handshake's credential-bearing parts (no checking yet)."""
    entries = offered_subprotocols(headers.get("Sec-WebSocket-Protocol", ""))
    entry_token = next((e[len(TOKEN_ENTRY) :] for e in entries if e.startswith(TOKEN_ENTRY)), None)
    resume = next((e[len(RESUME_ENTRY) :] for e in entries if e.startswith(RESUME_ENTRY)), None)
    real = tuple(e for e in entries if not e.startswith((TOKEN_ENTRY, RESUME_ENTRY)))
    scheme, _, value = headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return Presented(value.strip(), "header", resume, real)
    if entry_token:
        return Presented(entry_token, "subprotocol", resume, real)
    if query.get(QUERY_TOKEN):
        return Presented(query[QUERY_TOKEN], "query", resume, real)
    return Presented(None, "none", resume, real)


def origin_allowed(origin: str | None, host: str, allowed: Iterable[str]) -> bool:
    """Cross-site WebSocket hijacking defence (RFC 6455 section 10.2).

    No ``Origin`` (replay, camera boxes: not a browser) passes; the credential decides.
    A browser's ``Origin`` passes when its host:port is the request's own ``Host`` (the
    page this server serves) or it is listed in ``allowed`` (``"*"`` allows any)."""
    if origin is None:
        return True
    allowed = list(allowed)
    if "*" in allowed:
        return True
    norm = origin.strip().rstrip("/").lower()
    if norm in (a.strip().rstrip("/").lower() for a in allowed):
        return True
    parts = urlsplit(norm)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    host = host.strip().lower()
    if parts.netloc == host:
        return True
    # A proxy that forwards ``Host: $host`` (nginx) drops the port: then the host name
    # alone decides, as a page on another port of the same host is the same site anyway.
    return ":" not in host.rsplit("]", 1)[-1] and parts.hostname == host.strip("[]")


# Credentials by their form, whatever surrounds them (a header, a query, a Python repr of
# the bytes with \x00 escapes, a traceback). Each keeps its first group and loses the rest.
_BEARER = re.compile(
    r"(bearer)(?:[\s:=\x00-\x1f]|\\x[0-9a-f]{2}|\\[trnv0])*"
    r"(?:[^\s\"',;\\]|\\x[0-9a-f]{2}|\\[trnv0])+",
    re.IGNORECASE,
)
_AUTHORIZATION = re.compile(r"(authorization[\"']?\s*[:=]?\s*[\"']?)([^\r\n\"']*)", re.IGNORECASE)
_FORMS = re.compile(
    r"(\b(?:access_token|token|resume|resume_token|admin_token|token_secret|password)"
    r"[\"']?\s*[=:]\s*[\"']?)(?!null\b|none\b|~|REDACTED)[^&\s\"',}]+"
    r"|(edge-vision\.(?:token|resume)\.)[^\s,\"']+"
    r"|(\bev1\.)[A-Za-z0-9_-]{4,}(?:\.[A-Za-z0-9_-]*)?"
    r"|(\bevk_)[A-Za-z0-9_-]{8,}"
    r"|(://[^/@\s:\"']*:)[^@\s/\"']+(?=@)",
    re.IGNORECASE,
)
#: Shortest secret redacted by its value (a shorter one would redact ordinary words).
MIN_REDACTED_VALUE = 8
_values_lock = threading.Lock()
_SECRET_VALUES: frozenset[str] = frozenset()


def redact_values(values: Iterable[str | bytes | None]) -> None:
    """Redact these secrets by their value from now on (the token secret and
    ``server.admin_token``: held in clear, and of no recognisable form). Values shorter
    than :data:`MIN_REDACTED_VALUE` characters are not taken."""
    global _SECRET_VALUES
    texts = {v.decode(errors="replace") if isinstance(v, bytes) else v for v in values if v}
    with _values_lock:
        _SECRET_VALUES = _SECRET_VALUES | {t for t in texts if len(t) >= MIN_REDACTED_VALUE}


def _redact_authorization(m: re.Match[str]) -> str:
    value = m.group(2)
    if not value.strip() or value.lower().startswith("bearer redacted"):
        return m.group(0)
    return m.group(1) + "REDACTED"


def redact_text(text: str) -> str:
    """``text`` with every credential, resume token and held secret replaced (see the
    module docstring)."""
    for value in sorted(_SECRET_VALUES, key=len, reverse=True):
        if value in text:
            text = text.replace(value, "REDACTED")
    text = _BEARER.sub(lambda m: m.group(1) + " REDACTED", text)
    text = _FORMS.sub(lambda m: next(g for g in m.groups() if g is not None) + "REDACTED", text)
    return _AUTHORIZATION.sub(_redact_authorization, text)


class RedactSecrets(logging.Filter):
    """A handler filter: no log line, message or traceback, carries a credential, whatever
    library wrote it (aiohttp quotes a malformed request line at debug level, say)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


class QuietMalformedRequests(logging.Filter):
    """A filter on aiohttp's server logger: a request its HTTP parser refused (the peer's
    fault, before anyone authenticated it) becomes one line, without the request's bytes
    or a traceback, and at most one such line per ``every_s`` seconds, saying how many
    came since the last (a flood of them costs a few lines, not one each)."""

    def __init__(self, every_s: float = 10.0, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self._clock = clock
        self._last: float | None = None
        self._since = 0  # refused requests not logged since the last line
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last < self.every_s:
                self._since += 1
                return False
            more, self._since, self._last = self._since, 0, now
        # aiohttp's message is a reason, then the offending bytes quoted: keep the reason.
        reason = str(exc.message).split("\n", 1)[0].rstrip(": ") or type(exc).__name__
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.msg = (
            "malformed HTTP request from %s answered %s (%s); %d more since the last such "
            "line; at most one line every %g s"
        )
        record.args = (peer, exc.code, reason, more, self.every_s)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        return True


def install_log_redaction(
    logger: logging.Logger | None = None, secrets: Iterable[str | bytes | None] = ()
) -> None:
    """Put :class:`RedactSecrets` on every handler of ``logger`` (the root's by default),
    redact ``secrets`` by value (:func:`redact_values`), and quiet malformed requests on
    aiohttp's server logger (:class:`QuietMalformedRequests`)."""
    redact_values(secrets)
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactSecrets) for f in handler.filters):
            handler.addFilter(RedactSecrets())
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, QuietMalformedRequests) for f in server.filters):
        server.addFilter(QuietMalformedRequests())
