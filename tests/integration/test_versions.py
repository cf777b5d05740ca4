"""Protocol versions (docs/protocol.md, "Versions"): a node serves 1, 2 and 3, a client picks.

The table is tested as a plain object; the negotiation through a real server on a real port.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from edge_vision.errors import UnsupportedProtocol
from edge_vision.session.receive import PROTOCOL_VERSION, SUPPORTED_VERSIONS
from edge_vision.session.versions import BASE_FEATURES, CURRENT, PROTOCOLS, choose_protocol

from ..support.assertions import assert_box_overlaps
from ..support.clients import connect, frame_binary, frame_json, recv_type
from ..support.images import text_scene
from ..support.reference import reference_box
from ..support.server import RunningServer

pytestmark = pytest.mark.timeout(120)


def test_node_serves_the_current_and_the_previous_versions() -> None:
    assert PROTOCOL_VERSION == 3
    assert SUPPORTED_VERSIONS == (1, 2, 3)
    assert sorted(PROTOCOLS) == [1, 2, 3]
    assert CURRENT.number == 3
    # Events (protocol 3): event messages, zones, a session's own rules; not for 1 or 2.
    assert CURRENT.events and not PROTOCOLS[2].events and not PROTOCOLS[1].events


@pytest.mark.parametrize(
    ("asked", "number"), [(None, PROTOCOL_VERSION), ("1", 1), ("2", 2), ("02", 2), ("3", 3)]
)
def test_choose_protocol_serves_known_versions(asked: str | None, number: int) -> None:
    assert choose_protocol(asked).number == number


@pytest.mark.parametrize("asked", ["0", "4", "", "two", "-1", "1.0", " 2", "²", "9" * 30])
def test_choose_protocol_refuses_anything_else_and_names_the_served_versions(asked: str) -> None:
    with pytest.raises(UnsupportedProtocol) as info:
        choose_protocol(asked)
    assert info.value.supported == (1, 2, 3)
    assert "serves 1, 2, 3" in str(info.value)


def test_v1_clients_get_only_the_close_codes_protocol_1_documents() -> None:
    v1, v2 = PROTOCOLS[1], PROTOCOLS[2]
    for code in (1000, 1001, 1008, 1009):  # protocol 1's codes pass unchanged to both
        assert v1.close_code(code) == code and v2.close_code(code) == code
    for code in (4000, 4002, 4004, 4401, 4999):  # application codes are protocol 2
        assert v1.close_code(code) == 1008
        assert v2.close_code(code) == code
    assert v1.close_code(4003) == 1001  # idle: protocol 1 closed it with 1001
    assert v2.at_least(2) and v1.at_least(1) and not v1.at_least(2)


async def test_hello_without_a_version_speaks_the_current_one(server: RunningServer) -> None:
    async with aiohttp.ClientSession() as s:
        ws, hello = await connect(s, server.ws_url)
        await ws.close()
    assert hello["protocol"] == PROTOCOL_VERSION
    assert hello["protocols"] == [1, 2, 3]
    assert set(BASE_FEATURES) <= set(hello["features"])
    assert "binary_frames" in hello["features"] and "resume" in hello["features"]


@pytest.mark.parametrize("wire", ["json", "binary"])
async def test_a_protocol_1_client_still_streams(server: RunningServer, wire: str) -> None:
    scene = text_scene(960, 540, texts=[("LOT 0042", (300, 200))])
    async with aiohttp.ClientSession() as s:
        ws, hello = await connect(s, server.ws_url + "?protocol=1&mode=every")
        assert hello["protocol"] == 1
        for i in range(3):
            if wire == "binary":
                await ws.send_bytes(frame_binary(i, 10.0 + i, scene.jpeg()))
            else:
                await ws.send_str(frame_json(i, 10.0 + i, scene.jpeg()))
        results = [await recv_type(ws, "result") for _ in range(3)]
        await ws.close()
    assert [r["id"] for r in results] == [0, 1, 2]
    assert [r["ts"] for r in results] == [10.0, 11.0, 12.0]
    # A short line: checked against the reference pipeline's box for this frame, as in
    # test_roundtrip (tests/support/reference.py says why not against the ink's box).
    ref = await asyncio.to_thread(reference_box, scene.rgb[:, :, ::-1].copy())
    for r in results:
        assert_box_overlaps(r, ref, iou_min=0.7)


@pytest.mark.parametrize("asked", ["4", "0", "latest"])
async def test_unknown_version_is_refused_with_400_listing_the_served_ones(
    server: RunningServer, asked: str
) -> None:
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await s.ws_connect(server.ws_url + f"?protocol={asked}")
        assert info.value.status == 400
        async with s.get(server.ws_url.replace("ws://", "http://") + f"?protocol={asked}") as r:
            assert r.status == 400
            body = await r.json()
    assert body["error"] == "unsupported_protocol"
    assert body["protocols"] == [1, 2, 3]
    assert "serves 1, 2, 3" in body["message"]


async def test_protocol_1_results_and_settings_answers_keep_their_v1_fields(
    server: RunningServer,
) -> None:
    """The table's flags: track ids and the settings extras are protocol 2 only."""
    scene = text_scene(960, 540, texts=[("LOT 0042", (300, 200))])
    got: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    async with aiohttp.ClientSession() as s:
        for version in (1, 2):
            ws, _ = await connect(s, server.ws_url + f"?protocol={version}&mode=every")
            await ws.send_str(orjson.dumps({"type": "settings", "confidence": 0.3}).decode())
            answer = await recv_type(ws, "settings")
            await ws.send_bytes(frame_binary(1, 1.0, scene.jpeg()))
            got[version] = (answer, await recv_type(ws, "result"))
            await ws.close()
    (v1_settings, v1_result), (v2_settings, v2_result) = got[1], got[2]
    assert set(v1_settings) == {"type", "mode", "confidence", "classes"}
    assert v1_result["detections"] and all("track" not in d for d in v1_result["detections"])
    assert PROTOCOLS[2].track_ids and PROTOCOLS[2].settings_extras
    assert {"track", "input_size"} <= set(v2_settings)
    assert all(isinstance(d["track"], int) for d in v2_result["detections"])
