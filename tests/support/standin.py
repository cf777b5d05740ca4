"""A stand-in for an edge_vision node with a known latency and a label in known motion, for
testing what the overlay page draws (latency compensation, docs/overlay.md).

It serves the real page (edge_vision/web/) and speaks the protocol on ``/ws`` (hello,
settings, ping; frames in either form), but answers every frame after exactly ``delay_s``
with one box where a label moving at a constant speed was at the frame's own ``ts``: the
truth about any moment is :meth:`Motion.box_at`. It runs its own event loop in a thread, for
the sync browser tests.
"""

from __future__ import annotations

import asyncio
import base64
import io
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import WSMsgType, web
from PIL import Image

from edge_vision.errors import ClientError
from edge_vision.serve.server import PACKAGE_WEB
from edge_vision.session.receive import PingMessage, SettingsMessage, parse_binary, parse_text

from .server import free_port


@dataclass(frozen=True)
class Motion:
    """A label ``size`` frame pixels large crossing the frame left to right at ``speed`` px/s
    from ``x0``, over and over: each ``period_s`` a new label (a new track id) starts again
    at ``x0``. ``t0`` is the epoch in ms (the browser stamps frames with its wall clock).
    Each answer's box is off the truth by up to ``jitter_px`` on every side, as a detector's
    boxes are from frame to frame."""

    t0: float
    speed: float = 80.0
    x0: float = 20.0
    y: float = 150.0
    size: tuple[float, float] = (120.0, 40.0)
    period_s: float = 6.0
    jitter_px: float = 2.0

    def phase_s(self, ts: float) -> float:
        """Seconds since the current label started."""
        return ((ts - self.t0) / 1000.0) % self.period_s

    def track_at(self, ts: float) -> int:
        return 1 + int((ts - self.t0) / 1000.0 // self.period_s)

    def box_at(self, ts: float) -> tuple[float, float, float, float]:
        """Where the label is at ``ts`` (ms since the epoch), in frame pixels."""
        x1 = self.x0 + self.speed * self.phase_s(ts)
        return (x1, self.y, x1 + self.size[0], self.y + self.size[1])


def image_size(image: bytes) -> tuple[int, int]:
    """A JPEG's or PNG's width and height, from its header."""
    with Image.open(io.BytesIO(image)) as im:
        return im.size


class StandInNode:
    """The stand-in's app; :func:`standin_node` runs it."""

    def __init__(self, motion: Motion, delay_s: float) -> None:
        self.motion = motion
        self.delay_s = delay_s
        self.frames = 0
        self.sessions = 0
        self.jitter = random.Random(33)
        self.sockets: set[web.WebSocketResponse] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._page)
        app.router.add_get("/ws", self._ws)
        app.router.add_static("/static/", PACKAGE_WEB)
        app.on_shutdown.append(self._close_sockets)
        return app

    async def _close_sockets(self, _app: web.Application) -> None:
        for ws in list(self.sockets):
            await ws.close(code=1001, message=b"stand-in stopping")

    async def _page(self, _request: web.Request) -> web.StreamResponse:
        return web.FileResponse(PACKAGE_WEB / "index.html")

    def hello(self) -> dict[str, Any]:
        self.sessions += 1
        settings = {"mode": "latest", "confidence": 0.5, "classes": None, "track": True}
        settings |= {"input_size": None, "read": False}
        return {
            "type": "hello",
            "protocol": 3,
            "protocols": [2, 3],
            "features": ["binary_frames", "resume", "track", "input_size"],
            "session_id": f"standin{self.sessions}",
            "resume_token": f"standin{self.sessions}.token",
            "resumed": False,
            "node": "stand-in",
            "model": "stand-in",
            "labels": ["text"],
            "engine": {"configured": "stand-in", "active": "stand-in", "degraded": False},
            "mode": "latest",
            "settings": settings,
            "limits": {
                "max_message_bytes": 8 * 1024 * 1024,
                "max_pixels": 40_000_000,
                "input_size": 640,
                "input_sizes": [640],
                "max_batch": 1,
                "formats": ["jpeg", "png"],
                "binary_frames": True,
            },
            "counters": {"received": 0, "answered": 0, "dropped": 0, "rejected": 0},
        }

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("edge-vision",))
        await ws.prepare(request)
        self.sockets.add(ws)
        try:
            await self._serve(ws)
        finally:
            self.sockets.discard(ws)
        return ws

    async def _serve(self, ws: web.WebSocketResponse) -> None:
        hello = self.hello()
        settings = dict(hello["settings"])
        await ws.send_str(orjson.dumps(hello).decode())
        replies: set[asyncio.Task[None]] = set()
        async for msg in ws:
            try:
                if msg.type is WSMsgType.BINARY:
                    parsed: Any = parse_binary(msg.data, time.perf_counter())
                elif msg.type is WSMsgType.TEXT:
                    parsed = parse_text(msg.data, time.perf_counter())
                else:
                    continue
            except ClientError as e:
                await ws.send_str(orjson.dumps({"type": "error", "code": e.code}).decode())
                continue
            if isinstance(parsed, PingMessage):
                await ws.send_str(
                    orjson.dumps({"type": "pong", "payload": parsed.payload}).decode()
                )
            elif isinstance(parsed, SettingsMessage):
                if parsed.confidence is not None:
                    settings["confidence"] = parsed.confidence
                if parsed.track is not None:
                    settings["track"] = parsed.track
                await ws.send_str(orjson.dumps({"type": "settings", **settings}).decode())
            else:
                image = base64.b64decode(parsed.image) if parsed.image_is_base64 else parsed.image
                task = asyncio.create_task(self._answer(ws, parsed.id, parsed.ts, image))
                replies.add(task)
                task.add_done_callback(replies.discard)

    async def _answer(self, ws: web.WebSocketResponse, fid: Any, ts: Any, image: bytes) -> None:
        """The frame's result, exactly ``delay_s`` after it came: the label where it was at
        the frame's own time (in the frame's pixels, whatever its size)."""
        await asyncio.sleep(self.delay_s)
        width, height = image_size(image)
        j = self.motion.jitter_px
        det = {
            "box": [c + self.jitter.uniform(-j, j) for c in self.motion.box_at(float(ts))],
            "score": 0.9,
            "class": 0,
            "label": "text",
            "track": self.motion.track_at(float(ts)),
        }
        self.frames += 1
        result = {"type": "result", "id": fid, "ts": ts, "width": width, "height": height}
        result |= {"detections": [det], "timing": {"server_ms": self.delay_s * 1000}, "dropped": 0}
        if not ws.closed:
            await ws.send_str(orjson.dumps(result).decode())


@contextmanager
def standin_node(motion: Motion, delay_s: float) -> Iterator[tuple[str, StandInNode]]:
    """Run a :class:`StandInNode` on a free loopback port in a thread of its own; yields its
    base URL and the node."""
    node = StandInNode(motion, delay_s)
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(node.app(), access_log=None)

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    thread = threading.Thread(target=loop.run_forever, name="standin-node", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    try:
        yield f"http://127.0.0.1:{port}", node
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
