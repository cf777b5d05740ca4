"""``edge-vision replay`` (also ``python -m edge_vision.replay``): recorded video through
the service, to annotate a clip, to measure the service, or to feed a running server as a
camera would.

``INPUT`` is a video file (anything OpenCV's FFmpeg reads), a folder of images, an
RTSP/HTTP URL or a camera index (:mod:`edge_vision.sources`). Frames are JPEG-encoded as
a camera client would send them and served either

* in-process, by the same objects the server builds (``InferenceService`` +
  ``FramePipeline``, and one connection's :class:`~edge_vision.session_core.SessionCore`
  with the server's limits, so admission, drops and reply order are the server's), or
* by a running server over ``--url ws://host:8080/ws``, exactly as a camera client
  (docs/protocol.md: ``hello``, ``frame`` as JSON or binary, ``result`` / ``error``).

Pacing: ``--every-frame`` answers every frame, in order, as fast as the engine goes
(the server's ``every`` mode); ``--realtime`` offers frames at the source's own rate and
latest wins (``latest`` mode): a frame that waits while a newer one arrives is dropped and
counted, as with a live camera.

Outputs, all in frame order: ``--out`` an annotated video (each frame carries its own
result; frames without one are marked), ``--jsonl`` one line per frame, and a summary
(frames, answered, dropped, fps, latency p50/p95/p99 per stage) on stdout and in
``--summary-json``. Ctrl-C stops reading, finishes the frames in flight (a second Ctrl-C
abandons them) and still closes every output properly; the exit code is then 130.

The asyncio shape: a producer reads and encodes frames in a worker thread and offers
them (paced for ``--realtime``); a target (in-process or remote) delivers one
:class:`Outcome` per frame; :class:`InOrder` puts outcomes back in frame order; one writer
thread draws, encodes video and writes JSONL, so the event loop never blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

import orjson

from .aio import cancel_and_wait, wait_event, with_timeout
from .errors import ClientError, EdgeVisionError
from .receive import FrameId, FrameMessage, encode_binary_frame, encode_json_frame
from .settings import Mode
from .sources import Cut, FrameSource, SourceFrame, SourceInfo, open_source

if TYPE_CHECKING:
    import aiohttp

    from .annotate import VideoSink
    from .config import Config
    from .infer import InferenceService
    from .pipeline import FramePipeline
    from .session_core import Drop
    from .session_runner import FrameCore, FrameTicket, SessionRunner

log = logging.getLogger("edge_vision.replay")  # also when run as __main__

T = TypeVar("T")
Wire = Literal["binary", "json"]
Status = Literal["answered", "dropped", "error", "unanswered"]

DESCRIPTION = (
    "Replay recorded video (a file, a folder of images, a stream or a camera) through the "
    "service: annotate it, measure the service on it, or feed a running server as a camera."
)
#: Frames decoded and waiting for the writer thread before reading pauses.
WRITE_BACKLOG = 32
#: Frames sent to a server in --realtime mode and not yet settled before sending pauses
#: (bounds memory if a server stops answering; a live camera would block the same way).
REALTIME_WINDOW = 128
#: Stages reported in the summary, in path order (docs/protocol.md ``timing`` plus ours).
STAGES = (
    "encode_ms",
    "decode_ms",
    "shape_ms",
    "queue_ms",
    "batch_wait_ms",
    "infer_ms",
    "post_ms",
    "read_ms",  # with --read (read.py)
    "server_ms",
    "latency_ms",
)


class ReplayError(EdgeVisionError):
    """Replay cannot go on: the server is unreachable, refused us, or went away."""


# -- options ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayOptions:
    input: str
    mode: Mode | None = None  # None: every frame for files and folders, latest for live
    cut: Cut = field(default_factory=Cut)
    url: str | None = None
    token: str | None = None
    wire: Wire = "binary"
    out: Path | None = None
    fourcc: str | None = None
    jsonl: Path | None = None
    summary_json: Path | None = None
    progress: bool | None = None  # None: when stderr is a terminal
    confidence: float | None = None
    classes: list[int] | None = None
    read: bool = False  # since protocol 2: read the text in the boxes (read.py)
    jpeg_quality: int = 90
    in_flight: int | None = None  # every-frame: frames in flight (session.every_in_flight)
    timeout_s: float = 30.0  # connect, and longest wait for a server's answer
    handle_signals: bool = False  # install SIGINT/SIGTERM handlers (the command does)


# -- pure parts -------------------------------------------------------------------------


class InOrder(Generic[T]):
    """Releases items by sequence number, oldest first, never with a gap.

    Outcomes arrive out of order (a frame dropped by latest-wins is settled while the one
    before it is still in the engine); outputs must be written in frame order.
    """

    def __init__(self) -> None:
        self.next_seq = 0
        self._held: dict[int, T] = {}

    def add(self, seq: int, item: T) -> list[tuple[int, T]]:
        if seq < self.next_seq or seq in self._held:
            raise RuntimeError(f"frame {seq} settled twice")
        self._held[seq] = item
        ready: list[tuple[int, T]] = []
        while self.next_seq in self._held:
            ready.append((self.next_seq, self._held.pop(self.next_seq)))
            self.next_seq += 1
        return ready

    @property
    def held(self) -> int:
        return len(self._held)


class ReplyMatcher:
    """Matches a server's answers to the frames sent on one connection.

    Answers come in the order frames were sent (docs/protocol.md, admission), so a
    ``result`` for a frame also settles every earlier frame still waiting: the server's
    latest-wins admission dropped them. An ``error`` settles only its own frame.
    """

    def __init__(self) -> None:
        self._waiting: OrderedDict[FrameId, int] = OrderedDict()  # frame id -> seq

    def sent(self, frame_id: FrameId, seq: int) -> None:
        if frame_id in self._waiting:
            raise RuntimeError(f"frame id {frame_id!r} sent twice")
        self._waiting[frame_id] = seq

    def result(self, frame_id: FrameId) -> tuple[list[int], int | None]:
        """(seqs dropped before it, its seq); seq None for an id not waiting (a duplicate)."""
        if frame_id not in self._waiting:
            return [], None
        dropped: list[int] = []
        while True:
            fid, seq = self._waiting.popitem(last=False)
            if fid == frame_id:
                return dropped, seq
            dropped.append(seq)

    def error(self, frame_id: FrameId) -> int | None:
        return self._waiting.pop(frame_id, None)

    def drain(self) -> list[int]:
        seqs = list(self._waiting.values())
        self._waiting.clear()
        return seqs

    def __len__(self) -> int:
        return len(self._waiting)


@dataclass(slots=True)
class Outcome:
    """What became of one frame."""

    status: Status
    result: dict[str, Any] | None = None  # the protocol's ``result`` message
    error: dict[str, str] | None = None  # ``{"code", "message"}`` from an ``error`` message
    reason: str | None = None  # why a frame went unanswered
    latency_ms: float | None = None  # offered/sent → answer received


@dataclass(slots=True)
class Encoded:
    """A frame read and encoded in the reader thread, ready to offer or send."""

    frame: SourceFrame
    payload: bytes | str  # JPEG bytes (in-process) or the wire message (remote)
    encode_ms: float


@dataclass(slots=True)
class FrameRecord:
    seq: int
    encoded: Encoded
    outcome: Outcome


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p95, p99 (bench's, numpy's linear interpolation) and max, rounded to 0.01;
    nothing for no values."""
    from .bench.stats import summary

    if not values:
        return {}
    stats = summary(values)
    return {key: round(stats[key], 2) for key in ("p50", "p95", "p99", "max")}


