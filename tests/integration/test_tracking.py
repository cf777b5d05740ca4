"""Track ids through the real server: moving text keeps its id; ``track: false`` drops them."""

from __future__ import annotations

import aiohttp
import pytest

from ..support.assertions import iou
from ..support.clients import connect, frame_binary, recv_type
from ..support.images import text_scene
from ..support.server import RunningServer

pytestmark = pytest.mark.timeout(120)

FRAMES = 24
STEP = 30  # pixels per frame


async def test_text_moving_across_a_clip_keeps_one_track_id(server: RunningServer) -> None:
    ids: list[int] = []
    async with aiohttp.ClientSession() as s:
        ws, _ = await connect(s, server.ws_url)
        for i in range(FRAMES):
            scene = text_scene(texts=[("LOT 7734-XQ", (80 + STEP * i, 300))], seed=i)
            await ws.send_bytes(frame_binary(i, None, scene.jpeg()))
            res = await recv_type(ws, "result")
            # the detection of the moving label: the one that overlaps where it was drawn
            hits = [d for d in res["detections"] if iou(d["box"], scene.text_boxes[0]) >= 0.3]
            assert hits, f"frame {i}: label not found in {res['detections']}"
            ids.append(hits[0]["track"])
        await ws.close()
    most = max(set(ids), key=ids.count)
    assert ids.count(most) / len(ids) >= 0.95, ids


async def test_track_false_turns_track_ids_off(server: RunningServer) -> None:
    scene = text_scene()
    async with aiohttp.ClientSession() as s:
        ws, hello = await connect(s, server.ws_url)
        assert hello["settings"]["track"] is True
        await ws.send_bytes(frame_binary(1, None, scene.jpeg()))
        on = await recv_type(ws, "result")
        await ws.send_json({"type": "settings", "track": False})
        ack = await recv_type(ws, "settings")
        await ws.send_bytes(frame_binary(2, None, scene.jpeg()))
        off = await recv_type(ws, "result")
        await ws.close()
    assert on["detections"] and all(isinstance(d["track"], int) for d in on["detections"])
    assert ack["track"] is False
    assert off["detections"] and all("track" not in d for d in off["detections"])
