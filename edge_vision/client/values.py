"""The values the client hands you: the session's hello and settings, results and
errors, the books of what became of the frames sent (docs/client.md, docs/protocol.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from ..common.settings import Mode

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray


Wire = Literal["binary", "json"]
FrameId = int | str
#: Why a frame went unanswered: ``latest``, a later frame was answered first (the server's
#: latest-wins dropped it); ``closed``, the connection closed while it was in flight.
DropCause = Literal["latest", "closed"]


@dataclass(frozen=True, slots=True)
class Settings:
    """A session's effective settings (docs/protocol.md, ``settings``)."""

    mode: Mode
    confidence: float
    classes: tuple[int, ...] | None
    # Since protocol 2; None where the node or the connection's version has no such setting.
    track: bool | None = None
    input_size: int | None = None  # None also: the node's own limits.input_size
    read: bool | None = None
    # Since protocol 3: the session's own zones, lines and rules (docs/events.md).
    zones: Mapping[str, Any] | None = None
    lines: Mapping[str, Any] | None = None
    rules: tuple[Mapping[str, Any], ...] | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Settings:
        classes = obj.get("classes")
        rules = obj.get("rules")
        return cls(
            obj["mode"],
            float(obj["confidence"]),
            None if classes is None else tuple(classes),
            obj.get("track"),
            obj.get("input_size"),
            obj.get("read"),
            obj.get("zones"),
            obj.get("lines"),
            None if rules is None else tuple(rules),
        )


@dataclass(frozen=True, slots=True)
class Counters:
    """A session's books: received = answered + dropped + rejected (+ in flight)."""

    received: int = 0
    answered: int = 0
    dropped: int = 0
    rejected: int = 0


_COUNTERS = frozenset(f.name for f in fields(Counters))


@dataclass(slots=True)
class Books:
    """What became of the frames this client sent, across resumes (docs/client.md, "Books"):
    sent = answered + dropped + rejected + lost + :attr:`pending`.

    ``dropped``: a later frame was answered first (latest-wins; the server's ``dropped``
    counts the same frames). ``lost``: in flight when a connection closed (the server counts
    these as dropped too). ``unmatched``: results for no frame waiting (a server that
    answered a frame twice)."""

    sent: int = 0
    answered: int = 0
    dropped: int = 0
    rejected: int = 0
    lost: int = 0
    unmatched: int = 0

    @property
    def pending(self) -> int:
        return self.sent - self.answered - self.dropped - self.rejected - self.lost


@dataclass(frozen=True, slots=True)
class Limits:
    """What the node accepts (hello ``limits``)."""

    max_message_bytes: int
    max_pixels: int
    input_size: int
    max_batch: int
    formats: tuple[str, ...]
    binary_frames: bool


@dataclass(frozen=True, slots=True)
class Hello:
    """The server's first message, typed; ``raw`` keeps every field (also new ones)."""

    protocol: int
    protocols: tuple[int, ...]
    features: frozenset[str]
    session_id: str
    resume_token: str
    resumed: bool
    node: str
    model: str
    labels: tuple[str, ...]
    engine: Mapping[str, Any]
    settings: Settings
    limits: Limits
    counters: Counters
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Hello:
        lim = obj.get("limits") or {}
        protocol = int(obj.get("protocol", 1))
        return cls(
            protocol=protocol,
            protocols=tuple(obj.get("protocols") or (protocol,)),
            # Nodes before protocol 2 announce no features; what they had is implied.
            features=frozenset(obj.get("features") or ("binary_frames", "resume")),
            session_id=str(obj["session_id"]),
            resume_token=str(obj["resume_token"]),
            resumed=bool(obj.get("resumed")),
            node=str(obj.get("node", "")),
            model=str(obj.get("model", "")),
            labels=tuple(obj.get("labels") or ()),
            engine=dict(obj.get("engine") or {}),
            settings=Settings.from_json(obj["settings"]),
            limits=Limits(
                max_message_bytes=int(lim.get("max_message_bytes", 0)),
                max_pixels=int(lim.get("max_pixels", 0)),
                input_size=int(lim.get("input_size", 0)),
                max_batch=int(lim.get("max_batch", 1)),
                formats=tuple(lim.get("formats") or ("jpeg", "png")),
                binary_frames=bool(lim.get("binary_frames", True)),
            ),
            counters=Counters(  # counters a newer node adds are in raw, not here
                **{k: int(v) for k, v in (obj.get("counters") or {}).items() if k in _COUNTERS}
            ),
            raw=dict(obj),
        )

    def label(self, class_id: int) -> str:
        return self.labels[class_id] if 0 <= class_id < len(self.labels) else str(class_id)


