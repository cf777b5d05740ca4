"""Round trips through a real server on a real port, with two independent client libraries."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
import websockets

from edge_vision.common.aio import with_timeout
from edge_vision.session.receive import PROTOCOL_VERSION

from ..support.assertions import (
    assert_box_overlaps,
    assert_boxes_inside_frame,
    assert_no_detections,
    assert_timings_present,
)
from ..support.clients import connect, frame_binary, frame_json, recv_type
from ..support.images import blank_scene, text_scene
from ..support.reference import reference_box
from ..support.server import RunningServer
from ..support.timing import T

TS = 1732950000123.4


async def test_hello_describes_session_model_and_limits(server: RunningServer) -> None:
    async with aiohttp.ClientSession() as s:
        ws, hello = await connect(s, server.ws_url)
        assert hello["protocol"] == PROTOCOL_VERSION
        assert hello["session_id"] and hello["resume_token"].startswith(hello["session_id"])
        assert hello["model"] == "PP-OCRv6_det_small"
        assert hello["labels"] == ["text"]
        assert hello["mode"] == "latest"
        assert hello["limits"]["max_pixels"] > 0 and hello["limits"]["max_message_bytes"] > 0
        await ws.close()


@pytest.mark.parametrize("wire", ["json", "json_data_url", "binary"])
async def test_aiohttp_client_gets_text_boxes_with_id_and_ts_echoed(
    server: RunningServer, wire: str
) -> None:
    scene = text_scene(1280, 720)
    jpg = scene.jpeg()
    async with aiohttp.ClientSession() as s:
        ws, _ = await connect(s, server.ws_url)
        if wire == "binary":
            await ws.send_bytes(frame_binary(17, TS, jpg))
        else:
            await ws.send_str(frame_json(17, TS, jpg, data_url=wire == "json_data_url"))
        res = await recv_type(ws, "result")
        await ws.close()
    assert res["id"] == 17 and res["ts"] == TS
    assert (res["width"], res["height"]) == (1280, 720)
    assert_box_overlaps(res, scene.text_boxes[0], iou_min=0.5)
    assert_boxes_inside_frame(res)
    assert_timings_present(res)
    assert res["dropped"] == 0
    assert res["detections"][0]["label"] == "text" and res["detections"][0]["class"] == 0


@pytest.mark.parametrize("wire", ["json", "binary"])
async def test_websockets_library_round_trip(server: RunningServer, wire: str) -> None:
    scene = text_scene(960, 540, texts=[("LOT 0042", (300, 200))])
    async with websockets.connect(server.ws_url, max_size=None) as ws:
        hello = orjson.loads(await with_timeout(ws.recv(), T(10)))
        assert hello["type"] == "hello"
        frame_id = "cam-1/000123"
        if wire == "binary":
            await ws.send(frame_binary(frame_id, 12.5, scene.jpeg()))
        else:
            await ws.send(frame_json(frame_id, 12.5, scene.jpeg()))
        res = orjson.loads(await with_timeout(ws.recv(), T(30)))
    assert res["type"] == "result"
    assert res["id"] == frame_id and res["ts"] == 12.5
    # A short line ("LOT 0042"): DB grows its box around the text's kernel by D = A·1.6/L,
    # so against the ink's tight box the IoU sits near 0.5 by construction (0.49 since the
    # unclip is the reference's integer one). What the service must give is the reference
    # pipeline's box for this frame at the same input: checked against that instead.
    ref = await asyncio.to_thread(reference_box, scene.rgb[:, :, ::-1].copy())
    assert_box_overlaps(res, ref, iou_min=0.7)
    assert_box_overlaps(res, scene.text_boxes[0], iou_min=0.45)
    assert_boxes_inside_frame(res)
    assert_timings_present(res)


async def test_png_frame_and_portrait_frame_map_back_to_frame_pixels(server: RunningServer) -> None:
    scene = text_scene(480, 800, texts=[("ABC 123", (60, 500))], font_size=48)
    async with aiohttp.ClientSession() as s:
        ws, _ = await connect(s, server.ws_url)
        await ws.send_bytes(frame_binary(1, None, scene.png()))
        res = await recv_type(ws, "result")
        await ws.close()
    assert (res["width"], res["height"]) == (480, 800)
    assert res["ts"] is None
    assert_box_overlaps(res, scene.text_boxes[0])


async def test_frame_without_text_yields_no_detection(server: RunningServer) -> None:
    async with aiohttp.ClientSession() as s:
        ws, _ = await connect(s, server.ws_url)
        await ws.send_bytes(frame_binary(5, 1.0, blank_scene(1280, 720).jpeg()))
        res = await recv_type(ws, "result")
        await ws.close()
    assert_no_detections(res)
