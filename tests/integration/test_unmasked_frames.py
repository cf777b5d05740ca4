"""Unmasked client frames fail the connection with 1002 (RFC 6455 section 5.1: "a server
MUST close the connection upon receiving a frame that is not masked"), with aiohttp's C
reader and its pure-Python one (AIOHTTP_NO_EXTENSIONS=1), both of which accept them.
"""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ..support.raw_ws import CLOSE, PING, TEXT, frame, handshake
from ..support.server import ServerProcess
from ..support.timing import T

READERS = {"c": {}, "python": {"AIOHTTP_NO_EXTENSIONS": "1"}}


def reader_module(env: dict[str, str]) -> str:
    """Which of aiohttp's WebSocket readers a process with ``env`` loads."""
    code = "import aiohttp._websocket.reader as r; print(r.WebSocketReader.__module__)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return out.stdout.strip()


@pytest.fixture(params=sorted(READERS))
async def node(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ServerProcess]:
    import os

    env = {**os.environ, **READERS[request.param]}
    module = await asyncio.to_thread(reader_module, env)
    assert module.endswith("reader_py" if request.param == "python" else "reader_c")
    srv = ServerProcess(env=READERS[request.param], log_path=tmp_path / "server.log")
    await asyncio.to_thread(srv.start)
    try:
        await srv.wait_ready()
        yield srv
    finally:
        await asyncio.to_thread(srv.stop)


async def _close_code(raw: object) -> int:
    """Read frames until the server's close frame; its code."""
    for _ in range(5):
        opcode, payload = await raw.read_frame(timeout=T(10))  # type: ignore[attr-defined]
        if opcode == CLOSE:
            code: int = struct.unpack(">H", payload[:2])[0]
            return code
    raise AssertionError("no close frame")


async def test_an_unmasked_frame_mid_session_is_closed_with_1002(node: ServerProcess) -> None:
    raw = await handshake(node.port, "/ws")
    assert raw.status == 101
    await raw.read_frame()  # hello
    raw.send(PING, b"still masked")  # a masked frame first: the session is fine
    raw.send(TEXT, b'{"type":"ping","payload":1}')
    assert (await raw.read_frame())[0] in (0xA, TEXT)
    raw.send(TEXT, b'{"type":"ping","payload":2}', masked=False)
    assert await _close_code(raw) == 1002
    raw.close_with_reset()


async def test_an_unmasked_frame_sent_with_the_handshake_is_closed_with_1002(
    node: ServerProcess,
) -> None:
    # In the same packet as the upgrade request: aiohttp reads it before the WebSocket
    # exists, and hands it over with the socket.
    unmasked = frame(TEXT, b'{"type":"ping","payload":3}', masked=False)
    raw = await handshake(node.port, "/ws", then=unmasked)
    assert raw.status == 101
    assert await _close_code(raw) == 1002
    raw.close_with_reset()
    log = ""
    for _ in range(int(T(5) / 0.1)):  # the line is written just after the close frame
        log = await asyncio.to_thread(node.log)
        if "not masked" in log:
            break
        await asyncio.sleep(0.1)
    assert "not masked" in log, log[-2000:]
