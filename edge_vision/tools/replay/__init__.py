"""``edge-vision replay`` (also ``python -m edge_vision.tools.replay``): recorded video through
the service, to annotate a clip, to measure the service, or to feed a running server as a
camera would.

``INPUT`` is a video file (anything OpenCV's FFmpeg reads), a folder of images, an
RTSP/HTTP URL or a camera index (:mod:`edge_vision.common.sources`). Frames are JPEG-encoded as
a camera client would send them and served either

* in-process, by the same objects the server builds (``InferenceService`` +
  ``FramePipeline``, and one connection's :class:`~edge_vision.session.core.SessionCore`
  with the server's limits, so admission, drops and reply order are the server's), or
* by a running server over ``--url ws://host:8080/ws``, exactly as a camera client: through
  :class:`edge_vision.client.EdgeVisionClient` (docs/client.md).

Pacing: ``--every-frame`` answers every frame, in order, as fast as the engine goes
(the server's ``every`` mode); ``--realtime`` offers frames at the source's own rate and
latest wins (``latest`` mode): a frame that waits while a newer one arrives is dropped and
counted, as with a live camera.

Outputs, all in frame order: ``--out`` an annotated video (each frame carries its own
result; frames without one are marked), ``--jsonl`` one line per frame, and a summary
(frames, answered, dropped, fps, latency p50/p95/p99 per stage) on stdout and in
``--summary-json``; with ``--events``, or rules and sinks in the config, the events the
config's rules raise (:mod:`.events`: a JSONL file, and the sinks). Ctrl-C stops
reading, finishes the frames in flight (a second Ctrl-C abandons them) and still closes
every output properly; the exit code is then 130.

The modules, in the order a frame meets them:

=====================  ===============================================================
``options``            :class:`ReplayOptions`, :class:`ReplayError`
``run``                :class:`Replay`: read and pace frames, Ctrl-C, the summary
``target``             the :class:`Target` interface: where frames are answered
``local_target``       :class:`LocalTarget`: in-process, under the server's session runner
``remote_target``      :class:`RemoteTarget`: a running server, through the client
``books``              outcomes, :class:`InOrder` (frame order), :class:`ReplayStats`
``events``             the config's rules over the answered frames: ``--events``, sinks
``writers``            JSONL lines, the annotated video, the summary text
``command``            the command line: arguments, ``main``, ``register_cli``
=====================  ===============================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .books import STAGES, Encoded, FrameRecord, InOrder, Outcome, ReplayStats, percentiles
from .command import DESCRIPTION, add_arguments, cmd_replay, main, options_from_args, register_cli
from .local_target import LocalTarget
from .options import ReplayError, ReplayOptions
from .run import WRITE_BACKLOG, Replay, replay
from .target import Deliver, Target
from .writers import Recorder, annotated, format_summary, jsonl_line

if TYPE_CHECKING:
    from .remote_target import REALTIME_WINDOW, RemoteTarget, websocket_url

_REMOTE = frozenset(("REALTIME_WINDOW", "RemoteTarget", "websocket_url"))


def __getattr__(name: str) -> Any:
    """The remote target's names, imported when first asked for: ``edge-vision`` builds its
    parser from this package, and the client (aiohttp) is needed only with ``--url``."""
    if name in _REMOTE:
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from . import remote_target

        return getattr(remote_target, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DESCRIPTION",
    "REALTIME_WINDOW",
    "STAGES",
    "WRITE_BACKLOG",
    "Deliver",
    "Encoded",
    "FrameRecord",
    "InOrder",
    "LocalTarget",
    "Outcome",
    "Recorder",
    "RemoteTarget",
    "Replay",
    "ReplayError",
    "ReplayOptions",
    "ReplayStats",
    "Target",
    "add_arguments",
    "annotated",
    "cmd_replay",
    "format_summary",
    "jsonl_line",
    "main",
    "options_from_args",
    "percentiles",
    "register_cli",
    "replay",
    "websocket_url",
]
