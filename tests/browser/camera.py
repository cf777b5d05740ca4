"""What the fake camera of the browser tests shows."""

from __future__ import annotations

from ..support.images import Scene, text_scene

# What the fake camera shows: two lines of big dark text on a busy light background, in a
# 640x360 stream. Every frame has its own sensor noise; the text stays put, so the tests
# know where boxes must be.
CAMERA_SIZE = (640, 360)
CAMERA_TEXTS = [("SERIAL 4711-AB", (60, 60)), ("LOT 22", (60, 200))]
CAMERA_FONT = 40
CAMERA_FRAMES = 8


def camera_scene(seed: int = 0) -> Scene:
    return text_scene(*CAMERA_SIZE, texts=CAMERA_TEXTS, font_size=CAMERA_FONT, seed=seed)
