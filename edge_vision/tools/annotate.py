"""Drawing results onto the frames they belong to, and writing the annotated video.

Replay draws each frame's own result on that frame (never a newer result on an older
frame): boxes, labels and scores for answered frames; a red border and a reason for
frames without a result (dropped by latest-wins, answered with an error, or cut short by
Ctrl-C). Drawing is OpenCV on the BGR pixels in place; it runs in replay's writer thread.
The video is encoded with PyAV, whose wheels carry FFmpeg with libx264 and libvpx: H.264 in
MP4 or VP9 in WebM, which browsers play (OpenCV's own writer offers MPEG-4 Part 2, which
Chromium refuses, and whether it has an H.264 encoder depends on the build).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np
import numpy.typing as npt
from av.container import OutputContainer
from av.video.stream import VideoStream

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


@dataclass(frozen=True)
class VideoCodec:
    """A codec ``--out`` can write: an encoder PyAV's wheels bring (FFmpeg's, not this
    machine's), the file types it goes in, and the encoder's options."""

    name: str  # as --codec takes it
    encoder: str  # FFmpeg's encoder
    suffixes: tuple[str, ...]
    options: dict[str, str]


#: What browsers play (Chromium, Firefox, Safari): H.264 in MP4, VP9 in WebM (both in MKV).
#: Fast presets: replay's writer thread must keep up with the engine.
CODECS: dict[str, VideoCodec] = {
    "h264": VideoCodec(
        "h264", "libx264", (".mp4", ".m4v", ".mov", ".mkv"), {"preset": "veryfast", "crf": "20"}
    ),
    "vp9": VideoCodec(
        "vp9",
        "libvpx-vp9",
        (".webm", ".mkv"),
        {"deadline": "realtime", "cpu-used": "8", "row-mt": "1", "crf": "30", "b": "0"},
    ),
}
#: The codec ``--out PATH`` gets by its extension when ``--codec`` is not given.
CODEC_BY_SUFFIX = {".mp4": "h264", ".m4v": "h264", ".mov": "h264", ".mkv": "h264", ".webm": "vp9"}
#: What the old ``--fourcc`` meant, where it named a codec browsers play.
CODEC_BY_FOURCC = {"avc1": "h264", "h264": "h264", "x264": "h264", "vp09": "vp9", "vp90": "vp9"}


def video_codec(path: Path, codec: str | None = None) -> VideoCodec:
    """The codec for ``--out PATH`` (``--codec``, else by extension); raises SourceError,
    one line saying what to use instead, for a file type or codec it cannot write."""
    suffix = path.suffix.lower()
    name = codec if codec is not None else CODEC_BY_SUFFIX.get(suffix)
    if name is None:
        raise SourceError(
            f"--out {path}: replay writes video browsers play: .mp4 (H.264) or .webm (VP9), "
            f"also .m4v, .mov, .mkv; not {suffix or 'a file without an extension'}"
        )
    chosen = CODECS.get(name.lower())
    if chosen is None:
        raise SourceError(f"--codec {name}: unknown; use h264 (.mp4) or vp9 (.webm)")
    if suffix not in chosen.suffixes:
        raise SourceError(
            f"--codec {chosen.name} does not go in {suffix or 'a file without an extension'} "
            f"files; use {' or '.join(chosen.suffixes)}"
        )
    if chosen.encoder not in av.codecs_available:
        raise SourceError(
            f"--codec {chosen.name}: this PyAV's FFmpeg has no {chosen.encoder} encoder "
            "(pip install --force-reinstall av brings one)"
        )
    if not path.parent.is_dir():
        raise SourceError(f"--out {path}: folder {path.parent} does not exist")
    return chosen


def codec_of_fourcc(fourcc: str) -> str:
    """The codec an old ``--fourcc`` names; raises SourceError for one browsers cannot play."""
    name = CODEC_BY_FOURCC.get(fourcc.lower())
    if name is None:
        raise SourceError(
            f"--fourcc {fourcc}: replay writes only video browsers play; use --codec h264 "
            "(.mp4) or --codec vp9 (.webm)"
        )
    return name


class VideoSink:
    """The annotated video, encoded by PyAV (FFmpeg's libx264 or libvpx-vp9 from its
    wheel) as 4:2:0 BT.709, which browsers play. Frames of another size are resized (a
    folder of mixed images still makes one video); an odd width or height is padded by a
    pixel (4:2:0 needs even ones). Blocking: the writer thread owns it."""

    def __init__(
        self, path: Path, fps: float, size: tuple[int, int], codec: str | None = None
    ) -> None:
        chosen = video_codec(path, codec)
        self.path = path
        self.size = size
        self.codec = chosen.name
        self.frames = 0
        w, h = size
        self._pad = (w % 2, h % 2)
        rate = Fraction(fps if math.isfinite(fps) and fps > 0 else 30.0).limit_denominator(1001)
        try:
            # faststart: the index goes first, so a browser plays while it downloads.
            options = {"movflags": "+faststart"} if path.suffix.lower() != ".webm" else {}
            container = av.open(str(path), "w", options=options)
        except OSError as e:
            raise SourceError(f"cannot write {path}: {e.strerror or e}") from None
        self._container: OutputContainer | None = container
        stream = container.add_stream(chosen.encoder, rate=rate)
        if not isinstance(stream, VideoStream):  # pragma: no cover - CODECS are video codecs
            raise RuntimeError(f"{chosen.encoder} is not a video encoder")
        stream.width, stream.height = w + self._pad[0], h + self._pad[1]
        stream.pix_fmt = "yuv420p"
        stream.options = dict(chosen.options)
        cc = stream.codec_context
        cc.time_base = 1 / rate
        # BT.709, limited range, said in the stream: what players assume of HD video, so
        # the colours a browser shows are the ones drawn.
        cc.colorspace = cc.color_primaries = cc.color_trc = _BT709
        cc.color_range = _LIMITED_RANGE
        self._stream = stream

    def write(self, img: U8Array) -> None:
        if self._container is None:
            raise RuntimeError("the video is closed")
        pixels: npt.NDArray[Any] = img
        if (img.shape[1], img.shape[0]) != self.size:
            pixels = cv2.resize(pixels, self.size, interpolation=cv2.INTER_AREA)
        if any(self._pad):
            pad_w, pad_h = self._pad
            pixels = cv2.copyMakeBorder(pixels, 0, pad_h, 0, pad_w, cv2.BORDER_REPLICATE)
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="bgr24")
        frame = frame.reformat(format="yuv420p", dst_colorspace=_BT709)
        frame.pts = self.frames
        self._container.mux(self._stream.encode(frame))
        self.frames += 1

    def close(self) -> None:
        """Finish the file (flush the encoder, write the index); safe to call twice."""
        if self._container is None:
            return
        container, self._container = self._container, None
        try:
            container.mux(self._stream.encode(None))
        finally:
            container.close()


#: FFmpeg's AVCOL_SPC/PRI/TRC_BT709 (the same value, 1, in all three) and AVCOL_RANGE_MPEG.
_BT709 = 1
_LIMITED_RANGE = 1