class ReplayStats:
    """Counters and per-stage latencies, in frame order; the summary's source. Pure."""

    def __init__(self) -> None:
        self.frames = 0
        self.counts: dict[Status, int] = {"answered": 0, "dropped": 0, "error": 0, "unanswered": 0}
        self.stages: dict[str, list[float]] = {s: [] for s in STAGES}
        self.batch_sizes: list[float] = []
        self.error_codes: dict[str, int] = {}

    def add(self, record: FrameRecord) -> None:
        oc = record.outcome
        self.frames += 1
        self.counts[oc.status] += 1
        if oc.status == "error" and oc.error is not None:
            code = oc.error.get("code", "?")
            self.error_codes[code] = self.error_codes.get(code, 0) + 1
        self.stages["encode_ms"].append(record.encoded.encode_ms)
        if oc.status != "answered" or oc.result is None:
            return
        timing = oc.result.get("timing") or {}
        for stage in STAGES:
            value = timing.get(stage)
            if isinstance(value, int | float) and stage != "encode_ms":
                self.stages[stage].append(float(value))
        if oc.latency_ms is not None:
            self.stages["latency_ms"].append(oc.latency_ms)
        if isinstance(timing.get("batch_size"), int | float):
            self.batch_sizes.append(float(timing["batch_size"]))

    def summary(self, wall_s: float) -> dict[str, Any]:
        answered = self.counts["answered"]
        return {
            "frames": self.frames,
            "answered": answered,
            "dropped": self.counts["dropped"],
            "error": self.counts["error"],
            "unanswered": self.counts["unanswered"],
            "error_codes": dict(self.error_codes),
            "wall_s": round(wall_s, 3),
            "fps": round(self.frames / wall_s, 2) if wall_s > 0 else 0.0,
            "answered_fps": round(answered / wall_s, 2) if wall_s > 0 else 0.0,
            "mean_batch_size": (
                round(sum(self.batch_sizes) / len(self.batch_sizes), 2)
                if self.batch_sizes
                else None
            ),
            "latency_ms": {s: p for s, v in self.stages.items() if (p := percentiles(v))},
        }


