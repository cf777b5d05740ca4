"""Frame sources for replay: a video file, a folder of images, a stream URL or a camera.

:func:`open_source` turns the ``INPUT`` of ``edge-vision replay`` into a
:class:`FrameSource` whose :meth:`~FrameSource.read` returns one :class:`SourceFrame` at
a time, already cut by ``--start``, ``--duration`` and ``--fps``. Reading blocks (OpenCV
decodes, a stream waits for the network): call it from a worker thread.

Source timestamps (``SourceFrame.ts``, milliseconds) are what replay sends as the
protocol's ``ts`` (docs/protocol.md), and the server echoes them unchanged:

* a video file: the frame's presentation time in the file, from OpenCV's
  ``CAP_PROP_POS_MSEC`` (so variable-frame-rate files keep their real timing), falling
  back to ``index / fps`` where the container gives none;
* a folder of images: ``index / fps`` (a folder has no rate of its own: ``--fps``, else
  :data:`FOLDER_DEFAULT_FPS`);
* a live stream or camera: the wall-clock capture time in milliseconds since the epoch,
  as a camera client would stamp it.

An HTTP URL that serves a finite video (it reports a frame count) is read like a file;
one that does not (an MJPEG camera, RTSP) is live and paces itself.
"""

from __future__ import annotations

import math
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import EdgeVisionError

if TYPE_CHECKING:  # numpy and OpenCV load when a source opens, not with `edge-vision --help`
    import numpy as np
    import numpy.typing as npt

    U8Array = npt.NDArray[np.uint8]

SourceKind = Literal["file", "folder", "stream", "camera"]

#: Rate at which a folder of images is played when ``--fps`` is not given.
FOLDER_DEFAULT_FPS = 30.0
#: Rate assumed for a live source whose driver reports none.
LIVE_DEFAULT_FPS = 30.0
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


class SourceError(EdgeVisionError):
    """The replay input cannot be opened or read (missing, unreadable codec, no camera)."""


@dataclass(frozen=True, slots=True)
class SourceFrame:
    """One frame as read from the source."""

    index: int  # position in the source: frame number in a file, image number in a folder
    ts: float  # source timestamp, milliseconds (see the module docstring)
    pixels: U8Array  # H x W x 3, BGR


@dataclass(frozen=True, slots=True)
class SourceInfo:
    name: str  # what the user passed
    kind: SourceKind
    width: int  # of the first frame
    height: int
    fps: float  # frames per second this replay delivers (after --fps)
    frame_count: int | None  # frames this replay will deliver, when known in advance
    live: bool  # the source paces itself (stream, camera); replay never sleeps for it


@dataclass(frozen=True, slots=True)
class Cut:
    """``--start``, ``--duration`` (seconds from the first frame) and ``--fps``."""

    start_s: float = 0.0
    duration_s: float | None = None
    fps: float | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.start_s) or self.start_s < 0:
            raise SourceError(f"--start must be a time >= 0 s, got {self.start_s}")
        if self.duration_s is not None and not (
            math.isfinite(self.duration_s) and self.duration_s > 0
        ):
            raise SourceError(f"--duration must be > 0 s, got {self.duration_s}")
        if self.fps is not None and not (math.isfinite(self.fps) and self.fps > 0):
            raise SourceError(f"--fps must be > 0, got {self.fps}")


class FrameCutter:
    """Which raw frames a cut keeps. Pure: feed it each frame's offset from the first.

    ``--fps N`` keeps the first frame at or after each ``1/N`` step, so a 30 fps video at
    ``--fps 10`` keeps every third frame, and a rate above the source's keeps them all.
    """

    def __init__(self, cut: Cut, source_fps: float) -> None:
        self.cut = cut
        self.step_ms = 1000.0 / cut.fps if cut.fps else 0.0
        # Half a source frame of slack absorbs rounding in container timestamps.
        self._slack_ms = 500.0 / source_fps if source_fps > 0 else 0.0
        self._next_due_ms: float | None = None

    def verdict(self, offset_ms: float) -> Literal["skip", "keep", "stop"]:
        start_ms = self.cut.start_s * 1000.0
        if offset_ms < start_ms - self._slack_ms:
            return "skip"
        if self.cut.duration_s is not None and (
            offset_ms >= start_ms + self.cut.duration_s * 1000.0 - self._slack_ms
        ):
            return "stop"
        if self.step_ms:
            if self._next_due_ms is not None and offset_ms < self._next_due_ms - self._slack_ms:
                return "skip"
            due = self._next_due_ms if self._next_due_ms is not None else offset_ms
            while due <= offset_ms + self._slack_ms:  # a gap in the source skips steps
                due += self.step_ms
            self._next_due_ms = due
        return "keep"


