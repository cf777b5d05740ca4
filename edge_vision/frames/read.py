"""Reading the text in the detected boxes: crop, straighten, recognise, CTC-decode.

Since protocol 2 a session may turn reading on (``settings``: ``read: true``); each
detection then carries ``text`` and ``text_score`` and ``timing`` gains ``read_ms``
(docs/protocol.md, "Reading"). The recogniser is PP-OCRv6's (``PP-OCRv6_rec_small.onnx``
in the rapidocr wheel): input ``x: [N, 3, 48, W]`` float32, BGR, ``(pixel/255 - 0.5)/0.5``;
output ``[N, W/8, C]`` character probabilities, one column per 8 input pixels (CTC:
Graves et al., "Connectionist Temporal Classification", ICML 2006). The steps follow
what PP-OCR's reference does (rapidocr's ``ch_ppocr_rec`` and ``get_rotate_crop_image``),
written here from that description:

1. **crop**: each box's quadrilateral is warped to an upright rectangle of its own side
   lengths (``cv2.getPerspectiveTransform`` + ``warpPerspective``, cubic, border
   replicated), so a rotated box comes out straight; an axis-aligned box (what the DBNet
   head returns today) is the same warp of its four corners. A crop 1.5× taller than wide
   is turned a quarter (vertical text read as a line);
2. **resize**: to the model's input height (48), keeping the aspect ratio; crops are
   sorted by aspect ratio and batched (``read.batch``); a batch is as wide as its widest
   crop at that height, at least 320 (the model's nominal 48×320), the rest padded with
   0 (mid-grey after normalisation);
3. **recognise** on the configured engine kind: ONNX Runtime on the CPU, the ``torch``
   engine's converter (:mod:`edge_vision.engines.onnx_torch`) on a GPU, or a second
   TensorRT plan built like the detector's
   (:mod:`edge_vision.engines.tensorrt.recogniser`; ONNX Runtime, with a log line, when
   TensorRT is absent); the arg-max and its probability are taken on the engine's
   device, so only two ``[N, T]`` arrays come back, not ``[N, T, 18710]``;
4. **CTC greedy decode** (:class:`CtcDecoder`): repeated indices merged, the blank
   (index 0) dropped, index ``i`` mapped to the model's own character list (ONNX metadata
   key ``character``, one per line) with the blank put first and a space appended, as the
   reference does; ``text_score`` is the mean probability of the characters kept (0 for
   an empty string).

Per session (:class:`SessionReading`) a label read once is not read again every frame:
its result is carried on its track and read again only when its box's size changes by
more than ``read.reread_size_change`` (the label turned, came closer, or the text changed
length). The track is the session's own (:class:`edge_vision.frames.track.Tracker`, one
per session, the ids results carry): a frame's boxes are matched to the live tracks
(:meth:`~edge_vision.frames.track.Tracker.match`) when they are read, and what was read for
a box that starts a new track is kept on it once the reply, in frame order, has given it
its id (:meth:`SessionReading.settle`).
At most ``read.max_boxes`` boxes are read per frame (best score first); the others come
back unread (``text: null``) and are read by the next frames.

Latency (latest-wins): one read at a time per session. In ``latest`` mode a frame whose
boxes are ready while an older frame of the session is still being read is not read
itself: it carries what its tracks already know and leaves the rest unread, so reading
never holds a newer frame's boxes back by more than the one read in progress (its reply
follows the older frame's). In ``every`` mode each frame waits its turn and is read.

The module also runs as a measurement: ``python -m edge_vision.frames.read --help``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from ..common.threads import role_pool
from ..config import Config
from ..engines.recognisers import Recogniser, load_recogniser
from ..errors import ClientError, EngineError, ModelError
from .track import Tracker

log = logging.getLogger(__name__)

U8Array = npt.NDArray[np.uint8]
F32Array = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]

#: The recogniser's input height (PP-OCR rec: 48) and nominal width (48×320).
INPUT_HEIGHT = 48
NOMINAL_WIDTH = 320


# -- CTC --------------------------------------------------------------------------------


class CtcDecoder:
    """Greedy CTC decoding with the model's own character list.

    ``characters`` are the model's characters in order (ONNX metadata ``character``);
    the class list is ``[blank] + characters + [" "]``: class 0 is CTC's blank and the
    last class a space, as PP-OCR's ``CTCLabelDecode`` builds it."""

    BLANK = 0

    def __init__(self, characters: Sequence[str]) -> None:
        if not characters:
            raise ModelError("the recogniser's character list is empty")
        self.classes: list[str] = ["", *characters, " "]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @classmethod
    def from_metadata(cls, metadata: dict[str, str], path: Path | str = "") -> CtcDecoder:
        text = metadata.get("character")
        if not text:
            raise ModelError(f"{path}: the recogniser has no 'character' list in its ONNX metadata")
        return cls(text.splitlines())

    def decode(
        self, indices: npt.NDArray[np.integer], probs: npt.NDArray[np.floating]
    ) -> list[tuple[str, float]]:
        """``indices``/``probs``: ``(N, T)`` arg-max class and its probability per column.
        Returns ``(text, score)`` per row; ``score`` is the mean probability of the kept
        columns, 0.0 when nothing was kept."""
        idx = np.asarray(indices)
        p = np.asarray(probs, dtype=np.float64)
        if idx.ndim != 2 or idx.shape != p.shape:
            raise ValueError(f"indices {idx.shape} and probs {p.shape} must be (N, T) alike")
        out: list[tuple[str, float]] = []
        for row, prow in zip(idx, p, strict=True):
            keep = np.ones(len(row), dtype=bool)
            keep[1:] = row[1:] != row[:-1]  # a repeat of the previous column is one char
            keep &= row != self.BLANK
            kept = row[keep]
            if kept.size and int(kept.max()) >= len(self.classes):
                raise ModelError(
                    f"the recogniser answered class {int(kept.max())}, but its character "
                    f"list has {len(self.classes)} classes"
                )
            text = "".join(self.classes[int(i)] for i in kept)
            score = float(prow[keep].mean()) if kept.size else 0.0
            out.append((text, score))
        return out


