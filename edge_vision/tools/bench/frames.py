"""Frames for load tests: JPEGs from a recorded video, or a generated camera-like clip.

The generated clip looks like a camera on a plant floor: smooth shading, mild sensor
noise, and text (a serial number, a label) drifting across, so every frame has boxes to
find and the JPEGs have a realistic size (tens to a few hundred kB at 1280×720).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

U8Array = npt.NDArray[np.uint8]


def generated_frames(width: int, height: int, count: int, seed: int = 7) -> list[U8Array]:
    """``count`` RGB frames with text moving across a shaded background."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack(
        [x / width * 90 + 110, y / height * 70 + 120, (x + y) / (width + height) * 80 + 100], -1
    )
    font = ImageFont.load_default(size=max(14, height // 14))
    small = ImageFont.load_default(size=max(10, height // 24))
    frames = []
    for i in range(count):
        noisy = base + rng.normal(0, 4, base.shape)
        im = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
        d = ImageDraw.Draw(im)
        dx = int((i * width / max(count, 1)) * 0.5)
        d.text(
            (width // 8 + dx, height // 3), f"SN 4711-{i % 100:02d}", font=font, fill=(15, 15, 20)
        )
        d.text(
            (width // 2 - dx // 2, height * 2 // 3),
            "LOT B-22 / 2026-11",
            font=small,
            fill=(20, 20, 30),
        )
        frames.append(np.asarray(im))
    return frames


def video_frames(path: Path, width: int, height: int, count: int) -> list[U8Array]:
    """Up to ``count`` RGB frames from a video file, resized to width×height."""
    import cv2

    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise OSError(f"cannot open video {path}")
    frames: list[U8Array] = []
    try:
        while len(frames) < count:
            ok, bgr = cap.read()
            if not ok:
                break
            if bgr.shape[:2] != (height, width):
                bgr = cv2.resize(bgr, (width, height), interpolation=cv2.INTER_AREA)
            frames.append(np.ascontiguousarray(bgr[:, :, ::-1]))
    finally:
        cap.release()
    if not frames:
        raise OSError(f"no frames could be read from {path}")
    return frames


def encode_jpegs(frames: list[U8Array], quality: int = 80) -> list[bytes]:
    import simplejpeg

    return [
        bytes(simplejpeg.encode_jpeg(np.ascontiguousarray(f), quality=quality, colorspace="RGB"))
        for f in frames
    ]