def expected_frames(total: int | None, source_fps: float, cut: Cut) -> int | None:
    """How many frames a cut of a ``total``-frame source at ``source_fps`` delivers."""
    if total is None or total <= 0 or source_fps <= 0:
        return None
    first = min(total, math.ceil(cut.start_s * source_fps - 0.5))
    last = total
    if cut.duration_s is not None:
        last = min(total, first + math.ceil(cut.duration_s * source_fps - 0.5))
    n = max(0, last - first)
    if cut.fps and cut.fps < source_fps:
        n = math.ceil(n * cut.fps / source_fps - 1e-9)
    return n


class FrameSource(ABC):
    """Frames of one replay input, in order. ``read`` blocks: call it from a worker thread."""

    info: SourceInfo

    @abstractmethod
    def read(self) -> SourceFrame | None:
        """The next kept frame, or None at the end of the source (or of the cut)."""

    @abstractmethod
    def close(self) -> None:
        """Release the capture; safe to call twice."""

    def __enter__(self) -> FrameSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _quiet_opencv() -> Any:
    """OpenCV prints its own warnings for inputs we report ourselves; keep them to errors."""
    import cv2

    try:
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
    except AttributeError:  # builds without the logging utilities
        pass
    return cv2


class CaptureSource(FrameSource):
    """A file, URL or camera read through ``cv2.VideoCapture`` (FFmpeg backend)."""

    def __init__(self, name: str, target: str | int, kind: SourceKind, cut: Cut) -> None:
        cv2 = _quiet_opencv()
        self._cv2 = cv2
        self._cap = cv2.VideoCapture(target)
        if not self._cap.isOpened():
            self._cap.release()
            raise SourceError(_open_failure(name, kind))
        total = int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT))
        native_fps = float(self._cap.get(cv2.CAP_PROP_FPS))
        if not (math.isfinite(native_fps) and 0 < native_fps < 1000):
            native_fps = 0.0
        # A URL with a known length is a file served over the network, not a camera.
        live = kind == "camera" or (kind == "stream" and total <= 0)
        self._live = live
        self._fps = native_fps or (LIVE_DEFAULT_FPS if live else 0.0)
        self._cutter = FrameCutter(cut, self._fps)
        self._index = 0
        self._first_ts: float | None = None
        self._done = False
        first = self._read_first(name, kind, cut)
        self._first: SourceFrame | None = first
        height, width = first.pixels.shape[:2]
        out_fps = min(cut.fps, self._fps) if cut.fps and self._fps else (cut.fps or self._fps)
        self.info = SourceInfo(
            name=name,
            kind=kind,
            width=int(width),
            height=int(height),
            fps=out_fps or LIVE_DEFAULT_FPS,
            frame_count=None if live else expected_frames(total, self._fps, cut),
            live=live,
        )

    def _read_first(self, name: str, kind: SourceKind, cut: Cut) -> SourceFrame:
        cv2 = self._cv2
        if not self._live and cut.start_s > 0 and self._fps > 0:
            # Seek instead of decoding every frame up to --start; FFmpeg lands on the
            # keyframe before and decodes forward, so the position is exact.
            self._cap.set(cv2.CAP_PROP_POS_FRAMES, round(cut.start_s * self._fps))
            self._index = max(0, int(self._cap.get(cv2.CAP_PROP_POS_FRAMES)))
            self._first_ts = 0.0  # offsets stay relative to the file's start
        frame = self._next_raw()
        if frame is None:
            self.close()
            if self._index == 0 and kind != "camera":
                raise SourceError(
                    f"{name}: opened, but no frame could be decoded (a codec this OpenCV "
                    "build cannot read, or a damaged file)"
                )
            raise SourceError(f"{name}: no frames in the range given by --start/--duration")
        return frame

    def _next_raw(self) -> SourceFrame | None:
        cv2 = self._cv2
        while not self._done:
            ok, pixels = self._cap.read()
            if not ok or pixels is None:
                self._done = True
                return None
            index = self._index
            self._index += 1
            if self._live:
                ts = time.time() * 1000.0
            else:
                ts = float(self._cap.get(cv2.CAP_PROP_POS_MSEC))
                if not math.isfinite(ts) or ts < 0 or (index > 0 and ts == 0.0):
                    ts = index * 1000.0 / self._fps if self._fps else float(index)
            if self._first_ts is None:
                self._first_ts = ts
            verdict = self._cutter.verdict(ts - self._first_ts)
            if verdict == "stop":
                self._done = True
                return None
            if verdict == "keep":
                if pixels.ndim == 2:
                    pixels = cv2.cvtColor(pixels, cv2.COLOR_GRAY2BGR)
                return SourceFrame(index, ts, pixels)
        return None

    def read(self) -> SourceFrame | None:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return self._next_raw()

    def close(self) -> None:
        self._done = True
        self._cap.release()


