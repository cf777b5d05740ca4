"""Events on the session's own WebSocket (protocol 3, docs/events.md): a real server with
zones and rules, real clients, real frames.

* a label in a zone raises one ``appear`` after the result of the frame it first matched
  in, carrying that frame's id and ts and the detection's track; results carry zones;
* a protocol 2 client gets no events and no zones; the node's rules still run for it;
* a session's own zones and rules through ``settings``, refused saying why when wrong,
  kept across a resume without raising ``appear`` again;
* ``leave`` comes from the timer when the stream goes quiet, not only with a later frame;
* a rule with ``text`` reads the boxes it could match by itself, and its expression
  decides;
* the Python client hands events out typed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from edge_vision.client import Event

from ..support.assertions import iou
from ..support.clients import camera_client, connect, frame_binary, recv
from ..support.images import Scene, text_scene
from ..support.server import RunningServer
from ..support.timing import T
from .test_asyncapi import assert_valid_server_message

pytestmark = pytest.mark.timeout(180)

Factory = Callable[..., Awaitable[RunningServer]]
W, H = 640, 360
LEFT = [[0, 0], [0.5, 0], [0.5, 1], [0, 1]]
RIGHT = [[0.5, 0], [1, 0], [1, 1], [0.5, 1]]


def node_events(**events: Any) -> dict[str, Any]:
    return {
        "events": events,
        "engine": {"onnxruntime": {"threads": 1}, "warmup_shapes": [(192, 320)]},
        "model": {"input_size": 320},
    }


def scene(texts: list[tuple[str, tuple[int, int]]], seed: int = 0) -> Scene:
    return text_scene(W, H, texts=texts, font_size=36, seed=seed)


async def frame(
    ws: aiohttp.ClientWebSocketResponse, fid: Any, image: Scene, ts: float | None = None
) -> list[dict[str, Any]]:
    """Send a frame; its result and the events that follow it. (A ping sent once the
    result is here is answered after them: they leave right behind the result.)"""
    await ws.send_bytes(frame_binary(fid, fid * 100.0 if ts is None else ts, image.jpeg(92)))
    out = []
    while not out or out[-1]["type"] != "result":
        out.append(await recv(ws, timeout=60))
    await ws.send_str(orjson.dumps({"type": "ping", "payload": fid}).decode())
    while True:
        msg = await recv(ws, timeout=60)
        if msg["type"] == "pong":
            break
        out.append(msg)
    for msg in out:
        assert_valid_server_message(msg)  # docs/asyncapi.yaml describes each
    return out


def track_of(result: dict[str, Any], where: Scene, i: int = 0) -> dict[str, Any]:
    best = max(result["detections"], key=lambda d: iou(d["box"], where.text_boxes[i]))
    assert iou(best["box"], where.text_boxes[i]) >= 0.3, result["detections"]
    return best


async def settings(ws: aiohttp.ClientWebSocketResponse, **values: Any) -> dict[str, Any]:
    await ws.send_str(orjson.dumps({"type": "settings", **values}).decode())
    msg = await recv(ws, timeout=60)
    assert_valid_server_message(msg)
    return msg


async def test_a_label_in_a_zone_raises_one_appear_after_its_frame_s_result(
    server_factory: Factory,
) -> None:
    srv = await server_factory(
        node_events(
            zones={"left": LEFT, "right": RIGHT},
            rules=[{"name": "in-left", "on": "appear", "zone": "left"}],
        )
    )
    outside = scene([("LOT42", (400, 120))])  # the right half first
    inside = [scene([("LOT42", (60 + 10 * i, 120))], seed=i) for i in range(3)]
    async with aiohttp.ClientSession() as http:
        ws, hello = await connect(http, srv.ws_url)
        assert hello["protocol"] == 3 and "events" in hello["features"]
        # The node's zones, for a page to draw (hello's events, additive in protocol 3).
        zones = {"left": LEFT, "right": RIGHT}
        assert hello["events"] == {"zones": zones, "lines": {}, "anchor": "bottom_center"}
        assert_valid_server_message(hello)
        first = await frame(ws, 0, outside)
        msgs = [await frame(ws, i + 1, s) for i, s in enumerate(inside)]
        await ws.close()
    (result,) = first  # in the right zone: no event
    assert track_of(result, outside)["zones"] == ["right"]
    (result, event), *later = msgs
    det = track_of(result, inside[0])
    assert det["zones"] == ["left"]
    assert event["type"] == "event" and (event["rule"], event["on"]) == ("in-left", "appear")
    assert (event["frame_id"], event["ts"]) == (1, 100.0)  # the frame's own, as sent
    assert event["track"] == det["track"] and event["box"] == det["box"]
    assert event["zone"] == "left" and event["session"] == hello["session_id"]
    assert event["node"] == hello["node"] and len(event["event_id"]) == 32
    assert [[m["type"] for m in f] for f in later] == [["result"], ["result"]]  # once a track


async def test_a_protocol_2_client_gets_no_events_and_no_zones(server_factory: Factory) -> None:
    srv = await server_factory(
        node_events(zones={"left": LEFT}, rules=[{"name": "seen", "on": "appear"}])
    )
    image = scene([("LOT42", (60, 120))])
    async with aiohttp.ClientSession() as http:
        ws, hello = await connect(http, srv.ws_url + "?protocol=2")
        assert "zones" not in hello["settings"] and "events" not in hello
        msgs = await frame(ws, 1, image)
        refused = await settings(ws, rules=[{"name": "mine", "on": "appear"}])
        await ws.close()
        async with http.get(srv.url + "/metrics") as r:
            metrics = await r.text()
    (result,) = msgs  # the result alone
    assert result["detections"] and all("zones" not in d for d in result["detections"])
    assert refused["type"] == "error" and "protocol 3" in refused["message"]
    # The node's rule still ran for it (its sinks would have the event).
    assert 'edge_vision_events_raised_total{on="appear",source="node"} 1.0' in metrics


async def test_a_session_s_own_zones_and_rules_and_a_resume_that_raises_nothing_twice(
    server_factory: Factory,
) -> None:
    srv = await server_factory(node_events(zones={"left": LEFT}))
    image = scene([("LOT42", (60, 120))])
    own = {
        "zones": {"dock": [[0, 0], [0.4, 0], [0.4, 1], [0, 1]]},
        "rules": [{"name": "at-dock", "on": "appear", "zone": "dock"}],
    }
    async with aiohttp.ClientSession() as http:
        ws, hello = await connect(http, srv.ws_url)
        wrong = await settings(ws, rules=[{"name": "x", "on": "appear", "zone": "nowhere"}])
        clash = await settings(ws, zones={"left": LEFT})
        ack = await settings(ws, **own)
        (result, event) = await frame(ws, 1, image)
        await ws.close(code=4000)  # dropped: resumable
        ws, again = await connect(http, srv.ws_url, params={"resume": hello["resume_token"]})
        after = await frame(ws, 2, image)
        cleared = await settings(ws, rules=None, zones=None)
        await ws.close()
    assert wrong["type"] == "error" and "no zone named 'nowhere'" in wrong["message"]
    assert clash["type"] == "error" and "'left' is the node's" in clash["message"]
    assert ack["type"] == "settings" and ack["zones"] == own["zones"]
    assert [r["name"] for r in ack["rules"]] == ["at-dock"]
    assert event["rule"] == "at-dock" and event["zone"] == "dock"
    assert track_of(result, image)["zones"] == ["left", "dock"]  # the node's and its own
    assert again["resumed"] is True and again["settings"]["zones"] == own["zones"]
    assert [m["type"] for m in after] == ["result"]  # the same label: not raised again
    assert track_of(after[0], image)["track"] == event["track"]
    assert cleared["zones"] == {} and cleared["rules"] == []


async def test_leave_comes_from_the_timer_when_the_stream_goes_quiet(
    server_factory: Factory,
) -> None:
    srv = await server_factory(node_events(rules=[{"name": "gone", "on": "leave"}]))
    image = scene([("LOT42", (60, 120))])
    async with aiohttp.ClientSession() as http:
        ws, _ = await connect(http, srv.ws_url)
        for i in range(3):
            last_sent = time.monotonic()  # the server saw the label after this
            msgs = await frame(ws, i, image)
            assert [m["type"] for m in msgs] == ["result"]
        track = track_of(msgs[0], image)["track"]
        leave = await recv(ws, timeout=T(10))  # no frame comes: the timer decides
        waited = time.monotonic() - last_sent
        await ws.close()
    assert_valid_server_message(leave)
    assert (leave["type"], leave["rule"], leave["on"]) == ("event", "gone", "leave")
    assert leave["track"] == track and leave["frame_id"] == 2  # its last frame
    # The tracker keeps a track 1 s (and 3 frame intervals) past its last sighting.
    assert 1.0 < waited < T(3.0), waited


async def test_a_rule_with_text_reads_for_itself_and_its_expression_decides(
    server_factory: Factory,
) -> None:
    srv = await server_factory(
        node_events(rules=[{"name": "lot", "on": "appear", "text": r"^LOT\d+$"}])
    )
    image = text_scene(1280, 720, texts=[("LOT42", (80, 200)), ("K4771", (700, 420))], font_size=48)
    async with aiohttp.ClientSession() as http:
        ws, _ = await connect(http, srv.ws_url)
        got = []
        for i in range(3):  # latest mode may answer a frame before its boxes are read
            got += await frame(ws, i, image)
        await ws.close()
    events = [m for m in got if m["type"] == "event"]
    results = [m for m in got if m["type"] == "result"]
    assert [(e["rule"], e["text"]) for e in events] == [("lot", "LOT42")]
    lot = track_of(results[-1], image, 0)
    assert events[0]["track"] == lot["track"]
    # The session did not turn reading on: its results carry no text.
    assert all("text" not in d for r in results for d in r["detections"])


async def test_the_python_client_hands_out_typed_events(server_factory: Factory) -> None:
    srv = await server_factory(node_events(rules=[{"name": "seen", "on": "appear"}]))
    image = scene([("LOT42", (60, 120))])
    heard: list[Event] = []
    async with camera_client(srv.ws_url, mode="every", on_event=heard.append) as cam:
        result = await cam.detect(image.jpeg(92), frame_id="f1", ts=5.0)
        event = await asyncio.wait_for(anext(aiter(cam.events())), T(10))
    assert isinstance(event, Event) and heard == [event]
    assert (event.rule, event.on, event.frame_id, event.ts) == ("seen", "appear", "f1", 5.0)
    assert event.track == result.detections[0].track
