"""WebSocket client helpers shared by the functional tests.

Tests that stream as a camera would use the product's client, edge_vision.client, through
:func:`camera_client` (timeouts scaled by TEST_TIME_FACTOR). The raw helpers below stay
for tests that must send what no well-behaved client sends (malformed messages, floods)
or read the wire exactly.
"""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import orjson

from edge_vision.client import EdgeVisionClient
from edge_vision.session.receive import encode_binary_frame, encode_json_frame

from .timing import T


def camera_client(url: str, **kw: Any) -> EdgeVisionClient:
    """edge_vision.client for ``url``, its waits scaled for slow machines (``async with``)."""
    kw.setdefault("retry_s", T(30))
    kw.setdefault("reply_timeout_s", T(30))
    return EdgeVisionClient(url, **kw)


def frame_json(frame_id: Any, ts: Any, image: bytes, data_url: bool = False) -> str:
    if data_url:
        return encode_json_frame(
            frame_id, ts, "data:image/jpeg;base64," + base64.b64encode(image).decode()
        )
    return encode_json_frame(frame_id, ts, image)


def frame_binary(frame_id: Any, ts: Any, image: bytes) -> bytes:
    return encode_binary_frame(frame_id, ts, image)


async def recv(ws: aiohttp.ClientWebSocketResponse, timeout: float = 30) -> dict[str, Any]:
    msg = await ws.receive(timeout=T(timeout))
    if msg.type is not aiohttp.WSMsgType.TEXT:
        raise AssertionError(
            f"expected a text message, got {msg.type} {msg.data!r} (close code {ws.close_code})"
        )
    obj: dict[str, Any] = orjson.loads(msg.data)
    return obj


async def recv_type(
    ws: aiohttp.ClientWebSocketResponse, kind: str, timeout: float = 30
) -> dict[str, Any]:
    obj = await recv(ws, timeout)
    assert obj["type"] == kind, f"expected {kind}, got {obj}"
    return obj


async def connect(
    session: aiohttp.ClientSession, url: str, **kw: Any
) -> tuple[aiohttp.ClientWebSocketResponse, dict[str, Any]]:
    """Open a WebSocket and read its hello."""
    ws = await session.ws_connect(url, max_msg_size=0, **kw)
    hello = await recv_type(ws, "hello")
    return ws, hello