def jsonl_line(record: FrameRecord, dropped_so_far: int) -> bytes:
    """One JSONL line: the frame (``index`` in the source, ``seq`` in this replay, ``ts``),
    what became of it (``status``: answered, dropped, error, unanswered; ``error``,
    ``reason``), its ``detections`` as in the protocol's ``result``, ``timing`` in ms (the
    server's stages plus ``encode_ms`` and ``latency_ms``, offered → answered) and
    ``dropped``, the frames dropped so far."""
    frame, oc = record.encoded.frame, record.outcome
    h, w = frame.pixels.shape[:2]
    line: dict[str, Any] = {
        "index": frame.index,
        "seq": record.seq,
        "ts": frame.ts,
        "status": oc.status,
        "width": int(w),
        "height": int(h),
        "detections": [],
        "timing": {"encode_ms": round(record.encoded.encode_ms, 3)},
        "dropped": dropped_so_far,
    }
    if oc.result is not None:
        line["ts"] = oc.result.get("ts")  # as the server echoed it
        if line["ts"] != frame.ts:  # a server that broke the protocol: keep both
            line["source_ts"] = frame.ts
        line["width"], line["height"] = oc.result.get("width"), oc.result.get("height")
        line["detections"] = oc.result.get("detections", [])
        line["timing"].update(oc.result.get("timing") or {})
    if oc.latency_ms is not None:
        line["timing"]["latency_ms"] = round(oc.latency_ms, 3)
    if oc.error is not None:
        line["error"] = oc.error
    if oc.reason is not None:
        line["reason"] = oc.reason
    return orjson.dumps(line) + b"\n"


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a few human-readable lines."""
    src = summary.get("source", {})
    lines = [
        f"replay {summary.get('input')} ({src.get('width')}x{src.get('height')}, "
        f"{src.get('fps')} fps) via {summary.get('target')}, "
        f"{'every frame' if summary.get('mode') == 'every' else 'real time, latest wins'}"
        + (" — interrupted" if summary.get("interrupted") else ""),
        f"frames {summary['frames']}  answered {summary['answered']}  "
        f"dropped {summary['dropped']}  errors {summary['error']}  "
        f"unanswered {summary['unanswered']}",
        f"{summary['wall_s']:.2f} s  {summary['fps']:.2f} frames/s  "
        f"(answered {summary['answered_fps']:.2f}/s)",
    ]
    if summary.get("error_codes"):
        lines.append(f"error codes: {summary['error_codes']}")
    stages = summary.get("latency_ms") or {}
    if stages:
        lines.append(f"{'latency ms':<14}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}")
        for stage, p in stages.items():
            name = stage.removesuffix("_ms")
            lines.append(
                f"  {name:<12}{p['p50']:>9.1f}{p['p95']:>9.1f}{p['p99']:>9.1f}{p['max']:>9.1f}"
            )
    for key, label in (("video", "annotated video"), ("jsonl", "per-frame JSONL")):
        if summary.get("outputs", {}).get(key):
            lines.append(f"{label}: {summary['outputs'][key]}")
    if summary.get("failure"):
        lines.append(f"stopped early: {summary['failure']}")
    return "\n".join(lines)


def websocket_url(url: str, mode: Mode) -> str:
    """``ws://host:port[/ws]`` (or http/https) → the /ws URL with ``?mode=``."""
    from yarl import URL

    try:
        u = URL(url)
    except (ValueError, TypeError) as e:
        raise ReplayError(f"--url {url!r} is not a URL: {e}") from None
    schemes = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}
    if u.scheme not in schemes or not u.host:
        raise ReplayError(f"--url {url!r} must be ws://host:port/ws (or wss://, http://)")
    u = u.with_scheme(schemes[u.scheme])
    if u.path in ("", "/"):
        u = u.with_path("/ws")
    if "mode" not in u.query:
        u = u.update_query(mode=mode)
    return str(u)


# -- the writer thread ------------------------------------------------------------------


class Recorder:
    """Writes outcomes in frame order: JSONL, annotated video, progress. Owns its files.

    Every method runs in replay's single writer thread (file and video I/O block).
    """

    def __init__(
        self,
        info: SourceInfo,
        jsonl: Path | None,
        video: Path | None,
        fourcc: str | None,
        progress: bool,
    ) -> None:
        from .annotate import VideoSink

        self.stats = ReplayStats()
        self._jsonl: IO[bytes] | None = None
        self._video: VideoSink | None = None
        self._bar: Any = None
        if video is not None:
            self._video = VideoSink(video, info.fps, (info.width, info.height), fourcc)
        if jsonl is not None:
            try:
                # One write per line and no buffering beyond it: a killed replay leaves
                # whole lines only.
                self._jsonl = jsonl.open("wb", buffering=0)
            except OSError as e:
                self.close()
                raise ReplayError(f"--jsonl {jsonl}: {e.strerror}") from None
        if progress:
            # tqdm ships no type hints; imported by name so mypy sees Any, not a missing stub.
            tqdm = importlib.import_module("tqdm").tqdm
            self._bar = tqdm(
                total=info.frame_count,
                unit="frame",
                file=sys.stderr,
                dynamic_ncols=True,
                smoothing=0.1,
                desc="replay",
            )

    def write(self, record: FrameRecord) -> None:
        self.stats.add(record)
        if self._jsonl is not None:
            self._jsonl.write(jsonl_line(record, self.stats.counts["dropped"]))
        if self._video is not None:
            self._video.write(annotated(record))
        if self._bar is not None:
            c = self.stats.counts
            self._bar.set_postfix_str(
                f"answered={c['answered']} dropped={c['dropped']}", refresh=False
            )
            self._bar.update(1)

    def close(self) -> None:
        """Close every output; each is valid afterwards even after an interrupted run."""
        if self._bar is not None:
            self._bar.close()
        if self._video is not None:
            self._video.close()
        if self._jsonl is not None:
            self._jsonl.close()

    @property
    def video_frames(self) -> int:
        return self._video.frames if self._video is not None else 0


def annotated(record: FrameRecord) -> Any:
    """The frame's pixels with its own outcome drawn on them (in place: the frame is done)."""
    from .annotate import draw_detections, draw_frame_number, mark_no_result

    oc = record.outcome
    img = record.encoded.frame.pixels
    if oc.status == "answered" and oc.result is not None:
        draw_detections(img, oc.result.get("detections", []))
    elif oc.status == "error" and oc.error is not None:
        mark_no_result(img, f"error {oc.error.get('code')}")
    else:
        mark_no_result(img, oc.reason or oc.status)
    draw_frame_number(img, record.encoded.frame.index)
    return img


