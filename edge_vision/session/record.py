"""A client session: identity, resume token, settings and counters. Pure data.

A session outlives its WebSocket: a client that reconnects with the resume token from
its ``hello`` (to this node or another that shares the state store) gets the same id,
settings and counters back (docs/protocol.md, "Connecting"; docs/state.md, "Resume").
The token is ``<session id>.<secret>``. Since record schema 2 the state store keeps only
the secret's SHA-256 (``secret_sha256``), compared in constant time: someone who can read
Redis cannot resume anyone's session. A node still reads schema-1 records (plain
``secret``), so sessions written before an upgrade resume; the secret is 144 random bits,
so an unsalted fast hash is enough (nothing to brute-force).

The session owns its tracker (:class:`~edge_vision.frames.track.Tracker`): the record
carries its state (``tracks``), so a resumed session continues its track ids and keeps
the tracks it had, on this node or another. Since protocol 3 it also carries the session's
own zones, lines and rules (``events``, from its ``settings``) and what its rules remember
of its tracks (``rules``: plain JSON that edge_vision.events reads), so a resume raises no
event twice.

``epoch`` orders the holders of one session: it starts at 1 and grows by one each time a
connection resumes the session. The state store refuses a write that carries an older
epoch than the one it holds, so a node that lost a session to a newer connection (its
own socket half-open, or its final write delayed by a Redis outage) can never overwrite
the newer holder's record (docs/state.md, "Who wins").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..common.settings import FrameSettings, Mode
from ..frames.track import Tracker

log = logging.getLogger(__name__)

COUNTERS = ("received", "answered", "dropped", "rejected")

_SESSION_ID = re.compile(r"[0-9a-f]{16}")
_SECRET = re.compile(r"[A-Za-z0-9_-]{16,64}")
MAX_USER_AGENT = 256
MAX_FORWARDED_FOR = 256
#: Version of the session record's fields (docs/state.md); 1 held the secret in plain text.
RECORD_SCHEMA = 2


def secret_digest(secret: str) -> str:
    """What the state store holds of a resume secret: its hex SHA-256."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class Session:
    id: str
    # The resume secret in clear: known to the node that issued it, and to a node the
    # client resumed on (it presented it); empty for a copy read from the store.
    secret: str
    node_id: str
    mode: Mode
    confidence: float
    classes: list[int] | None = None
    track: bool = True  # since protocol 2: results carry track ids (track.py)
    input_size: int | None = None  # since protocol 2: None is the server's model.input_size
    read: bool = False  # since protocol 2: detections carry the text read in them (read.py)
    client: str = ""
    # What the proxy in front (nginx) says the client's address is: shown to admins as
    # reported, never used for a decision, because any client can send the header.
    forwarded_for: str = ""
    user_agent: str = ""
    epoch: int = 1
    connected: bool = True
    created_at: float = field(default_factory=time.time)
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    received: int = 0
    answered: int = 0
    dropped: int = 0
    rejected: int = 0
    secret_sha256: str = ""
    # The session's one tracker (track ids, and the tracks reading keeps its texts on).
    tracker: Tracker = field(default_factory=Tracker, compare=False, repr=False)
    # Since protocol 3: the session's own zones, lines and rules (settings), plain JSON.
    events: dict[str, Any] = field(default_factory=dict)
    # What its rules remember of its tracks (edge_vision.events), plain JSON; while a
    # connection runs them, ``rule_memory_source`` gives the current memory instead.
    rule_memory: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    rule_memory_source: Callable[[], dict[str, Any]] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if not self.secret_sha256 and self.secret:
            self.secret_sha256 = secret_digest(self.secret)

    @property
    def resume_token(self) -> str:
        return f"{self.id}.{self.secret}"

    def use_secret(self, secret: str) -> None:
        """From now on only ``secret`` resumes this session (its token rotated: since
        protocol 3 a resume hands out a new one, :func:`new_secret`)."""
        self.secret = secret
        self.secret_sha256 = secret_digest(secret)

    def frame_settings(self) -> FrameSettings:
        classes = frozenset(self.classes) if self.classes is not None else None
        return FrameSettings(self.confidence, classes, self.input_size)

    def settings_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "confidence": self.confidence,
            "classes": self.classes,
            "track": self.track,
            "input_size": self.input_size,
            "read": self.read,
        }

    def events_settings(self) -> dict[str, Any]:
        """The session's own ``zones``, ``lines`` and ``rules`` (since protocol 3)."""
        return {k: self.events.get(k, [] if k == "rules" else {}) for k in _EVENT_KEYS}

    def memory(self) -> dict[str, Any]:
        """What the session's rules remember now (see ``rule_memory``)."""
        source = self.rule_memory_source
        return source() if source is not None else self.rule_memory

    def counters(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in COUNTERS}

    def to_record(self) -> dict[str, str]:
        """Flat string mapping, the shape a Redis hash holds (field list: docs/state.md)."""
        return {
            "schema": str(RECORD_SCHEMA),
            "id": self.id,
            "secret_sha256": self.secret_sha256,
            "node": self.node_id,
            "epoch": str(self.epoch),
            "mode": self.mode,
            "confidence": repr(self.confidence),
            "classes": json.dumps(self.classes),
            "track": "1" if self.track else "0",
            "input_size": str(self.input_size or ""),
            "read": "1" if self.read else "0",
            "client": self.client,
            "forwarded_for": self.forwarded_for,
            "user_agent": self.user_agent,
            "connected": "1" if self.connected else "0",
            "created_at": repr(self.created_at),
            "connected_at": repr(self.connected_at),
            "last_seen": repr(self.last_seen),
            **{c: str(getattr(self, c)) for c in COUNTERS},
            "tracks": self.tracks_record(),
            "events": json.dumps(self.events, separators=(",", ":")) if self.events else "",
            "rules": _json_or_empty(self.memory()),
        }

    def tracks_record(self) -> str:
        """The tracker's state as the record holds it: JSON, ages relative to ``at``, the
        wall clock when it was written (another node's process clock is not ours)."""
        state = self.tracker.to_state(time.perf_counter())
        return json.dumps({"at": round(time.time(), 3), **state}, separators=(",", ":"))

    @classmethod
    def from_record(cls, rec: dict[str, str]) -> Session:
        """The inverse of :meth:`to_record`; ``ValueError`` when the record is unusable
        (written by something else, or half-expired)."""
        try:
            if "secret_sha256" in rec:
                digest = rec["secret_sha256"]
            else:  # schema 1, written before the store held only hashes
                digest = secret_digest(rec["secret"])
            mode: Mode = "every" if rec.get("mode") == "every" else "latest"
            classes = json.loads(rec.get("classes") or "null")
            connected_at = float(rec.get("connected_at", "0"))
            return cls(
                id=rec["id"],
                secret="",
                secret_sha256=digest,
                node_id=rec.get("node", ""),
                mode=mode,
                confidence=float(rec.get("confidence", "0.5")),
                classes=[int(c) for c in classes] if isinstance(classes, list) else None,
                track=rec.get("track", "1") == "1",
                input_size=int(rec["input_size"]) if rec.get("input_size") else None,
                read=rec.get("read", "0") == "1",
                client=rec.get("client", ""),
                forwarded_for=rec.get("forwarded_for", ""),
                user_agent=rec.get("user_agent", ""),
                epoch=int(rec.get("epoch", "1")),
                connected=rec.get("connected") == "1",
                created_at=float(rec.get("created_at", connected_at)),
                connected_at=connected_at,
                last_seen=float(rec.get("last_seen", "0")),
                **{c: int(rec.get(c, "0")) for c in COUNTERS},
                tracker=_tracker_from(rec.get("tracks")),
                events=_json_object(rec.get("events")),
                rule_memory=_json_object(rec.get("rules")),
                rule_memory_source=None,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a session record: {e}") from None

    def public(self) -> dict[str, Any]:
        """What the admin API shows (never the secret), with native JSON types."""
        return {
            "id": self.id,
            "node": self.node_id,
            "epoch": self.epoch,
            **self.settings_dict(),
            "client": self.client,
            "forwarded_for": self.forwarded_for,
            "user_agent": self.user_agent,
            "connected": self.connected,
            "created_at": self.created_at,
            "connected_at": self.connected_at,
            "last_seen": self.last_seen,
            **self.counters(),
            **({"events": self.events} if self.events else {}),
        }


_EVENT_KEYS = ("zones", "lines", "rules")


def _json_or_empty(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":")) if value else ""


