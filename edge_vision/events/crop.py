"""The JPEG crop an event of a rule with ``crop: true`` carries to the sinks.

Made in a worker thread from the frame as the client sent it (the detection's box, a
margin of 10 % around it), and made smaller until it fits ``events.crop_max_bytes``:
lower quality first, then a smaller size.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from ..frames.decode import decode_base64

_QUALITIES = (85, 70, 50)
_MARGIN = 0.1


def crop_jpeg(image: bytes, is_base64: bool, box: Sequence[float], max_bytes: int) -> bytes | None:
    """The box of the encoded frame ``image`` as a JPEG of at most ``max_bytes``; None when
    the frame cannot be decoded or the box is empty."""
    data = decode_base64(image) if is_base64 else image
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if pixels is None:
        return None
    h, w = pixels.shape[:2]
    x1, y1, x2, y2 = (float(v) for v in box[:4])
    mx, my = (x2 - x1) * _MARGIN, (y2 - y1) * _MARGIN
    left, top = max(0, int(x1 - mx)), max(0, int(y1 - my))
    right, bottom = min(w, int(np.ceil(x2 + mx))), min(h, int(np.ceil(y2 + my)))
    if right <= left or bottom <= top:
        return None
    crop = pixels[top:bottom, left:right]
    while True:
        for quality in _QUALITIES:
            ok, jpg = cv2.imencode(".jpg", crop, [cv2.IMWRITE_JPEG_QUALITY, quality])
            if ok and len(jpg) <= max_bytes:
                return bytes(jpg)
        ch, cw = crop.shape[:2]
        if ch < 16 or cw < 16:
            return None
        crop = cv2.resize(crop, (cw * 2 // 3, ch * 2 // 3), interpolation=cv2.INTER_AREA)