def _open_failure(name: str, kind: SourceKind) -> str:
    if kind == "camera":
        return f"camera {name} cannot be opened (no such device, or it is busy)"
    if kind == "stream":
        return f"cannot open stream {name}: unreachable, refused, or not a video OpenCV reads"
    return (
        f"cannot open {name} as a video: no readable video stream (unknown container, a codec "
        "this OpenCV build lacks, or a truncated file)"
    )


class FolderSource(FrameSource):
    """Images of a folder in name order (``frame_2`` before ``frame_10``), played at --fps."""

    def __init__(self, folder: Path, cut: Cut) -> None:
        self._cv2 = _quiet_opencv()
        self._files = sorted(
            (p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()),
            key=_natural_key,
        )
        if not self._files:
            raise SourceError(f"{folder} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        fps = cut.fps or FOLDER_DEFAULT_FPS
        first = math.ceil(cut.start_s * fps - 1e-9)
        last = len(self._files)
        if cut.duration_s is not None:
            last = min(last, first + math.ceil(cut.duration_s * fps - 1e-9))
        self._fps = fps
        self._position = first
        self._end = last
        if first >= last:
            raise SourceError(f"{folder}: no images in the range given by --start/--duration")
        first_frame = self._load(first)
        self._first: SourceFrame | None = first_frame
        self._position += 1
        h, w = first_frame.pixels.shape[:2]
        self.info = SourceInfo(str(folder), "folder", int(w), int(h), fps, last - first, False)

    def _load(self, i: int) -> SourceFrame:
        path = self._files[i]
        pixels = self._cv2.imread(str(path), self._cv2.IMREAD_COLOR)
        if pixels is None:
            raise SourceError(f"{path} is not an image OpenCV can read")
        return SourceFrame(i, i * 1000.0 / self._fps, pixels)

    def read(self) -> SourceFrame | None:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        if self._position >= self._end:
            return None
        frame = self._load(self._position)
        self._position += 1
        return frame

    def close(self) -> None:
        self._position = self._end


def _natural_key(path: Path) -> list[Any]:
    return [int(p) if p.isdigit() else p.lower() for p in re.split(r"(\d+)", path.name)]


def classify_input(text: str) -> SourceKind:
    """What ``INPUT`` names: an existing file or folder, a URL, or a camera index."""
    path = Path(text).expanduser()
    if path.is_dir():
        return "folder"
    if path.exists():
        return "file"
    if _URL.match(text):
        return "stream"
    if text.isdigit():
        return "camera"
    raise SourceError(f"{text}: no such file or folder (nor a URL or a camera index)")


def open_source(text: str, cut: Cut | None = None) -> FrameSource:
    """Open the replay ``INPUT``; raises :class:`SourceError` with what went wrong.

    Blocks (opening a stream connects; the first frame is decoded to learn the size).
    """
    cut = cut or Cut()
    kind = classify_input(text)
    if kind == "folder":
        return FolderSource(Path(text).expanduser(), cut)
    if kind == "camera":
        return CaptureSource(text, int(text), kind, cut)
    if kind == "file":
        path = Path(text).expanduser()
        if not path.is_file():
            raise SourceError(f"{text} is not a regular file")
        try:
            with path.open("rb"):
                pass
        except OSError as e:
            raise SourceError(f"cannot read {text}: {e.strerror}") from None
        return CaptureSource(text, str(path), kind, cut)
    return CaptureSource(text, text, kind, cut)
