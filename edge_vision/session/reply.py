"""Stage 8, reply: server messages serialised to JSON text. Sans-I/O.

Shapes (docs/protocol.md): ``hello``, ``result``, ``error``, ``settings``, ``pong``,
``closing`` and, since protocol 3, ``event``.
A result echoes the client's ``id`` and ``ts`` unchanged; boxes are in original-frame
pixels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from ..common.messages import FrameId
from ..errors import ClientError
from ..frames.results import FrameResult
from .receive import PROTOCOL_VERSION, SUPPORTED_VERSIONS


def _dumps(obj: Mapping[str, Any]) -> str:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def hello(
    *,
    session_id: str,
    resume_token: str,
    resumed: bool,
    model: str,
    labels: list[str],
    engine: Mapping[str, Any],
    mode: str,
    settings: Mapping[str, Any],
    limits: Mapping[str, Any],
    counters: Mapping[str, int],
    node_id: str,
    protocol: int = PROTOCOL_VERSION,
    features: Sequence[str] = (),
    events: Mapping[str, Any] | None = None,
) -> str:
    """``events`` (since protocol 3, optional): the node's own zones, lines and anchor."""
    return _dumps(
        {
            "type": "hello",
            "protocol": protocol,  # the version this connection speaks (versions.py)
            "protocols": list(SUPPORTED_VERSIONS),  # since protocol 2; also sent to v1
            "features": list(features),  # since protocol 2; also sent to v1
            "session_id": session_id,
            "resume_token": resume_token,
            "resumed": resumed,
            "node": node_id,
            "model": model,
            "labels": labels,
            "engine": dict(engine),
            "mode": mode,
            "settings": dict(settings),
            "limits": dict(limits),
            "counters": dict(counters),
            **({"events": dict(events)} if events is not None else {}),
        }
    )


def result(
    res: FrameResult,
    label: Callable[[int], str],
    dropped: int,
    tracks: Sequence[int] | None = None,
    zones: Sequence[Sequence[str]] | None = None,
    *,
    texts: bool = True,
) -> str:
    """``tracks``: one track id per detection (track.py), sent as each one's ``track``;
    ``zones`` (since protocol 3): the zones each one's anchor lies in; ``texts``: send
    the text read in each box, when it was read (off: read for the session's rules only)."""
    dets = [
        {
            "box": [
                round(float(x1), 2),
                round(float(y1), 2),
                round(float(x2), 2),
                round(float(y2), 2),
            ],
            "score": round(float(score), 4),
            "class": int(cls),
            "label": label(int(cls)),
        }
        for x1, y1, x2, y2, score, cls in res.detections.tolist()
    ]
    if tracks is not None:
        for d, track in zip(dets, tracks, strict=True):
            d["track"] = int(track)
    if zones is not None:
        for d, names in zip(dets, zones, strict=True):
            d["zones"] = list(names)
    if res.texts is not None and texts:  # since protocol 2, a session reading text (read.py)
        for d, read in zip(dets, res.texts, strict=True):
            d["text"] = read.text if read is not None else None
            d["text_score"] = round(read.score, 4) if read is not None else None
    timing = {k: (int(v) if k == "batch_size" else round(v, 3)) for k, v in res.timing.items()}
    if res.texts is not None and not texts:  # read for rules only: the session sees no read
        timing.pop("read_ms", None)
    return _dumps(
        {
            "type": "result",
            "id": res.frame.id,
            "ts": res.frame.ts,
            "width": res.width,
            "height": res.height,
            "detections": dets,
            "timing": timing,
            "dropped": dropped,
        }
    )


def error(code: str, message: str, frame_id: FrameId | None = None) -> str:
    body: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if frame_id is not None:
        body["id"] = frame_id
    return _dumps(body)


def client_error(err: ClientError) -> str:
    fid = err.frame_id if isinstance(err.frame_id, int | str) else None
    return error(err.code, err.message, fid)


def settings(
    mode: str,
    confidence: float,
    classes: list[int] | None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """``extra``: the settings since protocol 2 (``track``, ``input_size``), for clients
    that speak it."""
    body: dict[str, Any] = {
        "type": "settings",
        "mode": mode,
        "confidence": confidence,
        "classes": classes,
        **(extra or {}),
    }
    return _dumps(body)


def event(body: Mapping[str, Any]) -> str:
    """Since protocol 3: an event one of the session's rules raised (docs/events.md)."""
    return _dumps({"type": "event", **body})


def pong(payload: Any) -> str:
    """The echo of a ``ping``. A payload the encoder cannot write back (orjson stops at
    254 levels of nesting; the parser accepts 1024) is the client's error, ``bad_message``,
    not the server's."""
    try:
        return _dumps({"type": "pong", "payload": payload})
    except orjson.JSONEncodeError as e:
        raise ClientError("bad_message", f"ping payload cannot be echoed: {e}") from None


def closing(resume_token: str) -> str:
    """Sent before a server-initiated 1001 close: reconnect and resume with this token."""
    return _dumps({"type": "closing", "reason": "shutdown", "resume_token": resume_token})
