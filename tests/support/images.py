"""Test images whose text positions are known: Pillow text on noisy gradient backgrounds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import simplejpeg
from PIL import Image, ImageDraw, ImageFont

U8Array = npt.NDArray[np.uint8]
Box = tuple[float, float, float, float]


def background(width: int, height: int, seed: int = 0) -> U8Array:
    """A photo-like RGB background: colour gradients plus sensor-like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack(
        [x / width * 160 + 60, y / height * 120 + 90, (x + y) / (width + height) * 140 + 70], -1
    )
    noisy = base + rng.normal(0, 14, (height, width, 3))
    return np.clip(noisy, 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class Scene:
    rgb: U8Array
    text_boxes: list[Box]  # where each drawn string lies, frame pixels

    @property
    def width(self) -> int:
        return int(self.rgb.shape[1])

    @property
    def height(self) -> int:
        return int(self.rgb.shape[0])

    def jpeg(self, quality: int = 85) -> bytes:
        return jpeg(self.rgb, quality)

    def png(self) -> bytes:
        return png(self.rgb)


def text_scene(
    width: int = 1280,
    height: int = 720,
    texts: list[tuple[str, tuple[int, int]]] | None = None,
    font_size: int | None = None,
    seed: int = 0,
) -> Scene:
    """Dark text at known places on a busy background."""
    font_size = font_size or max(14, height // 13)
    texts = texts if texts is not None else [("SERIAL 4711-AB", (width // 6, height * 2 // 5))]
    im = Image.fromarray(background(width, height, seed))
    draw = ImageDraw.Draw(im)
    font = ImageFont.load_default(size=font_size)
    boxes: list[Box] = []
    for text, (x, y) in texts:
        draw.text((x, y), text, font=font, fill=(12, 12, 16))
        x1, y1, x2, y2 = draw.textbbox((x, y), text, font=font)
        boxes.append((float(x1), float(y1), float(x2), float(y2)))
    return Scene(np.asarray(im), boxes)


def blank_scene(width: int = 1280, height: int = 720, seed: int = 1) -> Scene:
    return Scene(background(width, height, seed), [])


def jpeg(rgb: U8Array, quality: int = 85) -> bytes:
    return bytes(
        simplejpeg.encode_jpeg(np.ascontiguousarray(rgb), quality=quality, colorspace="RGB")
    )


def png(rgb: U8Array) -> bytes:
    import io

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width × height`` but carries almost no data: an image bomb
    that any decoder would try to allocate for."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
