"""Protocol versions a node serves, and every difference between them, in one table. Sans-I/O.

A node serves the current version (:data:`~edge_vision.session.receive.PROTOCOL_VERSION`) and the
ones before it (:data:`~edge_vision.session.receive.SUPPORTED_VERSIONS`), so a cluster can be
upgraded node by node while old and new clients stream (docs/protocol.md, "Versions").

A client picks its version before the upgrade, with ``?protocol=N`` on the ``/ws`` URL;
without it the connection speaks the current version. Any other value is refused with
HTTP 400 and a JSON body listing the versions served (:func:`refusal`).

Each connection holds its :class:`ProtocolVersion`. Code that changes what a client sees
(a field, a close code, a handshake element) asks that object instead of comparing version
numbers itself: add a flag or a mapping to :class:`ProtocolVersion`, set it for each row
of :data:`PROTOCOLS`, document the row in docs/protocol.md, and test the previous version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from ..common.close_codes import CloseCode
from ..errors import UnsupportedProtocol
from .receive import PROTOCOL_VERSION, SUPPORTED_VERSIONS

#: Optional features every node of this release has; hello's ``features`` lists them plus
#: those a node's config turns on (the server appends, e.g. ``auth``, ``track``).
BASE_FEATURES: Final[tuple[str, ...]] = ("binary_frames", "resume")

#: Application close codes (RFC 6455 section 7.4.2: 4000-4999 are the application's) are
#: protocol 2; a protocol 1 client knows 1000, 1001, 1008 and 1009 only.
_APP_CODES = range(4000, 5000)


@dataclass(frozen=True, slots=True)
class ProtocolVersion:
    """What one protocol version's clients get where versions differ.

    ``close_codes``: a close code the server means to send → the code this version's client
    receives instead (absent: the same code). ``app_close_fallback``: for a version that
    predates application close codes, the code sent for any 4000-4999 code not mapped in
    ``close_codes``; None when the version knows them. ``track_ids``: detections in a
    ``result`` carry ``track``. ``text_reading``: with ``settings.read`` on, detections
    carry the ``text`` read in them (and ``timing.read_ms``). ``settings_extras``: the
    ``settings`` answer carries the session's ``track``, ``input_size`` and ``read``.
    ``events`` (protocol 3): ``event`` messages, detections' ``zones``, and the session's
    own ``zones``, ``lines`` and ``rules`` in ``settings`` (docs/events.md).
    ``rotating_resume_tokens`` (protocol 3): a resumed session's ``hello`` carries a new
    resume token and the one it was resumed with stops working (a copied token serves
    once); versions before it keep the token they had, as they were promised.
    """

    number: int
    close_codes: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    app_close_fallback: int | None = None
    track_ids: bool = True
    text_reading: bool = True
    settings_extras: bool = True
    events: bool = True
    rotating_resume_tokens: bool = True

    def close_code(self, code: int) -> int:
        """The close code to send this version's client for the server's ``code``."""
        mapped = self.close_codes.get(code)
        if mapped is not None:
            return mapped
        if self.app_close_fallback is not None and code in _APP_CODES:
            return self.app_close_fallback
        return code

    def at_least(self, number: int) -> bool:
        """This connection speaks ``number`` or later (for "since protocol N" behaviour)."""
        return self.number >= number


#: The one table of version differences. Protocol 1 is the protocol as of 2026-11; what
#: protocol 2 added or changed that a v1 client must not see is mapped back here.
PROTOCOLS: Final[Mapping[int, ProtocolVersion]] = MappingProxyType(
    {
        1: ProtocolVersion(
            1,
            # v1 closed an idle connection with 1001, as for a shutdown (but without a
            # closing message).
            close_codes=MappingProxyType({CloseCode.IDLE_TIMEOUT: CloseCode.GOING_AWAY}),
            # v1 documented one code for every other policy close: 1008 (docs/protocol.md).
            app_close_fallback=1008,
            # v1 results and settings answers have exactly the fields v1 documented.
            track_ids=False,
            text_reading=False,
            settings_extras=False,
            events=False,
            rotating_resume_tokens=False,
        ),
        # v2 knows no events: no event messages, no zones in results or settings.
        # ... and keeps its resume token across resumes.
        2: ProtocolVersion(2, events=False, rotating_resume_tokens=False),
        3: ProtocolVersion(3),
    }
)

if tuple(sorted(PROTOCOLS)) != SUPPORTED_VERSIONS:  # a release that forgot a row
    raise RuntimeError(f"PROTOCOLS rows {sorted(PROTOCOLS)} != SUPPORTED_VERSIONS")

CURRENT: Final[ProtocolVersion] = PROTOCOLS[PROTOCOL_VERSION]


def choose_protocol(asked: str | None) -> ProtocolVersion:
    """The version a connection speaks, from the ``protocol`` query value (None: absent).

    Raises :class:`~edge_vision.errors.UnsupportedProtocol` for anything but a served
    version written as a plain decimal integer."""
    if asked is None:
        return CURRENT
    if asked.isascii() and asked.isdigit() and len(asked) <= 4:
        version = PROTOCOLS.get(int(asked))
        if version is not None:
            return version
    raise UnsupportedProtocol(asked[:20], SUPPORTED_VERSIONS)


def refusal(err: UnsupportedProtocol) -> dict[str, Any]:
    """The JSON body of the HTTP 400 that refuses an unsupported version before the upgrade."""
    return {
        "error": "unsupported_protocol",
        "message": str(err),
        "protocols": list(err.supported),
        "protocol": PROTOCOL_VERSION,
    }


# -- the handshake's names (docs/protocol.md, "Authentication") --------------------------

#: The one real subprotocol; a browser that offers credential entries must offer it too,
#: because a browser fails a handshake whose answer names none of the offered entries.
SUBPROTOCOL = "edge-vision"
TOKEN_ENTRY = "edge-vision.token."
RESUME_ENTRY = "edge-vision.resume."
QUERY_TOKEN = "access_token"
