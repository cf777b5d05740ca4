"""One tracker per session, and it survives a resume (docs/state.md, docs/protocol.md
"Track ids"): real servers, real clients, a real redis-server between two nodes.

* a label keeps its track id across a reconnect with the resume token, on the same node
  or on another one sharing Redis, and a label that appears after the resume gets an id
  the session never gave before;
* the text read in a box rides the same id the result sends with it, and stays on it
  across a resume.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from edge_vision.config import ModelConfig
from edge_vision.model.spec import ModelSpec, load_model_spec

from ..support.assertions import iou
from ..support.clients import connect, frame_binary, recv_type
from ..support.images import Scene, text_scene
from ..support.redis_server import RedisServer
from ..support.server import RunningServer

pytestmark = pytest.mark.timeout(180)

Factory = Callable[..., Awaitable[RunningServer]]
W, H = 640, 360
FIRST = [("LOT42", (60, 120)), ("K4771", (380, 220))]
LATER = ("ZX900", (300, 40))
DECOY = ("Q8Q8", (250, 300))


@pytest.fixture(scope="module")
def small_spec() -> ModelSpec:
    """The default model at a 320-pixel input: quick on two shared CPU cores."""
    return load_model_spec(ModelConfig(input_size=320))


def scene(texts: list[tuple[str, tuple[int, int]]], seed: int = 0) -> Scene:
    return text_scene(W, H, texts=texts, font_size=36, seed=seed)


def ids_where_drawn(result: dict[str, Any], where: Scene) -> list[int]:
    """The track id of the detection over each drawn label, in drawing order."""
    out = []
    for box in where.text_boxes:
        hits = sorted(result["detections"], key=lambda d: -iou(d["box"], box))
        assert hits and iou(hits[0]["box"], box) >= 0.3, (box, result["detections"])
        out.append(int(hits[0]["track"]))
    return out


async def result_of(ws: aiohttp.ClientWebSocketResponse, fid: int, image: Scene) -> dict[str, Any]:
    await ws.send_bytes(frame_binary(fid, fid * 66.7, image.jpeg(92)))
    return await recv_type(ws, "result", timeout=60)


def node(redis_url: str | None, node_id: str) -> dict[str, Any]:
    state: dict[str, Any] = {"node_id": node_id, "heartbeat_s": 0.3, "node_ttl_s": 2.0}
    if redis_url:
        state["redis_url"] = redis_url
    return {
        "state": state,
        "engine": {"onnxruntime": {"threads": 1}, "warmup_shapes": [(192, 320)]},
        "model": {"input_size": 320},
    }


async def stream_then_resume(
    http: aiohttp.ClientSession, first_url: str, second_url: str
) -> tuple[list[int], list[int], list[int], dict[str, Any]]:
    """Two labels for three frames on ``first_url``; a dropped socket; a resume on
    ``second_url`` with the same labels, then a third label. Returns the ids before, the
    ids after, the new label's ids and the second hello."""
    before = scene(FIRST)
    ws, hello = await connect(http, first_url)
    # A label seen once and gone: it takes id 1, so the session's ids do not begin at 1
    # for the labels that stay (a tracker started afresh would give them 1 and 2).
    decoy = scene([DECOY])
    (gone,) = ids_where_drawn(await result_of(ws, 0, decoy), decoy)
    for i in range(1, 4):
        ids = ids_where_drawn(await result_of(ws, i, before), before)
    assert gone not in ids
    await ws.close(code=4000)  # not 1000: a dropped network, the session stays resumable
    ws2, again = await connect(http, second_url, params={"resume": hello["resume_token"]})
    after = ids_where_drawn(await result_of(ws2, 10, before), before)
    more = scene([*FIRST, LATER], seed=1)
    grown = ids_where_drawn(await result_of(ws2, 11, more), more)
    await ws2.close()
    return ids, after, grown, again


async def test_a_session_resumed_on_the_same_node_keeps_its_labels_ids_and_counts_on(
    server_factory: Factory, small_spec: ModelSpec
) -> None:
    srv = await server_factory(node(None, "node-a"), small_spec)
    async with aiohttp.ClientSession() as http:
        ids, after, grown, again = await stream_then_resume(http, srv.ws_url, srv.ws_url)
    assert again["resumed"] is True
    assert len(set(ids)) == 2 and after == ids  # the same labels, the same ids
    assert grown[:2] == ids and grown[2] > max(ids)  # the new one: an id never given before


@pytest.mark.redis
async def test_a_session_resumed_on_another_node_keeps_its_labels_ids_and_counts_on(
    redis_server: RedisServer, server_factory: Factory, small_spec: ModelSpec
) -> None:
    a = await server_factory(node(redis_server.url, "node-a"), small_spec)
    b = await server_factory(node(redis_server.url, "node-b"), small_spec)
    async with aiohttp.ClientSession() as http:
        ids, after, grown, again = await stream_then_resume(http, a.ws_url, b.ws_url)
    assert again["resumed"] is True and again["node"] == "node-b"
    assert len(set(ids)) == 2 and after == ids
    assert grown[:2] == ids and grown[2] > max(ids)


async def test_text_rides_the_id_its_label_is_sent_with_across_a_resume(
    server: RunningServer,
) -> None:
    """Reading keeps what a label said on the session's own track ids: the id a result
    sends with a box is the one its text was read on, frame after frame and after a
    resume (once, reading kept a second tracker of its own, and a resume started the
    session's ids at 1 again)."""
    labels = [("LOT42", (80, 200)), ("K4771", (700, 420))]
    seen: dict[int, set[str | None]] = {}
    async with aiohttp.ClientSession() as http:
        ws, hello = await connect(http, server.ws_url)
        await ws.send_str(orjson.dumps({"type": "settings", "read": True}).decode())
        await recv_type(ws, "settings", timeout=120)  # the recogniser loads first
        token = hello["resume_token"]
        decoy = text_scene(1280, 720, texts=[("Q8Q8", (500, 600))], font_size=48)
        (first_id,) = ids_where_drawn(await result_of(ws, 99, decoy), decoy)
        for step in range(6):
            if step == 3:  # a reload half-way: the session and its tracks come back
                await ws.close(code=4001)
                ws, again = await connect(http, server.ws_url, params={"resume": token})
                assert again["resumed"] is True and again["settings"]["read"] is True
            moved = [(t, (x + 12 * step, y)) for t, (x, y) in labels]
            where = text_scene(1280, 720, texts=moved, font_size=48, seed=step)
            res = await result_of(ws, step, where)
            for track, (text, _) in zip(ids_where_drawn(res, where), labels, strict=True):
                read = [d["text"] for d in res["detections"] if d["track"] == track]
                seen.setdefault(track, set()).update(read)
                assert read and read[0] in (None, text), (step, track, read, text)
        await ws.close()
    assert len(seen) == 2, seen  # two labels, two ids from the first frame to the last
    assert first_id not in seen  # ids counted on from the decoy's, and on after the resume
    assert {t for texts in seen.values() for t in texts if t} == {"LOT42", "K4771"}
