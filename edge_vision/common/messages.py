"""The frame message as the session layer parsed it and the frame path takes it: a plain
type below both (:mod:`edge_vision.session.receive` makes it from the wire)."""

from __future__ import annotations

from dataclasses import dataclass

FrameId = int | str


@dataclass(frozen=True, slots=True)
class FrameMessage:
    """One camera frame as received; ``image`` is still encoded."""

    id: FrameId
    ts: float | int | None
    image: bytes
    image_is_base64: bool
    received_at: float  # time.perf_counter() when the message arrived