@dataclass(frozen=True, slots=True)
class Detection:
    """One box in the frame's own pixels (x right, y down)."""

    box: tuple[float, float, float, float]
    score: float
    class_id: int
    label: str
    track: int | None = None  # a track id, when the node tracks (feature "track")
    text: str | None = None  # the text read in the box, with settings read=True ("read")
    text_score: float | None = None
    zones: tuple[str, ...] = ()  # since protocol 3: the zones the box's anchor lies in


@dataclass(frozen=True, slots=True)
class Result:
    """The answer to one frame; ``raw`` keeps every field of the message."""

    id: FrameId
    ts: float | None
    width: int
    height: int
    detections: tuple[Detection, ...]
    timing: Mapping[str, float]
    dropped: int
    raw: Mapping[str, Any] = field(repr=False)
    #: ``time.perf_counter()`` when the answer arrived (for latencies; 0 if not received).
    received_at: float = field(default=0.0, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], received_at: float = 0.0) -> Result:
        dets = tuple(
            Detection(
                box=(
                    float(d["box"][0]),
                    float(d["box"][1]),
                    float(d["box"][2]),
                    float(d["box"][3]),
                ),
                score=float(d["score"]),
                class_id=int(d["class"]),
                label=str(d.get("label", d["class"])),
                track=d.get("track"),
                text=d.get("text"),
                text_score=d.get("text_score"),
                zones=tuple(d.get("zones") or ()),
            )
            for d in obj.get("detections") or ()
        )
        return cls(
            id=obj["id"],
            ts=obj.get("ts"),
            width=int(obj["width"]),
            height=int(obj["height"]),
            detections=dets,
            timing=dict(obj.get("timing") or {}),
            dropped=int(obj.get("dropped", 0)),
            raw=dict(obj),
            received_at=received_at,
        )


@dataclass(frozen=True, slots=True)
class FrameError:
    """An ``error`` message; ``id`` None when it could not be tied to a frame."""

    id: FrameId | None
    code: str
    message: str


Answer = Result | FrameError


@dataclass(frozen=True, slots=True)
class Event:
    """Since protocol 3: an event one of the session's rules raised (docs/events.md).
    ``event_id`` is unique and the same on every copy (the node's sinks get one too);
    ``frame_id`` and ``ts`` are the frame's, as sent; ``at`` the node's clock when the
    rule fired (Unix seconds); ``raw`` keeps every field (``line``, ``direction``,
    ``dwell_s`` for the kinds that have them)."""

    event_id: str
    rule: str
    on: str
    session: str
    node: str
    frame_id: FrameId | None
    ts: float | None
    at: float
    track: int
    class_id: int
    label: str
    score: float
    box: tuple[float, float, float, float]
    text: str | None
    zone: str | None
    zones: tuple[str, ...]
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Event:
        box = obj["box"]
        return cls(
            event_id=str(obj["event_id"]),
            rule=str(obj["rule"]),
            on=str(obj["on"]),
            session=str(obj.get("session", "")),
            node=str(obj.get("node", "")),
            frame_id=obj.get("frame_id"),
            ts=obj.get("ts"),
            at=float(obj.get("at") or 0.0),
            track=int(obj["track"]),
            class_id=int(obj["class"]),
            label=str(obj.get("label", obj["class"])),
            score=float(obj["score"]),
            box=(float(box[0]), float(box[1]), float(box[2]), float(box[3])),
            text=obj.get("text"),
            zone=obj.get("zone"),
            zones=tuple(obj.get("zones") or ()),
            raw=dict(obj),
        )


def jpeg_from_array(image: NDArray[np.uint8], quality: int = 85, colorspace: str = "RGB") -> bytes:
    """An ``(H, W, 3)`` uint8 array as JPEG bytes (simplejpeg; ``colorspace`` "RGB"/"BGR")."""
    import numpy as np
    import simplejpeg

    arr = np.ascontiguousarray(image)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise TypeError(f"expected an (H, W, 3) uint8 array, got {arr.dtype} {arr.shape}")
    data: bytes = simplejpeg.encode_jpeg(arr, quality=quality, colorspace=colorspace)
    return data