# -- crops ------------------------------------------------------------------------------


def box_quad(box: npt.NDArray[np.floating] | Sequence[float]) -> F32Array:
    """The four corners (top-left, top-right, bottom-right, bottom-left) of an
    axis-aligned ``x1, y1, x2, y2`` box."""
    x1, y1, x2, y2 = (float(v) for v in list(box)[:4])
    return np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]], np.float32)


def order_quad(quad: npt.NDArray[np.floating]) -> F32Array:
    """A rectangle's four corners, in any order, as top-left, top-right, bottom-right,
    bottom-left: the two leftmost points are the left side (the upper one first), the two
    others the right side (the reference's ``get_mini_boxes`` order)."""
    q = np.asarray(quad, np.float32).reshape(4, 2)
    by_x = q[np.argsort(q[:, 0], kind="stable")]
    left, right = by_x[:2], by_x[2:]
    tl, bl = (left[0], left[1]) if left[0, 1] <= left[1, 1] else (left[1], left[0])
    tr, br = (right[0], right[1]) if right[0, 1] <= right[1, 1] else (right[1], right[0])
    return np.array([tl, tr, br, bl], np.float32)


def crop_quad(image: U8Array, quad: npt.NDArray[np.floating]) -> U8Array:
    """The rectangle ``quad`` (4×2 corners, any order) of ``image`` warped to an upright
    rectangle of its own side lengths; turned a quarter when 1.5× taller than wide.
    Never empty: at least 1×1.

    The corners are ordered, then rounded to whole pixels (half to even), as the
    reference's polygons are before it crops them (``DBPostProcess`` rounds each ordered
    corner into frame pixels): the recogniser is sensitive to a sub-pixel shift of blurred
    lettering (measured: "YAWAHA" from corners 0.2-0.7 px off the reference's, "YAMAHA"
    from the same corners rounded)."""
    q = np.round(order_quad(quad))
    w = int(max(np.linalg.norm(q[0] - q[1]), np.linalg.norm(q[2] - q[3])))
    h = int(max(np.linalg.norm(q[0] - q[3]), np.linalg.norm(q[1] - q[2])))
    w, h = max(w, 1), max(h, 1)
    target = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float32)
    m = cv2.getPerspectiveTransform(q, target)
    crop = cv2.warpPerspective(
        image, m, (w, h), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REPLICATE
    )
    if h / w >= 1.5:
        crop = np.rot90(crop)
    return np.ascontiguousarray(crop)


