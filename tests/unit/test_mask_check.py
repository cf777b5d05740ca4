"""The unmasked-frame check in front of aiohttp's reader (serve/websocket.py,
MaskedFramesOnly): frames of every length form, cut at every kind of chunk boundary."""

from __future__ import annotations

import random

import pytest

from edge_vision.serve.websocket import MaskedFramesOnly, mask_check_supported

from ..support.raw_ws import BINARY, PING, TEXT, frame


class Inner:
    def __init__(self) -> None:
        self.fed = b""

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self.fed += data
        return False, b""

    def feed_eof(self) -> None:
        pass


def _stream(rng: random.Random, n: int) -> list[bytes]:
    sizes = [0, 1, 125, 126, 127, 65535, 65536, 70000]
    kinds = [TEXT, BINARY, PING]
    return [
        frame(k := rng.choice(kinds), bytes(rng.choice(sizes) if k != PING else 5))
        for _ in range(n)
    ]


@pytest.mark.parametrize("seed", range(20))
def test_masked_streams_pass_whole_and_the_first_unmasked_frame_fails(seed: int) -> None:
    rng = random.Random(seed)
    frames = _stream(rng, 12)
    bad_at = rng.randrange(len(frames))
    frames[bad_at] = frame(TEXT, b"x" * rng.choice([3, 200, 70000]), masked=False)
    data = b"".join(frames)
    bad_offset = sum(len(f) for f in frames[:bad_at])
    inner, failed = Inner(), []
    check = MaskedFramesOnly(inner, lambda: failed.append(True))
    i = 0
    while i < len(data) and not failed:
        step = rng.choice([1, 2, 3, 7, 13, 100, 4096, 100_000])
        check.feed_data(data[i : i + step])
        i += step
    assert failed == [True]
    # Nothing of the unmasked frame's chunk, or after it, reached aiohttp's parser.
    assert len(inner.fed) <= bad_offset + 1
    assert inner.fed == data[: len(inner.fed)]
    assert check.feed_data(b"more") == (True, b"")


def test_this_aiohttp_has_what_the_check_needs() -> None:
    assert mask_check_supported()
