"""Clients that go away, or never read, cost nothing once they are gone (issue 36).

Against a real server on a loopback port, with clients on bare sockets
(tests/support/raw_ws.py) that do what a crashed camera does (stream in ``every`` mode,
then close with a FIN or a reset, never reading a result) and what a hostile one does
(ask for large answers and never read them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ..support.clients import frame_binary
from ..support.images import text_scene
from ..support.raw_ws import BINARY, TEXT, RawSocket, handshake, server_sockets
from ..support.scrape import metric, metrics_text
from ..support.server import RunningServer, ServerProcess
from ..support.timing import T

MiB = 1024 * 1024
#: A protocol ping whose pong echoes 1 MiB back (docs/protocol.md, "ping").
BIG_PING = b'{"type":"ping","payload":"' + b"x" * MiB + b'"}'


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


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def _never_readers(port: int, n: int, pings: int = 8) -> list[RawSocket]:
    """``n`` clients that each ask for ``pings`` 1 MiB pongs and never read one."""
    clients = []
    for _ in range(n):  # all connected first: the first closes must not refuse the last
        raw = await handshake(port, "/ws")
        assert raw.status == 101
        await raw.read_frame()  # hello
        clients.append(raw)
    for raw in clients:
        for _ in range(pings):
            raw.send(TEXT, BIG_PING)
    return clients


async def test_clients_that_never_read_leave_no_socket_or_memory_behind(tmp_path: Path) -> None:
    # A real server process, so that its resident memory is its own; the default close
    # timeout (server.close_timeout_s, 5 s), a short send timeout to keep the test short.
    srv = ServerProcess("server.send_timeout_s=2", log_path=tmp_path / "server.log")
    await asyncio.to_thread(srv.start)
    clients: list[RawSocket] = []
    try:
        await srv.wait_ready()
        assert srv.proc is not None
        await asyncio.sleep(T(1))
        pid = srv.proc.pid
        idle = await asyncio.to_thread(_rss_mib, pid)
        clients = await _never_readers(srv.port, 12)

        async def stuck() -> bool:
            sockets = await asyncio.to_thread(server_sockets, srv.port)
            return sum(q for _, q in sockets) > 12 * MiB

        await _until(stuck, T(30), "the server's send queues filled")
        peak = await asyncio.to_thread(_rss_mib, pid)

        async def nothing_left() -> bool:
            sockets = await asyncio.to_thread(server_sockets, srv.port)
            return all(state != "ESTABLISHED" and q == 0 for state, q in sockets)

        # send_timeout_s (2) + the close handshake's wait (2) + close_timeout_s (5)
        took = await _until(nothing_left, T(9 + 6), "no established socket, no send queue")
        await asyncio.sleep(T(1))  # what the resets freed is handed back
        after = await asyncio.to_thread(_rss_mib, pid)
        print(
            f"12 never-reading clients: RSS idle {idle:.0f} MiB, stuck {peak:.0f} MiB, "
            f"{after:.0f} MiB after; sockets gone {took:.1f} s after the queues filled"
        )
        assert after - idle < 32, (idle, peak, after)
        async with aiohttp.ClientSession() as http:
            text = await metrics_text(http, srv.url)
        assert metric(text, 'edge_vision_connections_closed_total{reason="slow_client"}') == 12
        assert metric(text, "edge_vision_connections_reset_total") == 12
    finally:
        for c in clients:
            c.close_with_reset()
        await asyncio.to_thread(srv.stop)
    log = await asyncio.to_thread((tmp_path / "server.log").read_text)
    assert log.count("did not read its results") == 12, log[-3000:]
    assert log.count("the connection is reset") == 12, log[-3000:]


async def test_an_address_whose_clients_keep_not_reading_is_refused_for_a_while(
    server_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edge_vision")
    # Defaults: 3 strikes within 60 s, refused for 60 s; a short send timeout.
    srv = await server_factory({"server": {"send_timeout_s": 1}})
    clients = await _never_readers(srv.port, 4, pings=6)
    try:
        async with aiohttp.ClientSession() as http:

            async def all_closed() -> bool:
                text = await metrics_text(http, srv.url)
                return metric(text, "edge_vision_connections") == 0

            await _until(all_closed, T(15), "the never-reading clients were closed")
            refused = await handshake(srv.port, "/ws")
            body = await refused.reader.read(4096)
            refused.close_with_reset()
            text = await metrics_text(http, srv.url)
    finally:
        for c in clients:
            c.close_with_reset()
    assert refused.status == 503
    assert int(refused.headers["retry-after"]) > 50
    assert b"limits.slow_client_strikes" in body and b"limits.slow_client_penalty_s" in body
    assert metric(text, 'edge_vision_connections_refused_total{limit="slow_client"}') == 1
    said = [r.getMessage() for r in caplog.records if "is refused for" in r.getMessage()]
    assert len(said) == 1, said  # once, although a fourth strike came after the third


async def test_the_slow_client_penalty_can_be_lifted_for_loopback_benches(
    server_factory: Any,
) -> None:
    srv = await server_factory(
        {
            "server": {"send_timeout_s": 1, "close_timeout_s": 1},
            "limits": {"slow_client_penalty_s": 0},
        }
    )
    clients = await _never_readers(srv.port, 4, pings=6)
    try:
        async with aiohttp.ClientSession() as http:

            async def all_closed() -> bool:
                text = await metrics_text(http, srv.url)
                return metric(text, "edge_vision_connections") == 0

            await _until(all_closed, T(15), "the never-reading clients were closed")
        again = await handshake(srv.port, "/ws")
        assert again.status == 101
        again.close_with_reset()
    finally:
        for c in clients:
            c.close_with_reset()