def batch_width(
    ratios: Sequence[float], height: int = INPUT_HEIGHT, max_width: int | None = None
) -> int:
    """Width of a batch whose crops have these width/height ratios: the widest at
    ``height``, never under the model's nominal 320 (the reference's rule), nor over
    ``max_width`` (a TensorRT profile's end: a wider crop is squeezed into it)."""
    widest = max([NOMINAL_WIDTH / INPUT_HEIGHT, *ratios])
    width = int(height * widest)
    return width if max_width is None else min(width, max_width)


def resize_into(crop: U8Array, out: F32Array, height: int = INPUT_HEIGHT) -> None:
    """``crop`` (BGR uint8) resized to ``height`` keeping its aspect ratio (clipped to
    ``out``'s width), normalised to ``(x/255 - 0.5)/0.5`` into ``out`` (3×height×W,
    zeros elsewhere: the padding)."""
    h, w = crop.shape[:2]
    width = out.shape[2]
    resized_w = min(width, math.ceil(height * w / h))
    resized = cv2.resize(crop, (resized_w, height)).astype(np.float32)
    out[:] = 0.0
    out[:, :, :resized_w] = resized.transpose(2, 0, 1) * (2.0 / 255.0) - 1.0


def recogniser_batches(
    crops: Sequence[U8Array],
    batch: int,
    height: int = INPUT_HEIGHT,
    max_width: int | None = None,
) -> list[tuple[list[int], F32Array]]:
    """Crops grouped by aspect ratio into batches of at most ``batch``: each group's
    crop indices and its ``[n, 3, height, W]`` input (``W`` at most ``max_width``)."""
    ratios = [c.shape[1] / c.shape[0] for c in crops]
    order = [int(i) for i in np.argsort(np.asarray(ratios), kind="stable")]
    out: list[tuple[list[int], F32Array]] = []
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        width = batch_width([ratios[i] for i in idx], height, max_width)
        x = np.empty((len(idx), 3, height, width), np.float32)
        for row, i in enumerate(idx):
            resize_into(crops[i], x[row], height)
        out.append((idx, x))
    return out


# -- the reader ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadText:
    text: str
    score: float


class TextReader:
    """Crops, batches, recognises and decodes: the whole read of one frame's boxes.

    Thread-safe for the recognisers here (ONNX Runtime sessions and eval-mode torch
    modules may run from several threads)."""

    def __init__(self, recogniser: Recogniser, batch: int = 6) -> None:
        self.recogniser = recogniser
        self.decoder = CtcDecoder.from_metadata(recogniser.metadata)
        self.batch = max(1, batch)

    def read(self, image: U8Array, quads: Sequence[npt.NDArray[np.floating]]) -> list[ReadText]:
        """Read each quadrilateral (4×2, frame pixels, clockwise from top-left) of the
        BGR ``image``."""
        crops = [crop_quad(image, q) for q in quads]
        return self.read_crops(crops)

    def read_crops(self, crops: Sequence[U8Array]) -> list[ReadText]:
        results: list[ReadText | None] = [None] * len(crops)
        for idx, x in recogniser_batches(crops, self.batch, max_width=self.recogniser.max_width):
            classes, probs = self.recogniser.run(x)
            for i, (text, score) in zip(idx, self.decoder.decode(classes, probs), strict=True):
                results[i] = ReadText(text, score)
        return [r if r is not None else ReadText("", 0.0) for r in results]

    def warm_up(self) -> None:
        """One run at the nominal shape, so the first frame does not pay for it."""
        self.read_crops([np.full((INPUT_HEIGHT, NOMINAL_WIDTH, 3), 255, np.uint8)])


# -- per session ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Known:
    width: float
    height: float
    text: ReadText


@dataclass(slots=True)
class ReadPlan:
    """Which of a frame's detections to read and what is already known of the others."""

    texts: list[ReadText | None]  # one per detection; None: not known (yet)
    to_read: list[int]  # detections to read now, best score first
    # The live track each detection joins (Tracker.match); 0: it starts a new one.
    tracks: list[int] = field(default_factory=list)


