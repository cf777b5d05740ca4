"""What the reference pipeline (PP-OCR's own DB pre- and post-processing, from the rapidocr
wheel) finds in a frame, for tests that check a box against it rather than against the
ink's tight box: DB grows a box around its text kernel by ``D = A · 1.6 / L``, so on a
short line the IoU with the ink's box sits near 0.5 by construction.

It is also the fidelity oracle: :func:`reference_detections` (the reference pipeline) and
:func:`our_detections` (the service's shape stage, model and DB head) on the real photos
of :data:`TEXT_PHOTOS`, which tests/integration/test_fidelity.py and ``python -m benchmarks.sizes``
compare."""

from __future__ import annotations

import functools
import importlib.resources
from dataclasses import replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from edge_vision.config import ModelConfig
from edge_vision.model.heads import DbnetHead
from edge_vision.model.shape import Letterbox, letterbox_into, normalise_into, plan_for_frame
from edge_vision.model.spec import ModelSpec, load_model_spec

from .images import Box

U8Array = npt.NDArray[np.uint8]
F32Array = npt.NDArray[np.float32]


@functools.cache
def _session() -> ort.InferenceSession:
    """One ONNX Runtime session of the default model for every test that asks."""
    spec = load_model_spec(ModelConfig())
    return ort.InferenceSession(str(spec.path), providers=["CPUExecutionProvider"])


def reference_box(bgr: np.ndarray, long_side: int = 640) -> Box:
    """The reference pipeline's one box for ``bgr`` at the service's input (blocking:
    call it off the event loop)."""
    dets = reference_detections(_session(), bgr, long_side)
    assert len(dets) == 1, dets
    x1, y1, x2, y2 = (float(v) for v in dets[0, :4])
    return x1, y1, x2, y2


TEXT_PHOTOS = (
    "page.png",
    "text.png",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "astronaut.png",
    "rocket.jpg",
)


def photo_frame(name: str, width: int, height: int) -> U8Array:
    """A scikit-image photo (BGR) scaled to cover ``width × height``, centre-cropped."""
    path = Path(str(importlib.resources.files("skimage") / "data" / name))
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise FileNotFoundError(f"{path} is not a readable image")
    h, w = img.shape[:2]
    s = max(width / w, height / h)
    big = cv2.resize(img, (round(w * s), round(h * s)), interpolation=cv2.INTER_CUBIC)
    y0, x0 = (big.shape[0] - height) // 2, (big.shape[1] - width) // 2
    return np.ascontiguousarray(big[y0 : y0 + height, x0 : x0 + width])


def reference_input(img: U8Array, long_side: int) -> F32Array:
    """The reference pipeline's model input for ``img``: rapidocr's ``DetPreProcess`` at
    ``limit_type: max``, ``long_side`` (each side to the nearest multiple of 32, stretched)."""
    from rapidocr.ch_ppocr_det.utils import DetPreProcess

    x = DetPreProcess(long_side, "max", [0.5] * 3, [0.5] * 3)(img)
    if x is None:  # only for a frame that resizes to nothing
        raise ValueError(f"the reference cannot resize a {img.shape} frame to {long_side}")
    out: F32Array = x
    return out


def reference_post(pred: F32Array, frame_hw: tuple[int, int]) -> F32Array:
    """The reference's ``DBPostProcess`` (the wheel's ``Det`` settings) of the model's
    output ``pred``, its polygons as axis-aligned ``(N, 6)`` detections in frame pixels."""
    from rapidocr.ch_ppocr_det.utils import DBPostProcess

    polys, scores = DBPostProcess(0.3, 0.5, 1000, 1.6, "fast", use_dilation=True)(pred, frame_hw)
    out = np.zeros((len(polys), 6), np.float32)
    for i, (poly, score) in enumerate(zip(polys, scores, strict=True)):
        out[i, :4] = [*poly.min(axis=0), *poly.max(axis=0)]
        out[i, 4] = score
    return out


def reference_detections(session: Any, img: U8Array, long_side: int) -> F32Array:
    """The reference pipeline's polygons for ``img`` as axis-aligned ``(N, 6)`` detections:
    :func:`reference_input`, the model on ``session`` (the same model), :func:`reference_post`."""
    pred = session.run(None, {"x": reference_input(img, long_side)})[0]
    return reference_post(pred, (img.shape[0], img.shape[1]))


def our_input(spec: ModelSpec, img: U8Array, long_side: int) -> tuple[F32Array, Letterbox]:
    """Our shape stage for ``img`` at ``long_side`` (with ``spec.limits.fit``: letterbox
    or stretch): the engine input and its letterbox."""
    h, w = img.shape[:2]
    limits = replace(spec.limits, target=long_side, max_side=max(1280, long_side))
    lb = plan_for_frame(w, h, limits)
    canvas = np.zeros((lb.out_h, lb.out_w, 3), np.uint8)
    letterbox_into(img, lb, canvas, spec.pad_value)
    x = np.empty((1, 3, lb.out_h, lb.out_w), np.float32)
    normalise_into(x, [canvas], spec.normalisation)
    return x, lb


def our_detections(session: Any, spec: ModelSpec, img: U8Array, long_side: int) -> F32Array:
    """What the service answers for ``img``: our shape stage, the model, our DB head."""
    x, lb = our_input(spec, img, long_side)
    pred = session.run(None, {spec.input_name: x})[0]
    return DbnetHead().decode([pred[0]], lb, 0.5)
