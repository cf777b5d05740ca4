"""Bad input is answered with an error, the connection serves on, nobody else notices."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from typing import Any

import aiohttp
import pytest

from edge_vision.common.aio import with_timeout

from ..support.clients import connect, frame_binary, frame_json, recv, recv_type
from ..support.images import png_header_only, text_scene
from ..support.scrape import metrics_text
from ..support.server import RunningServer
from ..support.timing import T

GOOD = text_scene(640, 360)
JPG = GOOD.jpeg()


def _cases() -> list[tuple[str, str | bytes, str]]:
    b64 = base64.b64encode(JPG).decode()
    return [
        ("invalid JSON", "{'type': frame", "bad_json"),
        ("unknown type", '{"type":"video","id":1}', "unknown_type"),
        ("missing id", f'{{"type":"frame","image":"{b64[:40]}"}}', "bad_field"),
        ("missing image", '{"type":"frame","id":3}', "bad_field"),
        ("broken base64", '{"type":"frame","id":4,"image":"%%%not-base64%%%"}', "bad_base64"),
        (
            "not an image",
            frame_json(5, 1, b"hello, I am plain text, not a JPEG"),
            "unsupported_image",
        ),
        ("truncated JPEG", frame_binary(6, 1, JPG[: len(JPG) // 3]), "bad_image"),
        (
            "over the pixel limit",
            frame_binary(7, 1, png_header_only(40_000, 40_000)),
            "image_too_large",
        ),
        ("corrupt PNG body", frame_binary(8, 1, png_header_only(200, 100)), "bad_image"),
        ("binary header garbage", b"\x00\x00\x00\x05{abc}" + JPG, "bad_json"),
    ]


async def _send(ws: aiohttp.ClientWebSocketResponse, payload: str | bytes) -> None:
    if isinstance(payload, bytes):
        await ws.send_bytes(payload)
    else:
        await ws.send_str(payload)


@pytest.mark.parametrize(("name", "payload", "code"), _cases(), ids=[c[0] for c in _cases()])
async def test_bad_input_gets_an_error_and_the_next_frame_is_served(
    server: RunningServer, name: str, payload: str | bytes, code: str
) -> None:
    async with aiohttp.ClientSession() as s:
        ws, _ = await connect(s, server.ws_url)
        await _send(ws, payload)
        err = await recv_type(ws, "error")
        assert err["code"] == code, err
        assert err["message"]
        await ws.send_bytes(frame_binary(100, 5.0, JPG))
        res = await recv_type(ws, "result")
        assert res["id"] == 100 and res["detections"]
        await ws.close()


async def test_errors_name_the_frame_when_it_is_known(server: RunningServer) -> None:
    async with aiohttp.ClientSession() as s:
        ws, _ = await connect(s, server.ws_url)
        await ws.send_bytes(frame_binary("cam7-0042", 1.0, b"\xff\xd8\xff\xe0 broken"))
        err = await recv_type(ws, "error")
        await ws.close()
    assert err["id"] == "cam7-0042" and err["code"] == "bad_image"


async def test_message_over_the_size_limit_closes_with_1009(server_factory: Any) -> None:
    srv = await server_factory({"server": {"max_message_bytes": 2 * 1024 * 1024}})
    async with aiohttp.ClientSession() as s:
        ws, _ = await connect(s, srv.ws_url)
        await ws.send_bytes(b"\x00" * (3 * 1024 * 1024))
        msg = await ws.receive(timeout=T(30))
        assert msg.type is aiohttp.WSMsgType.CLOSE, msg
        assert ws.close_code == 1009


async def test_a_50_mb_message_costs_nobody_else_a_frame(server_factory: Any) -> None:
    srv = await server_factory({"server": {"max_message_bytes": 8 * 1024 * 1024}})
    async with aiohttp.ClientSession() as s:
        bystander, _ = await connect(s, srv.ws_url + "?mode=every")
        abuser, _ = await connect(s, srv.ws_url)
        answered: list[int] = []

        async def stream() -> None:
            for i in range(8):
                await bystander.send_bytes(frame_binary(i, float(i), JPG))
                answered.append((await recv_type(bystander, "result"))["id"])

        streaming = asyncio.create_task(stream())
        try:
            await abuser.send_bytes(b"\x00" * (50 * 1024 * 1024))
        except ConnectionError:
            pass  # the server hung up mid-message, as it should
        msg = await abuser.receive(timeout=T(30))
        assert msg.type in (
            aiohttp.WSMsgType.CLOSE,
            aiohttp.WSMsgType.CLOSED,
            aiohttp.WSMsgType.ERROR,
        )
        await with_timeout(streaming, T(60))
        metrics = await metrics_text(s, srv.url)
        await bystander.close()
    assert answered == list(range(8))
    assert 'edge_vision_connections_closed_total{reason="message_too_large"} 1.0' in metrics


async def test_bad_input_on_one_connection_does_not_disturb_another(server: RunningServer) -> None:
    async with aiohttp.ClientSession() as s:
        good, _ = await connect(s, server.ws_url + "?mode=every")
        # 'every' so that each bad frame is answered (latest-wins would drop some of them).
        bad, _ = await connect(s, server.ws_url + "?mode=every")
        for i in range(6):
            await good.send_bytes(frame_binary(i, float(i), JPG))
            for _, payload, _code in _cases():
                await _send(bad, payload)
        codes = [(await recv_type(bad, "error"))["code"] for _ in range(6 * len(_cases()))]
        results = [await recv(good) for _ in range(6)]
        await good.close()
        await bad.close()
    assert [r["id"] for r in results] == list(range(6))
    assert all(r["type"] == "result" and r["detections"] for r in results)
    # Parse errors are answered at once, image errors after decoding: compare as multisets.
    assert Counter(codes) == Counter(c for _ in range(6) for _, _, c in _cases())
