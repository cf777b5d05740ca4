"""YUV4MPEG2 (.y4m) files: what Chromium's fake camera plays with
``--use-file-for-fake-video-capture`` (a one-line stream header, then ``FRAME`` + I420 planes
per frame)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import cv2
import numpy as np

from .images import U8Array


def write_y4m(path: Path, frames: Iterable[U8Array], fps: int = 15) -> Path:
    """Write RGB frames (all the same even width and height) as 4:2:0 YUV4MPEG2."""
    with open(path, "wb") as out:
        size: tuple[int, int] | None = None
        for rgb in frames:
            height, width = rgb.shape[:2]
            if size is None:
                if width % 2 or height % 2:
                    raise ValueError(f"4:2:0 needs even sides, got {width}x{height}")
                size = (width, height)
                out.write(f"YUV4MPEG2 W{width} H{height} F{fps}:1 Ip A1:1 C420jpeg\n".encode())
            elif (width, height) != size:
                raise ValueError(f"frame of {width}x{height} in a {size[0]}x{size[1]} stream")
            i420 = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2YUV_I420)
            out.write(b"FRAME\n")
            out.write(i420.tobytes())
        if size is None:
            raise ValueError("no frames")
    return path