# -- targets: where frames are answered --------------------------------------------------

Deliver = Callable[[int, Outcome], None]


class Target(Protocol):
    description: str
    failure: ReplayError | None  # why the target cannot go on (set before ``failed``)
    failed: asyncio.Event

    async def start(self) -> None: ...

    def encode(self, frame: SourceFrame, jpeg: bytes) -> bytes | str:
        """The payload to send for this frame (reader thread)."""
        ...

    async def send(self, seq: int, enc: Encoded) -> None:
        """Offer one frame; may wait (every-frame back-pressure, send window)."""
        ...

    def abort(self, reason: str) -> None:
        """Settle every unsettled frame as unanswered (second Ctrl-C, failures)."""
        ...

    async def close(self) -> None: ...


class LocalTarget:
    """In-process: the server's own InferenceService and FramePipeline, under the server's
    own session core (edge_vision.session_core) with the same limits; only the socket is
    missing, so in-process replay measures exactly what the server does."""

    def __init__(
        self,
        config: Config,
        mode: Mode,
        in_flight: int | None,
        confidence: float | None,
        classes: list[int] | None,
        deliver: Deliver,
        *,
        read: bool = False,
    ) -> None:
        self.config = config
        self.mode = mode
        self._read = read
        self.deliver = deliver
        self._in_flight_opt = in_flight
        self._confidence = config.model.confidence if confidence is None else confidence
        self._classes = frozenset(classes) if classes is not None else None
        self.description = f"in-process {config.engine.kind}"
        self.failure: ReplayError | None = None  # an in-process engine degrades, never fails
        self.failed = asyncio.Event()
        self.service: InferenceService | None = None
        self.pipeline: FramePipeline | None = None
        self._runner: SessionRunner | None = None
        self._seqs: dict[int, int] = {}  # id(frame message) -> seq, until it is settled
        self._closed = False

    async def start(self) -> None:
        from .infer import InferenceService
        from .models import load_model_spec
        from .pipeline import FramePipeline, FrameSettings
        from .session_core import SessionCore
        from .session_runner import SessionRunner

        cfg = self.config
        spec = await asyncio.to_thread(load_model_spec, cfg.model)
        self.service = InferenceService(spec, cfg)
        await self.service.start()
        self.pipeline = FramePipeline(cfg, self.service)
        settings = FrameSettings(self._confidence, self._classes)
        reading = None
        if self._read:  # as a server session with read on; fails here, not per frame
            await self.pipeline.reading.reader()
            reading = self.pipeline.reading.session()
        engine = self.service.engine
        self.description = f"in-process {engine.kind if engine else cfg.engine.kind}"
        # The server's own rules and limits for a connection (docs/protocol.md, Admission);
        # --in-flight overrides session.every_in_flight.
        s = cfg.session
        core: FrameCore = SessionCore(
            self.mode,
            latest_in_flight=s.latest_in_flight,
            every_in_flight=self._in_flight_opt or s.every_in_flight,
            every_queue=s.every_queue,
        )
        self._runner = SessionRunner(
            core,
            self.pipeline,
            settings=lambda: settings,
            send=self._answer,
            reading=lambda: reading,
            on_drop=self._dropped,
            name="replay",
        )
        self._runner.start()

    def encode(self, frame: SourceFrame, jpeg: bytes) -> bytes:
        return jpeg

    async def send(self, seq: int, enc: Encoded) -> None:
        if not isinstance(enc.payload, bytes):
            raise TypeError("in-process frames carry JPEG bytes")
        if self._runner is None:
            raise RuntimeError("LocalTarget used before start()")
        msg = FrameMessage(enc.frame.index, enc.frame.ts, enc.payload, False, time.perf_counter())
        self._seqs[id(msg)] = seq
        await self._runner.admit(msg)  # 'every' waits for room in the queue

    async def _answer(self, ticket: FrameTicket) -> None:
        """The core's Send: this reply is next in frame order (the server would send it)."""
        from . import reply
        from .pipeline import FrameResult

        res, msg = ticket.reply, ticket.frame
        if isinstance(res, ClientError):
            outcome = Outcome("error", error={"code": res.code, "message": res.message})
        elif isinstance(res, FrameResult) and self.service is not None and self._runner:
            latency = (time.perf_counter() - msg.received_at) * 1000.0
            dropped = self._runner.core.books.dropped
            result = orjson.loads(reply.result(res, self.service.spec.label, dropped))
            outcome = Outcome("answered", result=result, latency_ms=latency)
        else:
            raise RuntimeError(f"frame {msg.id!r} has no reply to deliver")
        self._settle(msg, outcome)

    def _dropped(self, drop: Drop[FrameMessage]) -> None:
        # 'closed' only when replay stops before every frame settled (a failure).
        for msg in drop.frames:
            if drop.reason == "closed":
                self._settle(msg, Outcome("unanswered", reason="interrupted"))
            else:
                self._settle(msg, Outcome("dropped", reason="dropped"))

    def _settle(self, msg: FrameMessage, outcome: Outcome) -> None:
        seq = self._seqs.pop(id(msg), None)
        if seq is not None:  # None: settled already (an abort)
            self.deliver(seq, outcome)

    def abort(self, reason: str) -> None:
        for seq in sorted(self._seqs.values()):
            self.deliver(seq, Outcome("unanswered", reason=reason))
        self._seqs.clear()
        if self._runner is not None:
            self._runner.abort()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._runner is not None:
            await self._runner.close()
        if self.service is not None:
            await self.service.close()
        if self.pipeline is not None:
            await self.pipeline.close()


