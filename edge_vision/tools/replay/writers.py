"""The outputs of one replay, in frame order: per-frame JSONL (:func:`jsonl_line`), the
annotated video (:func:`annotated`), the progress bar (all three written by
:class:`Recorder` in replay's one writer thread) and the summary as text
(:func:`format_summary`)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

from ...common.sources import SourceInfo
from .books import FrameRecord, ReplayStats
from .options import ReplayError

if TYPE_CHECKING:
    from ..annotate import VideoSink


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
    if summary.get("events") is not None:
        lines += event_lines(summary["events"])
    if summary.get("failure"):
        lines.append(f"stopped early: {summary['failure']}")
    return "\n".join(lines)


def event_lines(events: Mapping[str, Any]) -> list[str]:
    """The summary's ``events`` (:mod:`.events`) as text: per rule, then per sink."""
    rules = events.get("rules") or {}
    if not rules:
        return ["events: no rules (events.rules) to run"]
    lines = [f"events {events.get('total', 0)}: " + ", ".join(f"{n} {k}" for n, k in rules.items())]
    for name, c in (events.get("sinks") or {}).items():
        lines.append(
            f"  to {name}: {c['delivered']} delivered, {c['dropped']} dropped, "
            f"{c['undelivered']} undelivered"
        )
    if events.get("jsonl"):
        lines.append(f"events JSONL: {events['jsonl']}")
    return lines


class Recorder:
    """Writes outcomes in frame order: JSONL, annotated video, progress. Owns its files.

    Every method runs in replay's single writer thread (file and video I/O block).
    """

    def __init__(
        self,
        info: SourceInfo,
        jsonl: Path | None,
        video: Path | None,
        codec: str | None,
        progress: bool,
        events: Path | None = None,
    ) -> None:
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ..annotate import VideoSink

        self.stats = ReplayStats()
        self._jsonl: IO[bytes] | None = None
        self._events: IO[bytes] | None = None
        self._video: VideoSink | None = None
        self._bar: Any = None
        if video is not None:
            self._video = VideoSink(video, info.fps, (info.width, info.height), codec)
        if jsonl is not None:
            try:
                # One write per line and no buffering beyond it: a killed replay leaves
                # whole lines only.
                self._jsonl = jsonl.open("wb", buffering=0)
            except OSError as e:
                self.close()
                raise ReplayError(f"--jsonl {jsonl}: {e.strerror}") from None
        if events is not None:
            try:  # as the JSONL: whole lines only, however the replay ends
                self._events = events.open("wb", buffering=0)
            except OSError as e:
                self.close()
                raise ReplayError(f"--events {events}: {e.strerror}") from None
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

    def write(self, record: FrameRecord, events: Sequence[bytes] = ()) -> None:
        """One frame, and the JSON lines of the events it raised (:mod:`.events`)."""
        self.stats.add(record)
        if self._jsonl is not None:
            self._jsonl.write(jsonl_line(record, self.stats.counts["dropped"]))
        self.write_events(events)
        if self._video is not None:
            self._video.write(annotated(record))
        if self._bar is not None:
            c = self.stats.counts
            self._bar.set_postfix_str(
                f"answered={c['answered']} dropped={c['dropped']}", refresh=False
            )
            self._bar.update(1)

    def write_events(self, events: Sequence[bytes]) -> None:
        """Event lines (``--events``), one JSON event each."""
        if self._events is not None:
            for line in events:
                self._events.write(line)

    def close(self) -> None:
        """Close every output; each is valid afterwards even after an interrupted run."""
        if self._bar is not None:
            self._bar.close()
        if self._video is not None:
            self._video.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._events is not None:
            self._events.close()

    @property
    def video_frames(self) -> int:
        return self._video.frames if self._video is not None else 0


def annotated(record: FrameRecord) -> Any:
    """The frame's pixels with its own outcome drawn on them (in place: the frame is done)."""
    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from ..annotate import draw_detections, draw_frame_number, mark_no_result

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
