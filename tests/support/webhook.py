"""A real HTTP receiver for webhook tests: an aiohttp app on a free loopback port that
records every POST (headers and body), checks its HMAC-SHA256 signature, and answers with
the status the test sets (``status``; a set of event ids to refuse with 400: ``refuse``)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


@dataclass
class Received:
    body: dict[str, Any]
    signature_ok: bool | None  # None: no signature header
    event_id_header: str | None


@dataclass
class WebhookReceiver:
    secret: bytes | None = None
    status: int = 200
    refuse: set[str] = field(default_factory=set)
    received: list[Received] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _hook(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = orjson.loads(raw)
        sig = request.headers.get("X-Edge-Vision-Signature")
        ok = None
        if sig is not None and self.secret is not None:
            want = "sha256=" + hmac.new(self.secret, raw, hashlib.sha256).hexdigest()
            ok = hmac.compare_digest(sig, want)
        if self.status != 200:
            return web.Response(status=self.status)
        if body.get("event_id") in self.refuse:
            return web.Response(status=400, text="refused")
        self.received.append(Received(body, ok, request.headers.get("X-Edge-Vision-Event-Id")))
        self._changed.set()
        return web.Response(status=204)

    async def start(self, port: int = 0) -> WebhookReceiver:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port or self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_for(self, n: int, timeout: float) -> list[Received]:
        """Until at least ``n`` events were received (TimeoutError after ``timeout``)."""
        async with asyncio.timeout(timeout):
            while len(self.received) < n:
                self._changed.clear()
                await self._changed.wait()
        return self.received