#: Which of a frame's detections (``(N, 6)``, frame pixels) of a ``width`` × ``height``
#: frame may be read: one flag a detection.
ReadFilter = Callable[[npt.NDArray[np.floating], int, int], list[bool]]


class SessionReading:
    """One session's reading state: what each track's label said, and the read slot.

    ``tracker`` is the session's tracker, which the caller updates in frame order and
    then tells :meth:`settle`. ``select``, when set, limits reading to the detections it
    flags (a session that reads only for its rules' ``text``, edge_vision.events).

    Used from the event loop only (plan and store are cheap numpy work); the read itself
    runs in a worker thread between :meth:`begin` and :meth:`end`."""

    def __init__(
        self,
        tracker: Tracker,
        max_boxes: int = 16,
        reread_size_change: float = 0.15,
    ) -> None:
        self.max_boxes = max_boxes
        self.reread_size_change = reread_size_change
        self.tracker = tracker
        self.select: ReadFilter | None = None
        self._known: dict[int, _Known] = {}
        self._busy = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def busy(self) -> bool:
        return self._busy

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def begin(self) -> None:
        if self._busy:
            raise RuntimeError("a read of this session is already in progress")
        self._busy = True
        self._idle.clear()

    def end(self) -> None:
        self._busy = False
        self._idle.set()

    def plan(
        self, detections: npt.NDArray[np.floating], now: float, width: int = 0, height: int = 0
    ) -> ReadPlan:
        """Match ``detections`` (``(N, >=5)``, frame pixels, of a ``width`` × ``height``
        frame) with the session's live tracks and say which to read: those whose track
        has no text yet or whose box's width or height changed by more than
        ``reread_size_change`` since it was read (of those :attr:`select` flags, when set)."""
        dets = np.asarray(detections, dtype=np.float64).reshape(-1, 6)
        ids = self.tracker.match(dets, now)
        wanted = self.select(dets, width, height) if self.select is not None else None
        texts: list[ReadText | None] = []
        stale: list[int] = []
        tol = self.reread_size_change
        for i, (det, track) in enumerate(zip(dets, ids, strict=True)):
            w, h = float(det[2] - det[0]), float(det[3] - det[1])
            known = self._known.get(track) if track else None
            if known is not None:
                texts.append(known.text)
                if abs(w - known.width) > tol * known.width or (
                    abs(h - known.height) > tol * known.height
                ):
                    stale.append(i)  # shown as last read until read again
            else:
                texts.append(None)
                stale.append(i)
        if wanted is not None:
            stale = [i for i in stale if wanted[i]]
        # Unknown boxes first, then changed ones; best score first within each.
        stale.sort(key=lambda i: (texts[i] is not None, -float(dets[i, 4])))
        return ReadPlan(texts, stale[: self.max_boxes], ids)

    def store(
        self, plan: ReadPlan, detections: npt.NDArray[np.floating], read: Sequence[ReadText]
    ) -> None:
        """Record what was read for ``plan.to_read`` (in that order): on the plan's texts,
        and on the tracks the boxes joined (a box that starts a track: :meth:`settle`)."""
        dets = np.asarray(detections, dtype=np.float64).reshape(-1, 6)
        for i, text in zip(plan.to_read, read, strict=True):
            plan.texts[i] = text
            if plan.tracks[i]:
                w, h = float(dets[i, 2] - dets[i, 0]), float(dets[i, 3] - dets[i, 1])
                self._known[plan.tracks[i]] = _Known(w, h, text)

    def settle(
        self,
        track_ids: Sequence[int],
        detections: npt.NDArray[np.floating],
        texts: Sequence[ReadText | None],
    ) -> None:
        """After the tracker's update for a frame (in frame order) gave its detections
        ``track_ids``: keep what was read for a track that knew nothing yet (a box that
        started it), and forget the tracks the tracker forgot."""
        dets = np.asarray(detections, dtype=np.float64).reshape(-1, 6)
        for i, (track, text) in enumerate(zip(track_ids, texts, strict=True)):
            if text is not None and track not in self._known:
                w, h = float(dets[i, 2] - dets[i, 0]), float(dets[i, 3] - dets[i, 1])
                self._known[track] = _Known(w, h, text)
        if len(self._known) > len(track_ids):
            live = set(self.tracker.track_ids)
            for gone in [k for k in self._known if k not in live]:
                del self._known[gone]


