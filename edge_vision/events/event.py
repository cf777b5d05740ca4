"""An event as JSON: what the session's WebSocket (``event`` message, protocol 3) and every
sink receive (docs/events.md, "What an event says").

Fields: ``event_id`` (unique, made once: a sink's retries and a restart's redelivery carry
the same id, so a consumer can drop a repeat), ``rule``, ``on``, ``node``, ``session``,
``frame_id`` and ``ts`` (the frame's own, as the client sent them; for ``leave``, the last
frame the track matched in), ``at`` (the server's clock when the rule fired, Unix
seconds), ``track``, ``class`` and ``label``, ``score``, ``box`` (frame pixels), ``text``
(null where not read), ``zone`` (the rule's zone, or null) and ``zones`` (every zone the
anchor was in); ``line`` and ``direction`` for ``cross``, ``dwell_s`` for ``dwell``; and,
for the sinks of a rule with ``crop: true``, ``crop``: a base64 JPEG of the box.
"""

from __future__ import annotations

import uuid
from typing import Any

from .rules import Firing


def new_event_id() -> str:
    """A random 128-bit id (UUID 4, 32 hex digits)."""
    return uuid.uuid4().hex


def event_body(firing: Firing, node: str, session: str) -> dict[str, Any]:
    """The event a rule raised, as plain JSON values (without ``crop``)."""
    obs, rule = firing.obs, firing.rule
    body: dict[str, Any] = {
        "event_id": new_event_id(),
        "rule": rule.name,
        "on": rule.on,
        "node": node,
        "session": session,
        "frame_id": obs.frame_id,
        "ts": obs.ts,
        "at": round(firing.at, 3),
        "track": obs.track,
        "class": obs.cls,
        "label": obs.label,
        "score": round(obs.score, 4),
        "box": [round(v, 2) for v in obs.box],
        "text": obs.text,
        "zone": rule.zone,
        "zones": list(obs.zones),
    }
    body.update(firing.extra)
    return body
