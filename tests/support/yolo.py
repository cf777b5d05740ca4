"""Synthetic YOLO outputs: no YOLO weights exist on this machine (none ship, and nothing
is downloaded at run time), so the YOLO heads and the device NMS are checked on outputs
shaped as a trained model's are."""

from __future__ import annotations

import numpy as np


def yolo_v8_output(rng: np.random.Generator, objects: int, batch: int = 2) -> np.ndarray:
    """A YOLO v8 raw output ``[B, 84, 8400]`` shaped as a trained model's looks: every
    anchor a faint guess (class scores under 0.05), and round each object a cluster of
    anchors whose boxes overlap it, scoring 0.3-0.95 in its class. Synthetic: no YOLO
    weights exist on this machine (none ship, and nothing is downloaded at run time)."""
    nc, anchors = 80, 8400
    out = np.zeros((batch, 4 + nc, anchors), np.float32)
    out[:, :2] = rng.uniform(0, 640, (batch, 2, anchors))
    out[:, 2:4] = rng.uniform(4, 60, (batch, 2, anchors))
    out[:, 4:] = rng.uniform(0, 0.05, (batch, nc, anchors))
    for b in range(batch):
        for _ in range(objects):
            cx, cy, w, h = rng.uniform(40, 600), rng.uniform(40, 600), *rng.uniform(20, 120, 2)
            cls = rng.integers(nc)
            for a in rng.choice(anchors, rng.integers(3, 12), replace=False):
                out[b, :4, a] = cx + rng.normal(0, 3), cy + rng.normal(0, 3), w, h
                out[b, 4 + cls, a] = rng.uniform(0.3, 0.95)
    return out
