"""Test videos whose text positions are known: text moving across a photo-like background,
written with OpenCV's ``VideoWriter`` (mp4v), as a phone or line camera would record it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .images import Box, U8Array, background


@dataclass(frozen=True)
class TextClip:
    path: Path
    width: int
    height: int
    fps: float
    text: str
    boxes: list[Box]  # where the text lies in each frame, frame pixels

    @property
    def frames(self) -> int:
        return len(self.boxes)

    def ts(self, index: int) -> float:
        """The frame's presentation time in milliseconds (constant frame rate)."""
        return index * 1000.0 / self.fps


def text_frames(
    width: int,
    height: int,
    frames: int,
    text: str = "SERIAL 4711-AB",
    seed: int = 0,
) -> tuple[list[U8Array], list[Box]]:
    """BGR frames with ``text`` moving left to right and slightly down, and its boxes."""
    font = ImageFont.load_default(size=max(14, height // 12))
    base = Image.fromarray(background(width, height, seed))
    probe = ImageDraw.Draw(base).textbbox((0, 0), text, font=font)
    text_w, text_h = probe[2] - probe[0], probe[3] - probe[1]
    x0, x1 = width // 20, width - text_w - width // 20
    y0, y1 = height // 4, height - text_h - height // 4
    images: list[U8Array] = []
    boxes: list[Box] = []
    for i in range(frames):
        f = i / max(1, frames - 1)
        xy = (round(x0 + (x1 - x0) * f), round(y0 + (y1 - y0) * f))
        im = base.copy()
        draw = ImageDraw.Draw(im)
        draw.text(xy, text, font=font, fill=(12, 12, 16))
        boxes.append(tuple(float(v) for v in draw.textbbox(xy, text, font=font)))  # type: ignore[arg-type]
        images.append(np.ascontiguousarray(np.asarray(im, dtype=np.uint8)[:, :, ::-1]))  # BGR
    return images, boxes


def write_text_clip(
    path: Path,
    width: int = 640,
    height: int = 360,
    frames: int = 48,
    fps: float = 30.0,
    text: str = "SERIAL 4711-AB",
    fourcc: str = "mp4v",
) -> TextClip:
    images, boxes = text_frames(width, height, frames, text)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*fourcc), fps, (width, height))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path} with {fourcc}")
    try:
        for img in images:
            writer.write(img)
    finally:
        writer.release()
    return TextClip(path, width, height, fps, text, boxes)


def write_image_folder(
    folder: Path, width: int = 480, height: int = 270, frames: int = 6
) -> list[Box]:
    """The same moving text as numbered PNG files (frame_2.png sorts before frame_10.png)."""
    folder.mkdir(parents=True, exist_ok=True)
    images, boxes = text_frames(width, height, frames)
    for i, img in enumerate(images):
        cv2.imwrite(str(folder / f"frame_{i}.png"), img)
    return boxes


def read_video(path: Path) -> tuple[list[U8Array], float]:
    """Every frame of a video (BGR) and its frame rate, as a user's player would see them."""
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise AssertionError(f"{path} does not open as a video")
    frames: list[U8Array] = []
    try:
        while True:
            ok, img = cap.read()
            if not ok:
                break
            frames.append(np.asarray(img, dtype=np.uint8))
        return frames, float(cap.get(cv2.CAP_PROP_FPS))
    finally:
        cap.release()
