"""What the reference pipeline (PP-OCR's own DB pre- and post-processing, from the rapidocr
wheel) finds in a frame, for tests that check a box against it rather than against the
ink's tight box: DB grows a box around its text kernel by ``D = A · 1.6 / L``, so on a
short line the IoU with the ink's box sits near 0.5 by construction."""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort

from edge_vision.config import ModelConfig
from edge_vision.model.spec import load_model_spec
from edge_vision.tools.bench.sizes import reference_detections

from .images import Box


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
