"""What one replay is asked to do (:class:`ReplayOptions`, from the command line or a
caller) and the one error that stops it (:class:`ReplayError`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ...common.settings import Mode
from ...common.sources import Cut
from ...errors import EdgeVisionError

Wire = Literal["binary", "json"]


class ReplayError(EdgeVisionError):
    """Replay cannot go on: the server is unreachable, refused us, or went away."""


@dataclass(frozen=True)
class ReplayOptions:
    input: str
    mode: Mode | None = None  # None: every frame for files and folders, latest for live
    cut: Cut = field(default_factory=Cut)
    url: str | None = None
    token: str | None = None
    wire: Wire = "binary"
    out: Path | None = None
    codec: str | None = None  # of ``out``: h264 or vp9; None: by its extension
    jsonl: Path | None = None
    summary_json: Path | None = None
    events: Path | None = None  # the events the rules raise, one JSON event a line
    events_drain_s: float = 30.0  # at the end, longest wait for the sinks to take them
    progress: bool | None = None  # None: when stderr is a terminal
    confidence: float | None = None
    classes: list[int] | None = None
    read: bool = False  # since protocol 2: read the text in the boxes (read.py)
    jpeg_quality: int = 90
    in_flight: int | None = None  # every-frame: frames in flight (session.every_in_flight)
    timeout_s: float = 30.0  # connect, and longest wait for a server's answer
    handle_signals: bool = False  # install SIGINT/SIGTERM handlers (the command does)
