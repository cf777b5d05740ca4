"""Resume tokens rotate on each resume since protocol 3 (issue 36): the resumed session's
hello carries a new token and the one it was resumed with stops working, on this node and
on another sharing the state store; protocol 2 and 1 connections keep the token they had.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import aiohttp
import pytest

from edge_vision.client import EdgeVisionClient
from edge_vision.serve.app_keys import CONNECTIONS

from ..support.clients import connect
from ..support.redis_server import RedisServer
from ..support.server import RunningServer
from ..support.timing import T


async def _hello(url: str, token: str | None = None, protocol: int | None = None) -> Any:
    """Open a connection (resuming ``token``), read hello, leave without ending the
    session (close code 1001: resumable)."""
    query = f"?protocol={protocol}" if protocol else ""
    protocols = ["edge-vision"] + ([f"edge-vision.resume.{token}"] if token else [])
    async with aiohttp.ClientSession() as http:
        ws, hello = await connect(http, url + query, protocols=protocols)
        await ws.close(code=1001)
    return hello


async def test_a_resume_hands_out_a_new_token_and_the_old_one_stops_working(
    server: RunningServer,
) -> None:
    first = await _hello(server.ws_url)
    assert first["protocol"] == 3
    resumed = await _hello(server.ws_url, first["resume_token"])
    assert resumed["resumed"] and resumed["session_id"] == first["session_id"]
    assert resumed["resume_token"] != first["resume_token"]
    # The copied token no longer takes the session: a new one starts.
    stolen = await _hello(server.ws_url, first["resume_token"])
    assert not stolen["resumed"] and stolen["session_id"] != first["session_id"]
    again = await _hello(server.ws_url, resumed["resume_token"])
    assert again["resumed"] and again["session_id"] == first["session_id"]
    assert again["resume_token"] not in (first["resume_token"], resumed["resume_token"])


@pytest.mark.parametrize("protocol", [1, 2])
async def test_older_protocols_keep_their_token(server: RunningServer, protocol: int) -> None:
    first = await _hello(server.ws_url, protocol=protocol)
    for _ in range(2):
        resumed = await _hello(server.ws_url, first["resume_token"], protocol=protocol)
        assert resumed["resumed"] and resumed["resume_token"] == first["resume_token"]


async def test_the_python_client_follows_the_rotation_across_reconnects(
    server: RunningServer,
) -> None:
    first = EdgeVisionClient(server.ws_url, retry_s=T(10))
    await first.connect()
    sid, token = first.hello.session_id, first.hello.resume_token
    await first.close(end_session=False)  # 1001: the session stays resumable
    async with EdgeVisionClient(server.ws_url, resume_token=token, retry_s=T(10)) as client:
        assert client.hello.resumed and client.hello.session_id == sid
        rotated = client.hello.resume_token
        assert rotated != token
        # The connection drops (cut on the node's side): the client resumes by itself,
        # with the token of the hello it holds, the rotated one.
        sock = server.app[CONNECTIONS][sid].ws.get_extra_info("socket")
        sock.shutdown(socket.SHUT_RDWR)  # no close frame: the client sees the connection lost
        deadline = time.monotonic() + T(20)
        while client.resumes < 1 and time.monotonic() < deadline:  # noqa: ASYNC110 (a counter)
            await asyncio.sleep(0.05)
        assert client.resumes == 1 and client.hello.resumed and client.hello.session_id == sid
        assert client.hello.resume_token not in (token, rotated)


@pytest.mark.redis
async def test_the_old_token_stops_working_on_another_node_too(
    server_factory: Any, redis_server: RedisServer
) -> None:
    state = {"redis_url": redis_server.url, "heartbeat_s": 0.2}
    a = await server_factory({"state": {**state, "node_id": "node-a"}})
    b = await server_factory({"state": {**state, "node_id": "node-b"}})
    first = await _hello(a.ws_url)
    resumed = await _hello(a.ws_url, first["resume_token"])
    assert resumed["resumed"]
    stolen = await _hello(b.ws_url, first["resume_token"])
    assert not stolen["resumed"]
    moved = await _hello(b.ws_url, resumed["resume_token"])
    assert moved["resumed"] and moved["session_id"] == first["session_id"]
