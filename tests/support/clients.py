"""WebSocket client helpers shared by the functional tests."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import orjson

from edge_vision.receive import encode_binary_frame, encode_json_frame

from .timing import T


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