def _json_object(text: str | None) -> dict[str, Any]:
    """A JSON object a record field holds; {} for none (ValueError: not an object)."""
    if not text:
        return {}
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("a JSON object was expected")
    return value


def _tracker_from(text: str | None) -> Tracker:
    """The tracker a record's ``tracks`` holds; a fresh one when it holds none (a record
    written before tracks were kept) or one this version cannot read (said in the log)."""
    if not text:
        return Tracker()
    try:
        state = json.loads(text)
        stored_s = time.time() - float(state["at"])
        return Tracker.from_state(state, time.perf_counter(), stored_s)
    except (KeyError, TypeError, ValueError) as e:  # json's errors are ValueErrors
        log.warning("a session record's tracks cannot be read (%s); its ids start afresh", e)
        return Tracker()


def new_secret() -> str:
    """A resume secret: 144 random bits, URL-safe."""
    return secrets.token_urlsafe(18)


def new_session(
    node_id: str,
    mode: Mode,
    confidence: float,
    client: str,
    agent: str,
    forwarded_for: str = "",
) -> Session:
    return Session(
        id=secrets.token_hex(8),
        secret=new_secret(),
        node_id=node_id,
        mode=mode,
        confidence=confidence,
        client=client,
        forwarded_for=forwarded_for[:MAX_FORWARDED_FOR],
        user_agent=agent[:MAX_USER_AGENT],
    )


def split_resume_token(token: str) -> tuple[str, str] | None:
    """``(session id, secret)`` from a token this server could have issued, else None.

    The id becomes part of a store key, so only the shape :func:`new_session` makes is
    accepted."""
    sid, sep, secret = token.partition(".")
    if not sep or not _SESSION_ID.fullmatch(sid) or not _SECRET.fullmatch(secret):
        return None
    return sid, secret


def token_matches(session: Session, secret: str) -> bool:
    """Constant-time: does ``secret`` hash to what the session holds?"""
    return hmac.compare_digest(session.secret_sha256.encode(), secret_digest(secret).encode())
