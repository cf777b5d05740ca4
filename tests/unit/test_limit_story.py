"""The pixel and decoded-bytes limits agree: server.max_decoded_bytes follows
server.max_pixels unless set, within what one worker's memory budget can decode; every
refusal names its setting and says what to do."""

from __future__ import annotations

import pytest

from edge_vision.config import ServerConfig, load_config
from edge_vision.errors import ClientError
from edge_vision.frames.decode import ImageHeader, check_decoded_limit, check_pixel_limit

MiB = 2**20


def server(**values: object) -> ServerConfig:
    return load_config(None, environ={}, cli={"server": values}).server


def test_by_default_every_image_the_pixel_limit_admits_decodes() -> None:
    s = server()
    assert s.max_decoded_bytes == 3 * s.max_pixels == 120_000_000
    assert server(max_pixels=10_000_000).max_decoded_bytes == 30_000_000


def test_with_more_workers_it_stays_within_half_a_worker_s_budget_share() -> None:
    # 512 MiB / 4 workers = 128 MiB each: a decode buffer (a power of two) of at most half.
    s = server(workers=4)
    assert s.max_decoded_bytes == 64 * MiB
    s.workers = 16  # as engine.kind auto assigns on a GPU
    assert s.max_decoded_bytes == 16 * MiB


def test_a_value_the_operator_sets_is_kept() -> None:
    s = server(max_decoded_bytes=64 * MiB, workers=16)
    assert s.max_decoded_bytes == 64 * MiB


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (
            ImageHeader("png", 8000, 8000),
            "image is 8000x8000 (64.0 MP); this server takes at most 40.0 MP "
            "(server.max_pixels): scale the frame down",
        ),
        (
            ImageHeader("jpeg", 320, 200),
            "image is 320x200 (64,000 pixels); this server takes at most 50,000 pixels "
            "(server.max_pixels): scale the frame down",
        ),
    ],
)
def test_the_pixel_refusal_names_the_setting(header: ImageHeader, message: str) -> None:
    limit = 40_000_000 if header.format == "png" else 50_000
    with pytest.raises(ClientError) as info:
        check_pixel_limit(header, limit)
    assert (info.value.code, info.value.message) == ("image_too_large", message)


def test_a_jpeg_the_dct_cannot_shrink_enough_is_told_to_scale_down() -> None:
    with pytest.raises(ClientError) as info:
        check_decoded_limit(ImageHeader("jpeg", 6000, 6000), (5000, 5000), 64 * MiB)
    assert info.value.message == (
        "JPEG 6000x6000 (36.0 MP) would decode to 103.0 MiB; this server decodes at most "
        "64.0 MiB a frame (server.max_decoded_bytes): scale the frame down"
    )


def test_without_dct_downscaling_jpeg_is_not_offered_as_the_way_out() -> None:
    with pytest.raises(ClientError) as info:
        check_decoded_limit(ImageHeader("png", 6000, 6000), None, 64 * MiB)
    assert info.value.message.endswith("so a PNG of at most 22.4 MP: scale the frame down")
