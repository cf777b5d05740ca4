"""The command: ``edge-vision replay`` and ``python -m edge_vision.tools.replay`` (their
arguments, checked into :class:`~.options.ReplayOptions`; the summary printed and written)."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from ...common.sources import Cut
from ...errors import EdgeVisionError
from ..args import CommandParser, add_config_args, config_from_args, setup_logging
from .options import ReplayError, ReplayOptions
from .run import replay
from .writers import format_summary

DESCRIPTION = (
    "Replay recorded video (a file, a folder of images, a stream or a camera) through the "
    "service: annotate it, measure the service on it, or feed a running server as a camera."
)


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
    out.add_argument(
        "--out",
        type=Path,
        help="annotated video, as browsers play it: .mp4 (H.264) or .webm (VP9); also .m4v, "
        ".mov, .mkv",
    )
    out.add_argument(
        "--codec",
        metavar="h264|vp9",
        help="codec of --out (default: by its extension: h264 for .mp4, vp9 for .webm)",
    )
    out.add_argument("--fourcc", help=argparse.SUPPRESS)  # before --codec: avc1 or vp09 only
    out.add_argument("--jsonl", type=Path, help="one JSON line per frame")
    out.add_argument("--summary-json", type=Path, help="also write the summary as JSON")
    out.add_argument(
        "--events",
        type=Path,
        metavar="FILE",
        help="run the config's rules (events.rules, zones, lines) over the video and write "
        "every event to FILE, one JSON event a line; with events.sinks configured they are "
        "also delivered there (docs/events.md)",
    )
    out.add_argument(
        "--events-drain-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="at the end, wait at most S seconds for the sinks to take every event",
    )
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
        "--wire", choices=("binary", "json"), default="binary", help="frame messages"
    )
    remote.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait to connect and for an answer",
    )
    frames = p.add_argument_group("frames")
    frames.add_argument("--confidence", type=float, help="score threshold (model.confidence)")
    frames.add_argument("--classes", type=_classes, help="only these class indices, e.g. 0,2")
    frames.add_argument(
        "--read",
        action="store_true",
        help="read the text in the boxes (settings.read): the JSONL and video carry it",
    )
    frames.add_argument("--jpeg-quality", type=int, default=90, help="JPEG quality sent")
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
    codec = args.codec
    if args.out is not None:
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ..annotate import codec_of_fourcc, video_codec

        if codec is None and args.fourcc is not None:
            codec = codec_of_fourcc(args.fourcc)
        codec = video_codec(args.out, codec).name  # a bad --out fails before the model loads
    elif codec is not None or args.fourcc is not None:
        raise ReplayError("--codec names the codec of --out: give --out too")
    for flag, path in (("--jsonl", args.jsonl), ("--events", args.events)):
        if path is not None and not path.parent.is_dir():
            raise ReplayError(f"{flag} {path}: folder {path.parent} does not exist")
        if path is not None and path.is_dir():
            raise ReplayError(f"{flag} {path}: is a folder; name a file")
    if args.events_drain_timeout < 0:
        raise ReplayError("--events-drain-timeout must be >= 0")
    return ReplayOptions(
        input=args.input,
        mode=args.mode,
        cut=Cut(args.start, args.duration, args.fps),
        url=args.url,
        token=args.token,
        wire=args.wire,
        out=args.out,
        codec=codec,
        jsonl=args.jsonl,
        summary_json=args.summary_json,
        events=args.events,
        events_drain_s=args.events_drain_timeout,
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
    opts = options_from_args(args)
    config = config_from_args(args)
    setup_logging(config.logging.level)
    if not opts.url:  # in process: the engine serve would run here, chosen before the loop
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ...engines.choice import resolve_engine

        config = resolve_engine(config)
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
    """``python -m edge_vision.tools.replay INPUT ...``; the same as ``edge-vision replay``."""
    parser = CommandParser(
        prog="python -m edge_vision.tools.replay",
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