class RemoteTarget:
    """A running server over its WebSocket, as a camera client (docs/protocol.md)."""

    def __init__(self, opts: ReplayOptions, mode: Mode, deliver: Deliver) -> None:
        self.url = websocket_url(opts.url or "", mode)
        self.description = self.url.split("?", 1)[0]
        self.opts = opts
        self.mode = mode
        self.deliver = deliver
        self.window = REALTIME_WINDOW if mode == "latest" else (opts.in_flight or 8)
        self.hello: dict[str, Any] = {}
        self.failure: ReplayError | None = None
        self.duplicates = 0
        self.ts_mismatches = 0
        self.server_dropped = 0
        self.failed = asyncio.Event()
        self._matcher = ReplyMatcher()
        self._sent: dict[int, tuple[float, float]] = {}  # seq -> (ts sent, perf_counter sent)
        self._room = asyncio.Event()  # set when a frame settles: the send window has room
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._receiver: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {self.opts.token}"} if self.opts.token else {}
        deadline = time.monotonic() + self.opts.timeout_s
        while True:
            try:
                self._ws = await self._session.ws_connect(
                    self.url,
                    headers=headers,
                    max_msg_size=0,
                    autoping=True,
                    timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
                )
                break
            except aiohttp.WSServerHandshakeError as e:
                warming = e.status == 503 and e.headers and "Retry-After" in e.headers
                if warming and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)  # the server said: engine warming up, retry
                    continue
                raise ReplayError(self._refused(e.status, e.message)) from None
            except aiohttp.ClientConnectorError as e:
                # errno is negative for name-resolution errors (getaddrinfo's own codes).
                errno = e.os_error.errno
                why = os.strerror(errno) if errno and errno > 0 else e.os_error.strerror
                why = why or str(e.os_error) or type(e.os_error).__name__
                raise ReplayError(f"cannot reach the server at {self.description}: {why}") from None
            except (aiohttp.ClientError, TimeoutError) as e:
                raise ReplayError(
                    f"cannot connect to {self.description}: {e or type(e).__name__}"
                ) from None
        self.hello = await self._expect("hello")
        if self.opts.confidence is not None or self.opts.classes is not None or self.opts.read:
            settings: dict[str, Any] = {"type": "settings"}
            if self.opts.read:
                settings["read"] = True
            if self.opts.confidence is not None:
                settings["confidence"] = self.opts.confidence
            if self.opts.classes is not None:
                settings["classes"] = self.opts.classes
            await self._ws.send_str(orjson.dumps(settings).decode())
            await self._expect("settings")
        self.description = (
            f"{self.description} ({self.hello.get('model')}, "
            f"{(self.hello.get('engine') or {}).get('active')}, {self.opts.wire})"
        )
        self._receiver = asyncio.create_task(self._receive(), name="replay-receive")

    def _connected(self) -> aiohttp.ClientWebSocketResponse:
        if self._ws is None:
            raise RuntimeError("not connected")
        return self._ws

    def _refused(self, status: int, message: str) -> str:
        where = self.description
        if status in (401, 403):
            hint = "check --token" if self.opts.token else "it needs --token"
            return f"the server at {where} refused authorisation (HTTP {status}); {hint}"
        if status == 404:
            return f"no WebSocket endpoint at {where} (HTTP 404); the server's is /ws"
        if status == 503:
            return f"the server at {where} is not accepting connections (HTTP 503: {message})"
        return f"the server at {where} refused the WebSocket (HTTP {status}: {message})"

    async def _expect(self, kind: str) -> dict[str, Any]:
        import aiohttp

        ws = self._connected()
        while True:
            try:
                msg = await ws.receive(timeout=self.opts.timeout_s)
            except TimeoutError:
                raise ReplayError(
                    f"the server at {self.description} sent no {kind} within "
                    f"{self.opts.timeout_s:g} s"
                ) from None
            if msg.type is not aiohttp.WSMsgType.TEXT:
                raise ReplayError(
                    f"the server at {self.description} closed the connection before its "
                    f"{kind} (close code {ws.close_code})"
                )
            obj = orjson.loads(msg.data)
            if obj.get("type") == kind:
                return dict(obj)
            if obj.get("type") == "error":
                raise ReplayError(f"the server refused: {obj.get('code')}: {obj.get('message')}")

    def encode(self, frame: SourceFrame, jpeg: bytes) -> bytes | str:
        if self.opts.wire == "binary":
            return encode_binary_frame(frame.index, frame.ts, jpeg)
        return encode_json_frame(frame.index, frame.ts, jpeg)

    async def send(self, seq: int, enc: Encoded) -> None:
        ws = self._connected()
        while len(self._matcher) >= self.window and not self.failed.is_set():
            self._room.clear()
            await self._room.wait()
        if self.failed.is_set():
            self.deliver(seq, Outcome("unanswered", reason="connection lost"))
            return
        self._matcher.sent(enc.frame.index, seq)
        self._sent[seq] = (enc.frame.ts, time.perf_counter())
        try:
            if isinstance(enc.payload, bytes):
                await ws.send_bytes(enc.payload)
            else:
                await ws.send_str(enc.payload)
        except (ConnectionError, RuntimeError) as e:
            self._fail(f"the connection to {self.description} broke while sending: {e}")

    async def _receive(self) -> None:
        import aiohttp

        ws = self._connected()
        while True:
            try:
                msg = await ws.receive(timeout=self.opts.timeout_s)
            except TimeoutError:
                if len(self._matcher):
                    self._fail(f"no answer from {self.description} for {self.opts.timeout_s:g} s")
                    return
                continue
            if msg.type is aiohttp.WSMsgType.TEXT:
                self._handle(orjson.loads(msg.data))
            elif msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.PING):
                continue
            else:
                if not self.failed.is_set():
                    self._fail(self._closed_reason(ws.close_code))
                return

    def _closed_reason(self, code: int | None) -> str:
        if code == 1009:  # docs/protocol.md close codes
            limit = (self.hello.get("limits") or {}).get("max_message_bytes")
            return (
                f"the server at {self.description} closed the connection: a frame was larger "
                f"than its limit of {limit} bytes (lower --jpeg-quality, or use --wire binary)"
            )
        if code == 1008:
            return f"the server at {self.description} closed the connection (1008: policy)"
        return f"the server at {self.description} closed the connection (code {code})"

    def _handle(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        now = time.perf_counter()
        if kind == "result":
            dropped, seq = self._matcher.result(obj["id"])
            for d in dropped:
                self._sent.pop(d, None)
                self.deliver(d, Outcome("dropped", reason="dropped"))
            if seq is None:
                self.duplicates += 1
                log.warning("result for frame %r that was already settled", obj.get("id"))
            else:
                ts_sent, sent_at = self._sent.pop(seq)
                if obj.get("ts") != ts_sent:
                    self.ts_mismatches += 1
                self.server_dropped = int(obj.get("dropped") or 0)
                latency = (now - sent_at) * 1000.0
                self.deliver(seq, Outcome("answered", result=obj, latency_ms=latency))
            self._wake()
        elif kind == "error":
            seq = self._matcher.error(obj["id"]) if "id" in obj else None
            error = {"code": str(obj.get("code")), "message": str(obj.get("message"))}
            if seq is None:
                log.warning("server error not tied to a frame: %s", error)
            else:
                _, sent_at = self._sent.pop(seq)
                self.deliver(seq, Outcome("error", error=error, latency_ms=(now - sent_at) * 1e3))
            self._wake()
        elif kind == "closing":
            self._fail(f"the server at {self.description} is shutting down")

    def _wake(self) -> None:
        self._room.set()

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = ReplayError(message)
        self.failed.set()
        self.abort("connection lost")
        self._wake()

    def abort(self, reason: str) -> None:
        for seq in self._matcher.drain():
            self._sent.pop(seq, None)
            self.deliver(seq, Outcome("unanswered", reason=reason))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await cancel_and_wait(self._receiver)
        if self._ws is not None and not self._ws.closed:
            try:
                await with_timeout(self._ws.close(), 5.0)
            except (TimeoutError, ConnectionError):
                pass
        if self._session is not None:
            await self._session.close()


# -- the run ------------------------------------------------------------------------------


class Replay:
    """One replay: source → target → recorder, with pacing, Ctrl-C and the summary."""

    def __init__(self, opts: ReplayOptions, config: Config | None) -> None:
        self.opts = opts
        self.config = config
        self.stop = asyncio.Event()  # first Ctrl-C: read no more, finish frames in flight
        self.abort = asyncio.Event()  # second Ctrl-C: abandon frames in flight too
        self.signal_received: int | None = None
        self._order: InOrder[Outcome] = InOrder()
        self._encoded: dict[int, Encoded] = {}
        self._write_q: asyncio.Queue[FrameRecord | None] = asyncio.Queue()
        self._written = asyncio.Condition()
        self._all_settled = asyncio.Event()
        self._total: int | None = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="replay-writer")
        self.write_failure: ReplayError | None = None

    # outcomes arrive here, in any order, from the target
    def deliver(self, seq: int, outcome: Outcome) -> None:
        for s, oc in self._order.add(seq, outcome):
            self._write_q.put_nowait(FrameRecord(s, self._encoded.pop(s), oc))
        self._check_settled()

    async def run(self) -> tuple[dict[str, Any], int]:
        opts = self.opts
        loop = asyncio.get_running_loop()
        async with AsyncExitStack() as stack:
            if opts.handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    stack.callback(loop.remove_signal_handler, sig)
            stack.push_async_callback(asyncio.to_thread, self._writer.shutdown, True)
            source = await asyncio.to_thread(open_source, opts.input, opts.cut)
            stack.push_async_callback(asyncio.to_thread, source.close)
            info = source.info
            mode: Mode = opts.mode or ("latest" if info.live else "every")
            target = self._make_target(mode)
            stack.push_async_callback(target.close)
            await target.start()  # loads the model or connects: the likeliest failures
            show = opts.progress if opts.progress is not None else sys.stderr.isatty()
            recorder = await loop.run_in_executor(
                self._writer, lambda: Recorder(info, opts.jsonl, opts.out, opts.fourcc, show)
            )
            stack.push_async_callback(loop.run_in_executor, self._writer, recorder.close)
            writer_task = asyncio.create_task(self._write_all(recorder), name="replay-write")
            stack.push_async_callback(self._finish_writing, writer_task)
            # Closed before the writer finishes, so frames it still holds are written.
            stack.push_async_callback(target.close)
            started = time.perf_counter()
            failure = await self._produce(source, target, mode)
            wall_s = time.perf_counter() - started
        summary = self._summary(recorder, info, target, mode, wall_s)
        failure = failure or self.write_failure
        if failure is not None:
            summary["failure"] = str(failure)
        code = 128 + self.signal_received if self.signal_received else 0
        return summary, code

    async def _finish_writing(self, writer_task: asyncio.Task[None]) -> None:
        """Everything settled so far is written before the files close."""
        self._write_q.put_nowait(None)
        await writer_task

    def _make_target(self, mode: Mode) -> Target:
        opts = self.opts
        if opts.url:
            return RemoteTarget(opts, mode, self.deliver)
        if self.config is None:
            raise RuntimeError("in-process replay needs a Config")
        return LocalTarget(
            self.config,
            mode,
            opts.in_flight,
            opts.confidence,
            opts.classes,
            self.deliver,
            read=opts.read,
        )

    def _on_signal(self, sig: int) -> None:
        self.signal_received = self.signal_received or sig
        if not self.stop.is_set():
            log.warning("stopping: finishing the frames in flight (again to abandon them)")
            self.stop.set()
        else:
            self.abort.set()

    async def _produce(self, source: FrameSource, target: Target, mode: Mode) -> ReplayError | None:
        """Read, pace and offer frames until the source ends or Ctrl-C; then settle all."""
        info = source.info
        quality = self.opts.jpeg_quality
        seq = 0
        t0: float | None = None
        ts0 = 0.0

        def read_and_encode() -> Encoded | None:
            import simplejpeg

            frame = source.read()
            if frame is None:
                return None
            t = time.perf_counter()
            jpeg = simplejpeg.encode_jpeg(frame.pixels, quality=quality, colorspace="BGR")
            payload = target.encode(frame, jpeg)
            return Encoded(frame, payload, (time.perf_counter() - t) * 1000.0)

        while not self.stop.is_set() and not target.failed.is_set():
            async with self._written:  # the writer thread sets the pace if it is slowest
                await self._written.wait_for(lambda: self._write_q.qsize() <= WRITE_BACKLOG)
            enc = await asyncio.to_thread(read_and_encode)
            if enc is None:
                break
            if mode == "latest" and not info.live:
                # Offer each frame at its own time, as the camera would have.
                now = time.perf_counter()
                if t0 is None:
                    t0, ts0 = now, enc.frame.ts
                delay = t0 + (enc.frame.ts - ts0) / 1000.0 - now
                if delay > 0 and await wait_event(self.stop, delay):
                    break
            if self.stop.is_set():
                break
            self._encoded[seq] = enc
            await target.send(seq, enc)
            seq += 1

        self._total = seq
        self._check_settled()
        await self._settle_all(target)
        if target.failed.is_set():
            return target.failure or ReplayError(f"{target.description} failed")
        return None

    def _check_settled(self) -> None:
        if self._total is not None and self._order.next_seq >= self._total:
            self._all_settled.set()

    async def _settle_all(self, target: Target) -> None:
        """Wait until every offered frame is settled; a second Ctrl-C abandons the rest."""
        settled = asyncio.create_task(self._all_settled.wait())
        aborted = asyncio.create_task(self.abort.wait())
        try:
            await asyncio.wait({settled, aborted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            settled.cancel()
            aborted.cancel()
        if not self._all_settled.is_set():
            target.abort("interrupted")
            # Cancelled frames settle as their tasks unwind, within a loop iteration or two.
            if not await wait_event(self._all_settled, 10.0):
                raise RuntimeError("frames left unsettled after abort")

    async def _write_all(self, recorder: Recorder) -> None:
        """Feed the writer thread in frame order. If writing fails (a full disk), stop
        reading and discard the rest, so nothing waits on a writer that is gone."""
        loop = asyncio.get_running_loop()
        while True:
            record = await self._write_q.get()
            if record is None:
                return
            if self.write_failure is None:
                try:
                    await loop.run_in_executor(self._writer, recorder.write, record)
                except (OSError, EdgeVisionError) as e:
                    self.write_failure = ReplayError(f"writing the outputs failed: {e}")
                    self.stop.set()
            async with self._written:
                self._written.notify_all()

    def _summary(
        self,
        recorder: Recorder,
        info: SourceInfo,
        target: Target,
        mode: Mode,
        wall_s: float,
    ) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "input": self.opts.input,
            "source": {
                "kind": info.kind,
                "width": info.width,
                "height": info.height,
                "fps": round(info.fps, 3),
                "live": info.live,
            },
            "target": target.description,
            "mode": mode,
            "interrupted": self.signal_received is not None,
            **recorder.stats.summary(wall_s),
            "outputs": {
                "video": str(self.opts.out) if self.opts.out else None,
                "video_frames": recorder.video_frames if self.opts.out else None,
                "jsonl": str(self.opts.jsonl) if self.opts.jsonl else None,
            },
        }
        if isinstance(target, RemoteTarget):
            summary["wire"] = self.opts.wire
            summary["duplicates"] = target.duplicates
            summary["ts_mismatches"] = target.ts_mismatches
            summary["server_dropped"] = target.server_dropped
        return summary


async def replay(opts: ReplayOptions, config: Config | None = None) -> tuple[dict[str, Any], int]:
    """Run one replay; returns the summary and the exit code (0, or 128+signal)."""
    return await Replay(opts, config).run()


# -- the command --------------------------------------------------------------------------


def _classes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected class indices like 0,2 not {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("class indices are >= 0")
    return values


def _seconds(text: str) -> float:
    """``90``, ``1:30`` or ``0:01:30.5``."""
    try:
        parts = [float(p) for p in text.split(":")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or [h:]m:s, not {text!r}") from None
    total = 0.0
    for p in parts:
        total = total * 60 + p
    if not math.isfinite(total) or total < 0 or len(parts) > 3:
        raise argparse.ArgumentTypeError(f"expected seconds or [h:]m:s, not {text!r}")
    return total


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .cli import add_config_args

    p.add_argument(
        "input", metavar="INPUT", help="video file, folder of images, rtsp/http URL or camera index"
    )
    pace = p.add_mutually_exclusive_group()
    pace.add_argument(
        "--every-frame",
        dest="mode",
        action="store_const",
        const="every",
        help="answer every frame in order, as fast as possible (default for files and folders)",
    )
    pace.add_argument(
        "--realtime",
        dest="mode",
        action="store_const",
        const="latest",
        help="offer frames at the source's rate, latest wins, drops counted (default for live)",
    )
    cut = p.add_argument_group("cutting")
    cut.add_argument("--fps", type=float, help="keep at most this many frames per second")
    cut.add_argument("--start", type=_seconds, default=0.0, help="start at (seconds or m:s)")
    cut.add_argument("--duration", type=_seconds, help="replay this long (seconds or m:s)")
    out = p.add_argument_group("outputs")
    out.add_argument("--out", type=Path, help="annotated video (.mp4, .avi, .mkv)")
    out.add_argument("--fourcc", help="video codec FourCC for --out (default by extension)")
    out.add_argument("--jsonl", type=Path, help="one JSON line per frame")
    out.add_argument("--summary-json", type=Path, help="also write the summary as JSON")
    out.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    remote = p.add_argument_group("against a running server (default: in-process)")
    remote.add_argument("--url", help="the server's WebSocket, e.g. ws://localhost:8080/ws")
    remote.add_argument("--token", help="sent as 'Authorization: Bearer TOKEN'")
    remote.add_argument(
        "--wire", choices=("binary", "json"), default="binary", help="frame messages (binary)"
    )
    remote.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait to connect and for an answer (30)",
    )
    frames = p.add_argument_group("frames")
    frames.add_argument("--confidence", type=float, help="score threshold (model.confidence)")
    frames.add_argument("--classes", type=_classes, help="only these class indices, e.g. 0,2")
    frames.add_argument(
        "--read",
        action="store_true",
        help="read the text in the boxes (settings.read): the JSONL and video carry it",
    )
    frames.add_argument("--jpeg-quality", type=int, default=90, help="JPEG quality sent (90)")
    frames.add_argument(
        "--in-flight",
        type=int,
        help="--every-frame: frames in flight at once (in-process: session.every_in_flight, "
        "as the server; remote: frames sent ahead of their answers, 8)",
    )
    add_config_args(p)


def options_from_args(args: argparse.Namespace) -> ReplayOptions:
    if not 1 <= args.jpeg_quality <= 100:
        raise ReplayError("--jpeg-quality must be 1..100")
    if args.in_flight is not None and args.in_flight < 1:
        raise ReplayError("--in-flight must be >= 1")
    if args.confidence is not None and not 0 <= args.confidence <= 1:
        raise ReplayError("--confidence must be in [0, 1]")
    if args.timeout <= 0:
        raise ReplayError("--timeout must be > 0")
    if args.out is not None:
        from .annotate import video_fourcc

        video_fourcc(args.out, args.fourcc)  # a bad --out fails before the model loads
    if args.jsonl is not None and not args.jsonl.parent.is_dir():
        raise ReplayError(f"--jsonl {args.jsonl}: folder {args.jsonl.parent} does not exist")
    return ReplayOptions(
        input=args.input,
        mode=args.mode,
        cut=Cut(args.start, args.duration, args.fps),
        url=args.url,
        token=args.token,
        wire=args.wire,
        out=args.out,
        fourcc=args.fourcc,
        jsonl=args.jsonl,
        summary_json=args.summary_json,
        progress=args.progress,
        confidence=args.confidence,
        classes=args.classes,
        read=args.read,
        jpeg_quality=args.jpeg_quality,
        in_flight=args.in_flight,
        timeout_s=args.timeout,
        handle_signals=threading.current_thread() is threading.main_thread(),
    )


def cmd_replay(args: argparse.Namespace) -> int:
    """The command: run, print the summary, write --summary-json; raises on failure."""
    from .cli import config_from_args, setup_logging

    opts = options_from_args(args)
    config = config_from_args(args)
    setup_logging(config.logging.level)
    summary, code = asyncio.run(replay(opts, config))
    print(format_summary(summary), flush=True)
    if opts.summary_json is not None:
        opts.summary_json.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
    if summary.get("failure"):
        raise ReplayError(summary["failure"])
    return code


def register_cli(subparsers: Any) -> None:
    """``edge-vision replay`` (picked up by :mod:`edge_vision.cli`)."""
    p = subparsers.add_parser(
        "replay",
        help="replay recorded video: annotate it, measure the service, or feed a server",
        description=DESCRIPTION,
    )
    add_arguments(p)
    p.set_defaults(func=cmd_replay)


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m edge_vision.replay INPUT ...``; the same as ``edge-vision replay``."""
    parser = argparse.ArgumentParser(
        prog="python -m edge_vision.replay",
        description=DESCRIPTION,
    )
    add_arguments(parser)
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        return cmd_replay(args)
    except EdgeVisionError as e:
        print(f"edge-vision replay: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
