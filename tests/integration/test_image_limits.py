"""One limit story, told by a real server over TCP: an image over ``server.max_pixels`` is
refused with a message that names the setting and says what to do; an image under it
decodes (``server.max_decoded_bytes`` follows the pixel limit unless an operator lowers
it, and then its refusal names itself and the largest PNG it takes); a plain GET on /ws
says it needs a WebSocket upgrade."""

from __future__ import annotations

import asyncio
from functools import cache
from typing import Any

import aiohttp
import cv2
import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageDraw, ImageFont

from edge_vision import errors

from ..support.assertions import assert_box_overlaps
from ..support.clients import camera_client
from ..support.timing import T

pytestmark = pytest.mark.timeout(180)

Box = tuple[float, float, float, float]


@cache
def page(side: int) -> tuple[np.ndarray, Box]:
    """A ``side``² RGB page: one word in large dark letters on a flat background (so that
    its PNG stays well under the 8 MiB message limit), and where the word lies."""
    im = Image.new("RGB", (side, side), (214, 210, 200))
    draw = ImageDraw.Draw(im)
    font = ImageFont.load_default(size=side // 9)
    xy = (side // 8, side * 2 // 5)
    draw.text(xy, "LOT 42", font=font, fill=(20, 20, 24))
    box = draw.textbbox(xy, "LOT 42", font=font)
    return np.asarray(im), (float(box[0]), float(box[1]), float(box[2]), float(box[3]))


def png(rgb: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", rgb[:, :, ::-1], [cv2.IMWRITE_PNG_COMPRESSION, 1])
    assert ok
    return data.tobytes()


async def rejected(url: str, image: bytes) -> errors.FrameRejected:
    async with camera_client(url, resume=False) as client:
        with pytest.raises(errors.FrameRejected) as info:
            await asyncio.wait_for(client.detect(image), T(60))
        return info.value


async def test_an_image_over_the_pixel_limit_names_the_setting_and_what_to_do(
    server_factory: Any,
) -> None:
    srv = await server_factory()
    image = await asyncio.to_thread(lambda: png(page(8000)[0]))
    assert len(image) < 8 * 2**20  # within the message limit: the pixel limit refuses it
    err = await rejected(srv.ws_url, image)
    assert err.code == "image_too_large"
    assert err.message == (
        "image is 8000x8000 (64.0 MP); this server takes at most 40.0 MP (server.max_pixels): "
        "scale the frame down"
    )


async def test_a_png_under_the_pixel_limit_decodes_and_is_answered(server_factory: Any) -> None:
    """36 MP, under the stated 40 MP: decoded (108 MB of pixels, within the memory budget),
    not refused by a second limit."""
    srv = await server_factory()
    rgb, word = page(6000)
    image = await asyncio.to_thread(png, rgb)
    async with camera_client(srv.ws_url, resume=False) as client:
        limits = client.hello.raw["limits"]
        assert limits["max_decoded_bytes"] >= 3 * limits["max_pixels"] == 120_000_000
        result = await asyncio.wait_for(client.detect(image), T(120))
    assert (result.width, result.height) == (6000, 6000)
    assert_box_overlaps(result.raw, word, iou_min=0.5)


async def test_a_lower_decoded_bytes_limit_says_the_largest_png_and_offers_jpeg(
    server_factory: Any,
) -> None:
    srv = await server_factory({"server": {"max_decoded_bytes": 64 * 2**20}})
    rgb, word = page(6000)
    err = await rejected(srv.ws_url, await asyncio.to_thread(png, rgb))
    assert err.code == "decoded_too_large"
    assert err.message == (
        "PNG 6000x6000 (36.0 MP) would decode to 103.0 MiB; this server decodes at most "
        "64.0 MiB a frame (server.max_decoded_bytes), so a PNG of at most 22.4 MP: scale the "
        "frame down, or send it as JPEG (decoded scaled down)"
    )
    # The advice works: the same page as JPEG is decoded at 1/8 and answered.
    jpg = await asyncio.to_thread(simplejpeg.encode_jpeg, rgb, 90, "RGB")
    async with camera_client(srv.ws_url, resume=False) as client:
        result = await asyncio.wait_for(client.detect(jpg), T(60))
    assert (result.width, result.height) == (6000, 6000)
    assert_box_overlaps(result.raw, word, iou_min=0.5)


async def test_a_plain_get_on_ws_says_it_needs_a_websocket_upgrade(server_factory: Any) -> None:
    srv = await server_factory()
    async with aiohttp.ClientSession() as http, http.get(srv.url + "/ws") as r:
        assert r.status == 426
        assert await r.text() == (
            "/ws needs a WebSocket upgrade: connect with a WebSocket client "
            "(edge_vision.client, or the overlay page at /), not a plain HTTP request. "
            "Nothing refuses you now: the upgrade would be accepted\n"
        )