# -- the pipeline's read stage ---------------------------------------------------------------

ImageLoader = Callable[[], tuple[U8Array, Callable[[], None]]]


class ReadStage:
    """The pipeline's read stage: the recogniser, loaded when a session first asks, and
    its own worker thread (recognition never runs on the event loop, and never takes the
    frame workers that decode newer frames)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._reader: TextReader | None = None
        self._loading: asyncio.Lock | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.failures = 0  # reads that raised (their boxes were sent unread)

    @property
    def enabled(self) -> bool:
        return self.config.read.enabled

    @property
    def engine_kind(self) -> str:
        kind = self.config.read.engine
        if kind == "auto":
            detector = self.config.engine.kind
            return detector if detector in ("torch", "tensorrt") else "onnxruntime"
        return kind

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = role_pool(1, "read")
        return self._executor

    async def reader(self) -> TextReader:
        """The loaded and warmed-up reader (loaded once, in the read worker). Raises
        ModelError when reading is off or the recogniser cannot load."""
        if self._reader is not None:
            return self._reader
        if not self.enabled:
            raise ModelError("reading is turned off on this server (read.enabled)")
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with self._loading:
            if self._reader is None:
                loop = asyncio.get_running_loop()
                self._reader = await loop.run_in_executor(self._pool(), self._load)
        return self._reader

    def _load(self) -> TextReader:
        r, t = self.config.read, self.config.engine.torch
        # FP32 even when the detector runs FP16: the eager recogniser is several times
        # slower in FP16 on a GPU (docs/benchmarks.md, "Reading on the GPU").
        rec = load_recogniser(
            r.model_path,
            self.engine_kind,
            threads=r.threads,
            device=t.device,
            fp16=False,
            config=self.config,
        )
        reader = TextReader(rec, r.batch)
        reader.warm_up()
        return reader

    def session(self, tracker: Tracker) -> SessionReading:
        """Fresh per-session reading state with this server's limits, on the session's
        ``tracker``."""
        r = self.config.read
        return SessionReading(tracker, r.max_boxes, r.reread_size_change)

    async def read(
        self,
        reading: SessionReading,
        detections: npt.NDArray[np.floating],
        quads: npt.NDArray[np.floating] | None,
        now: float,
        load_image: ImageLoader,
        *,
        wait: bool,
        size: tuple[int, int] = (0, 0),
    ) -> list[ReadText | None]:
        """Texts for ``detections`` (None: not read yet); ``quads``: their rotated
        rectangles (``(N, 4, 2)``), None to read the axis-aligned boxes. ``wait``: wait for this
        session's read in progress (``every`` mode) instead of carrying only what the
        tracks know (``latest``); ``size``: the frame's width and height (for
        ``reading.select``). A session resumed with reading on, on a node where it is
        off, gets nothing read."""
        if not self.enabled:
            return [None] * len(detections)
        reader = await self.reader()
        if wait:
            await reading.wait_idle()
        plan = reading.plan(detections, now, *size)
        if not plan.to_read:
            return plan.texts
        if reading.busy:  # an older frame is being read: this one carries what is known
            return plan.texts
        if quads is None:
            corners = [box_quad(b) for b in np.asarray(detections)[plan.to_read]]
        else:
            corners = [np.asarray(quads[i]) for i in plan.to_read]
        reading.begin()
        try:
            loop = asyncio.get_running_loop()
            read = await loop.run_in_executor(self._pool(), _read_sync, reader, load_image, corners)
        except (ClientError, ModelError, EngineError, cv2.error, ValueError) as e:  # sent unread
            log.warning("reading failed (%s: %s); boxes sent unread", type(e).__name__, e)
            self.failures += 1
            return plan.texts
        finally:
            reading.end()
        reading.store(plan, detections, read)
        return plan.texts

    async def close(self) -> None:
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown, True)
            self._executor = None


def _read_sync(
    reader: TextReader, load_image: ImageLoader, quads: list[npt.NDArray[np.floating]]
) -> list[ReadText]:
    image, release = load_image()
    try:
        return reader.read(image, quads)
    finally:
        release()
