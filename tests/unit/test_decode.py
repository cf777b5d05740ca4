"""Decode: header reading, pixel limit before decoding, pooled buffers, DCT downscale."""

from __future__ import annotations

import numpy as np
import pytest

from edge_vision.common.buffers import BufferPool
from edge_vision.errors import ClientError
from edge_vision.frames.decode import (
    DecodedFrame,
    Decoder,
    ImageHeader,
    OpenCvDecoder,
    PillowDecoder,
    SimpleJpegDecoder,
    check_pixel_limit,
    pick_decoder,
    read_image_header,
)

from ..support.images import blank_scene, jpeg, png, png_header_only


def test_headers_read_without_decoding() -> None:
    scene = blank_scene(320, 200)
    assert read_image_header(scene.jpeg()) == ImageHeader("jpeg", 320, 200)
    assert read_image_header(scene.png()) == ImageHeader("png", 320, 200)
    assert read_image_header(png_header_only(40_000, 40_000)).pixels == 1_600_000_000


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"GIF89a....", "unsupported_image"),
        (b"\xff\xd8\xff", "bad_image"),
        (b"\xff\xd8\x00\x00\x00\x00", "bad_image"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "bad_image"),
    ],
)
def test_bad_headers(data: bytes, code: str) -> None:
    with pytest.raises(ClientError) as info:
        read_image_header(data)
    assert info.value.code == code


def test_pixel_limit_refuses_before_decoding() -> None:
    with pytest.raises(ClientError) as info:
        check_pixel_limit(ImageHeader("png", 40_000, 40_000), 40_000_000)
    assert info.value.code == "image_too_large"
    assert "40000x40000" in info.value.message


def _decode(
    decoder: Decoder, data: bytes, min_size: tuple[int, int] | None, pool: BufferPool
) -> DecodedFrame:
    """Header, pixel limit, decode: the order the pipeline runs them in."""
    header = read_image_header(data)
    check_pixel_limit(header, 10**8)
    return decoder.decode(data, header, min_size, pool)


@pytest.mark.parametrize("decoder", [SimpleJpegDecoder(), OpenCvDecoder(), PillowDecoder()])
def test_every_decoder_gives_the_same_bgr_pixels(decoder: Decoder) -> None:
    rgb = np.zeros((64, 96, 3), np.uint8)
    rgb[..., 0] = 220  # red
    rgb[:, 48:, 2] = 200  # blue on the right
    frame = _decode(decoder, jpeg(rgb, quality=95), None, BufferPool())
    assert frame.pixels.shape == (64, 96, 3) and (frame.width, frame.height) == (96, 64)
    b, _g, r = frame.pixels[32, 10].astype(int)
    assert r > 180 and b < 40  # BGR order
    assert frame.pixels[32, 80, 0] > 160


@pytest.mark.parametrize("decoder", [SimpleJpegDecoder(), OpenCvDecoder(), PillowDecoder()])
def test_dct_downscale_never_goes_below_the_needed_size(decoder: Decoder) -> None:
    data = blank_scene(1280, 720).jpeg()
    frame = _decode(decoder, data, (640, 360), BufferPool())
    h, w = frame.pixels.shape[:2]
    assert w >= 640 and h >= 360 and w <= 700  # decoded at 1/2 scale inside libjpeg
    assert (frame.width, frame.height) == (1280, 720)  # the original size is kept


def test_png_decodes_to_bgr() -> None:
    rgb = np.zeros((10, 20, 3), np.uint8)
    rgb[..., 0] = 255
    frame = _decode(SimpleJpegDecoder(), png(rgb), None, BufferPool())
    assert frame.pixels[5, 5].tolist() == [0, 0, 255]


def test_truncated_jpeg_is_bad_image() -> None:
    data = blank_scene(640, 480).jpeg()
    with pytest.raises(ClientError) as info:
        _decode(SimpleJpegDecoder(), data[: len(data) // 2], None, BufferPool())
    assert info.value.code == "bad_image"


def test_pool_reuses_buffers_instead_of_allocating_per_frame() -> None:
    pool = BufferPool()
    data = blank_scene(640, 480).jpeg()
    dec = SimpleJpegDecoder()
    for _ in range(20):
        frame = _decode(dec, data, None, pool)
        assert frame.pooled
        pool.release(frame.pixels)
    assert pool.allocations == 1


def test_pick_decoder_prefers_libjpeg_turbo() -> None:
    assert pick_decoder("auto").name in ("simplejpeg", "turbojpeg")
    assert pick_decoder("pillow").name == "pillow"
