"""A client session: identity, resume token, settings and counters. Pure data.

A session outlives its WebSocket: a client that reconnects with the resume token from
its ``hello`` (to this node or another that shares the state store) gets the same id,
settings and counters back. The token is ``<session id>.<secret>``; the secret is kept in
the state store and compared in constant time.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from .pipeline import FrameSettings

Mode = Literal["latest", "every"]
COUNTERS = ("received", "answered", "dropped", "rejected")


@dataclass
class Session:
    id: str
    secret: str
    node_id: str
    mode: Mode
    confidence: float
    classes: list[int] | None = None
    client: str = ""
    user_agent: str = ""
    connected: bool = True
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    received: int = 0
    answered: int = 0
    dropped: int = 0
    rejected: int = 0

    @property
    def resume_token(self) -> str:
        return f"{self.id}.{self.secret}"

    def frame_settings(self) -> FrameSettings:
        classes = frozenset(self.classes) if self.classes is not None else None
        return FrameSettings(self.confidence, classes)

    def settings_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "confidence": self.confidence, "classes": self.classes}

    def counters(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in COUNTERS}

    def to_record(self) -> dict[str, str]:
        """Flat string mapping, the shape a Redis hash holds."""
        return {
            "id": self.id,
            "secret": self.secret,
            "node": self.node_id,
            "mode": self.mode,
            "confidence": repr(self.confidence),
            "classes": json.dumps(self.classes),
            "client": self.client,
            "user_agent": self.user_agent,
            "connected": "1" if self.connected else "0",
            "connected_at": repr(self.connected_at),
            "last_seen": repr(self.last_seen),
            **{c: str(getattr(self, c)) for c in COUNTERS},
        }

    @classmethod
    def from_record(cls, rec: dict[str, str]) -> Session:
        mode: Mode = "every" if rec.get("mode") == "every" else "latest"
        classes = json.loads(rec.get("classes") or "null")
        return cls(
            id=rec["id"],
            secret=rec["secret"],
            node_id=rec.get("node", ""),
            mode=mode,
            confidence=float(rec.get("confidence", "0.5")),
            classes=[int(c) for c in classes] if isinstance(classes, list) else None,
            client=rec.get("client", ""),
            user_agent=rec.get("user_agent", ""),
            connected=rec.get("connected") == "1",
            connected_at=float(rec.get("connected_at", "0")),
            last_seen=float(rec.get("last_seen", "0")),
            **{c: int(rec.get(c, "0")) for c in COUNTERS},
        )

    def public(self) -> dict[str, Any]:
        """What the admin API shows (never the secret)."""
        rec: dict[str, Any] = {k: v for k, v in self.to_record().items() if k != "secret"}
        rec.update(self.counters())
        rec["classes"] = self.classes
        rec["confidence"] = self.confidence
        rec["connected"] = self.connected
        rec["connected_at"] = self.connected_at
        rec["last_seen"] = self.last_seen
        return rec


def new_session(node_id: str, mode: Mode, confidence: float, client: str, agent: str) -> Session:
    return Session(
        id=secrets.token_hex(8),
        secret=secrets.token_urlsafe(18),
        node_id=node_id,
        mode=mode,
        confidence=confidence,
        client=client,
        user_agent=agent[:256],
    )


def split_resume_token(token: str) -> tuple[str, str] | None:
    sid, sep, secret = token.partition(".")
    if not sep or not sid or not secret or len(token) > 256:
        return None
    return sid, secret


def token_matches(session: Session, secret: str) -> bool:
    return hmac.compare_digest(session.secret.encode(), secret.encode())
