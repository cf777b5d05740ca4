"""Drawing results onto the frames they belong to, and writing the annotated video.

Replay draws each frame's own result on that frame (never a newer result on an older
frame): boxes, labels and scores for answered frames; a red border and a reason for
frames without a result (dropped by latest-wins, answered with an error, or cut short by
Ctrl-C). Drawing is OpenCV on the BGR pixels in place; it runs in replay's writer thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from ..common.sources import SourceError

U8Array = npt.NDArray[np.uint8]

#: Box colours (BGR) by class, cycled; class 0 is green, the colour of the text detector.
PALETTE: tuple[tuple[int, int, int], ...] = (
    (0, 255, 0),
    (255, 128, 0),
    (0, 200, 255),
    (255, 0, 255),
    (0, 128, 255),
    (255, 255, 0),
    (128, 0, 255),
    (0, 255, 160),
)
NO_RESULT_COLOUR = (0, 0, 255)

#: FourCC by file extension; mp4v and MJPG are in every FFmpeg build OpenCV ships with.
FOURCC_BY_SUFFIX = {
    ".mp4": "mp4v",
    ".m4v": "mp4v",
    ".mov": "mp4v",
    ".avi": "MJPG",
    ".mkv": "XVID",
}


def colour_for(cls: int) -> tuple[int, int, int]:
    return PALETTE[cls % len(PALETTE)]


def _scale(height: int) -> tuple[float, int]:
    """Font scale and line thickness that read well from 240p to 4K."""
    font = max(0.4, height / 900.0)
    return font, max(2, round(height / 360.0))


def _label(
    img: U8Array, text: str, x: int, y: int, colour: tuple[int, int, int], font: float, th: int
) -> None:
    (tw, tht), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, font, max(1, th // 2))
    y_top = max(0, y - tht - base - 2)
    cv2.rectangle(img, (x, y_top), (x + tw + 4, y_top + tht + base + 2), colour, -1)
    cv2.putText(
        img,
        text,
        (x + 2, y_top + tht + 1),
        cv2.FONT_HERSHEY_SIMPLEX,
        font,
        (0, 0, 0),
        max(1, th // 2),
        cv2.LINE_AA,
    )


def draw_detections(img: U8Array, detections: Sequence[dict[str, Any]]) -> None:
    """Protocol detections (``box``, ``score``, ``class``, ``label``) drawn in place; a
    detection with ``text`` is labelled with the text read in it instead of its label."""
    font, th = _scale(img.shape[0])
    for det in detections:
        x1, y1, x2, y2 = (round(v) for v in det["box"])
        cls = int(det.get("class", 0))
        colour = colour_for(cls)
        # A dark outline keeps the box visible on a background of its own colour.
        cv2.rectangle(img, (x1, y1), (x2, y2), (0, 0, 0), th + 2)
        cv2.rectangle(img, (x1, y1), (x2, y2), colour, th)
        name = det.get("label", cls)
        text = det.get("text")  # since protocol 2, a session reading text (read.py)
        if text:  # OpenCV's Hershey fonts draw ASCII only: anything else shows as '?'
            name = "".join(c if " " <= c <= "~" else "?" for c in text)
        _label(img, f"{name} {det['score']:.2f}", x1, y1, colour, font, th)


def mark_no_result(img: U8Array, reason: str) -> None:
    """A red border and the reason, for a frame that has no result to show."""
    font, th = _scale(img.shape[0])
    h, w = img.shape[:2]
    cv2.rectangle(img, (0, 0), (w - 1, h - 1), NO_RESULT_COLOUR, 2 * th)
    _label(img, f"no result: {reason}", 2 * th, h - 2 * th, NO_RESULT_COLOUR, font, th)


def draw_frame_number(img: U8Array, index: int) -> None:
    font, th = _scale(img.shape[0])
    text = f"#{index}"
    (_, tht), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, font * 0.8, 1)
    org = (img.shape[1] - int(60 * font) - 2 * th, tht + base + 2 * th)
    cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, font * 0.8, (255, 255, 255), 1)


def video_fourcc(path: Path, fourcc: str | None = None) -> str:
    """The codec for ``--out PATH``; raises SourceError for a path we cannot write."""
    code = fourcc or FOURCC_BY_SUFFIX.get(path.suffix.lower())
    if code is None:
        raise SourceError(
            f"--out {path}: unknown video type {path.suffix!r}; use one of "
            f"{', '.join(sorted(FOURCC_BY_SUFFIX))} or give --fourcc"
        )
    if len(code) != 4:
        raise SourceError(f"--fourcc must be four characters, got {code!r}")
    if not path.parent.is_dir():
        raise SourceError(f"--out {path}: folder {path.parent} does not exist")
    return code


class VideoSink:
    """``cv2.VideoWriter`` for the annotated video. Frames of another size are resized
    (a folder of mixed images still makes one video). Blocking: the writer thread owns it."""

    def __init__(
        self, path: Path, fps: float, size: tuple[int, int], fourcc: str | None = None
    ) -> None:
        code = video_fourcc(path, fourcc)
        self.path = path
        self.size = size
        self.frames = 0
        self._writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*code), fps, size)
        if not self._writer.isOpened():
            self._writer.release()
            raise SourceError(f"cannot write {path} with codec {code} (this OpenCV build)")

    def write(self, img: U8Array) -> None:
        if (img.shape[1], img.shape[0]) != self.size:
            self._writer.write(cv2.resize(img, self.size, interpolation=cv2.INTER_AREA))
        else:
            self._writer.write(np.ascontiguousarray(img))
        self.frames += 1

    def close(self) -> None:
        """Finish the file (writes the index, e.g. an MP4 ``moov`` box); safe to call twice."""
        self._writer.release()
