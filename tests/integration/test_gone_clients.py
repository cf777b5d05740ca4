"""Clients that go away without reading cost nothing once they are gone (issue 36).

Against a real server on a loopback port, with clients on bare sockets
(tests/support/raw_ws.py) that do what a crashed camera does: stream in ``every`` mode,
then close with a FIN or a reset, never reading a result.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from ..support.clients import frame_binary
from ..support.images import text_scene
from ..support.raw_ws import BINARY, RawSocket, handshake
from ..support.scrape import metric, metrics_text
from ..support.server import RunningServer
from ..support.timing import T


async def _sessions(http: aiohttp.ClientSession, srv: RunningServer) -> list[dict[str, Any]]:
    async with http.get(srv.url + "/api/sessions") as r:
        body: dict[str, Any] = await r.json()
    sessions: list[dict[str, Any]] = body["sessions"]
    return sessions


async def _until(check: Callable[[], Any], timeout: float, what: str) -> float:
    """Poll the coroutine function ``check`` until it returns truthy; the seconds it took."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout:.1f} s: {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def _streaming_zombies(
    srv: RunningServer, http: aiohttp.ClientSession, n: int
) -> list[RawSocket]:
    """``n`` clients in every mode that each sent 30 frames, read nothing but hello, and
    have filled their session's queue on the server."""
    jpg = text_scene(640, 360).jpeg()
    clients = []
    for _ in range(n):
        raw = await handshake(srv.port, "/ws?mode=every")
        assert raw.status == 101
        await raw.read_frame()  # hello; nothing after it is ever read
        for i in range(30):
            raw.send(BINARY, frame_binary(i, float(i), jpg))
        clients.append(raw)

    async def queues_full() -> bool:
        sessions = await _sessions(http, srv)
        return len(sessions) == n and all(s["received"] >= 10 for s in sessions)

    await _until(queues_full, T(60), "every client's queue filled")
    return clients


@pytest.mark.parametrize("how", ["fin", "reset"])
async def test_every_mode_clients_gone_without_reading_free_their_slot_and_budget(
    server_factory: Any, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edge_vision")
    srv = await server_factory()
    async with aiohttp.ClientSession() as http:
        zombies = await _streaming_zombies(srv, http, 3)
        text = await metrics_text(http, srv.url)
        # Their waiting frames are charged to the budget.
        assert metric(text, 'edge_vision_memory_held_bytes{kind="frames"}') > 0
        for raw in zombies:
            raw.close_with_fin() if how == "fin" else raw.close_with_reset()

        async def all_gone() -> bool:
            text = await metrics_text(http, srv.url)
            sessions = await _sessions(http, srv)
            return (
                not any(s["connected"] for s in sessions)
                and metric(text, 'edge_vision_memory_held_bytes{kind="frames"}') == 0
                and metric(text, "edge_vision_connections") == 0
            )

        took = await _until(all_gone, T(5), "the sessions of gone clients ended")
        sessions = await _sessions(http, srv)
        readyz = await http.get(srv.url + "/readyz")
        assert readyz.status == 200
    # Every frame of theirs is in the books: answered (sent before the close was seen),
    # dropped (closed on) or rejected; none is left "in flight".
    for s in sessions:
        assert s["received"] == s["answered"] + s["dropped"] + s["rejected"], s
        assert s["dropped"] > 0, s
        # The end is logged, once (whichever way it was found: a failed send, usually).
        said = [r.getMessage() for r in caplog.records if s["id"] in r.getMessage()]
        assert len([m for m in said if "client" in m]) == 1, said
    print(f"{how}: {len(zombies)} gone clients' sessions ended within {took:.2f} s")
