"""Stage 7, post-process: model outputs → detections in original-frame pixels. Pure.

Every head returns the one contract the rest of the service knows: an ``(N, 6)`` float32
array of ``x1, y1, x2, y2, score, class`` in original-frame pixels, best score first.

Heads:

* :class:`DbnetHead` — DBNet text probability maps (PP-OCR det): binarise, contours,
  minimum-area box, box score (mean probability inside the box), unclip (Liao et al.,
  "Real-time Scene Text Detection with Differentiable Binarization", 2020, section 3.5);
* :class:`YoloV8Head` — Ultralytics YOLOv8/v11 raw ``[N, 4+nc, A]`` (cx, cy, w, h, scores);
* :class:`YoloV5Head` — Ultralytics YOLOv5 raw ``[N, A, 5+nc]`` (with objectness);
* :class:`EndToEndHead` — NMS-free ``[N, k, 6]`` (YOLOv10, YOLO26 end-to-end exports);
* :class:`EfficientNmsHead` — TensorRT EfficientNMS_TRT's four outputs.

Raw YOLO heads run a confidence filter and class-aware NMS (:func:`batched_nms`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import cv2
import numpy as np
import numpy.typing as npt

from .errors import ModelError
from .shape import Letterbox

F32Array = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.intp]

HEAD_NAMES = ("dbnet", "yolo_v5", "yolo_v8", "end_to_end", "efficient_nms")


def empty_detections() -> F32Array:
    return np.zeros((0, 6), np.float32)


def nms(boxes: F32Array, scores: F32Array, iou_threshold: float) -> IntArray:
    """Greedy non-maximum suppression; indices kept, best score first."""
    order = np.argsort(-scores, kind="stable")
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
    keep: list[int] = []
    while order.size:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        w = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]))
        h = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]))
        inter = w * h
        iou = inter / np.maximum(areas[i] + areas[rest] - inter, 1e-9)
        order = rest[iou <= iou_threshold]
    return np.asarray(keep, dtype=np.intp)


def batched_nms(
    boxes: F32Array, scores: F32Array, classes: F32Array, iou_threshold: float
) -> IntArray:
    """Class-aware NMS: boxes of different classes never suppress each other."""
    if len(boxes) == 0:
        return np.zeros(0, np.intp)
    span = float(boxes[:, :4].max()) + 1.0
    shifted = boxes[:, :4] + (classes.astype(np.float32) * span)[:, None]
    return nms(shifted, scores, iou_threshold)


def _finish(dets: F32Array, lb: Letterbox, max_det: int) -> F32Array:
    dets = dets[np.argsort(-dets[:, 4], kind="stable")][:max_det]
    lb.to_frame(dets)
    return np.ascontiguousarray(dets, dtype=np.float32)


class Head(Protocol):
    @property
    def name(self) -> str: ...

    def decode(self, outputs: Sequence[np.ndarray], lb: Letterbox, confidence: float) -> F32Array:
        """One frame's outputs (batch axis removed) → ``(N, 6)`` frame-pixel detections."""
        ...


@dataclass(frozen=True)
class DbnetHead:
    """DB post-processing of a ``[1, H, W]`` text probability map."""

    bin_threshold: float = 0.3
    unclip_ratio: float = 1.6
    max_candidates: int = 1000
    min_size: float = 3.0
    max_detections: int = 300
    name: str = "dbnet"

    def decode(self, outputs: Sequence[np.ndarray], lb: Letterbox, confidence: float) -> F32Array:
        prob = np.asarray(outputs[0], dtype=np.float32).reshape(outputs[0].shape[-2:])
        # Only the letterboxed frame, not the padding, can hold text.
        region = prob[lb.pad_y : lb.pad_y + lb.new_h, lb.pad_x : lb.pad_x + lb.new_w]
        bitmap = np.greater(region, self.bin_threshold).view(np.uint8)  # bool -> 0/1, no copy
        contours, _ = cv2.findContours(bitmap, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
        rows: list[tuple[float, float, float, float, float]] = []
        h, w = region.shape
        for contour in contours[: self.max_candidates]:
            (cx, cy), (rw, rh), angle = cv2.minAreaRect(contour)
            if min(rw, rh) < self.min_size:
                continue
            score = self._box_score(region, cv2.boxPoints(((cx, cy), (rw, rh), angle)))
            if score < confidence:
                continue
            # Unclip: the model predicts a shrunk kernel; grow it back by D = A * r / L.
            d = rw * rh * self.unclip_ratio / (2.0 * (rw + rh))
            grown = cv2.boxPoints(((cx, cy), (rw + 2 * d, rh + 2 * d), angle))
            if min(rw, rh) + 2 * d < self.min_size + 2:
                continue
            x1, y1 = np.clip(grown.min(axis=0), 0, (w, h))
            x2, y2 = np.clip(grown.max(axis=0), 0, (w, h))
            rows.append((x1 + lb.pad_x, y1 + lb.pad_y, x2 + lb.pad_x, y2 + lb.pad_y, score))
        if not rows:
            return empty_detections()
        dets = np.zeros((len(rows), 6), np.float32)
        dets[:, :5] = rows
        return _finish(dets, lb, self.max_detections)

    @staticmethod
    def _box_score(prob: F32Array, points: npt.NDArray[Any]) -> float:
        """Mean probability inside the box polygon (DB's 'fast' box score)."""
        h, w = prob.shape
        xmin = int(np.clip(np.floor(points[:, 0].min()), 0, w - 1))
        xmax = int(np.clip(np.ceil(points[:, 0].max()), 0, w - 1))
        ymin = int(np.clip(np.floor(points[:, 1].min()), 0, h - 1))
        ymax = int(np.clip(np.ceil(points[:, 1].max()), 0, h - 1))
        mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), np.uint8)
        local = (points - (xmin, ymin)).round().astype(np.int32)
        cv2.fillPoly(mask, [local], 1)
        return float(cv2.mean(prob[ymin : ymax + 1, xmin : xmax + 1], mask)[0])


def _xywh_to_xyxy(xywh: F32Array) -> F32Array:
    out = np.empty_like(xywh)
    out[:, :2] = xywh[:, :2] - xywh[:, 2:4] / 2
    out[:, 2:] = xywh[:, :2] + xywh[:, 2:4] / 2
    return out


def _nms_detections(
    xyxy: F32Array, scores: F32Array, classes: F32Array, iou: float, lb: Letterbox, max_det: int
) -> F32Array:
    keep = batched_nms(xyxy, scores, classes, iou)[:max_det]
    dets = np.empty((len(keep), 6), np.float32)
    dets[:, :4] = xyxy[keep]
    dets[:, 4] = scores[keep]
    dets[:, 5] = classes[keep]
    return _finish(dets, lb, max_det)


@dataclass(frozen=True)
class YoloV8Head:
    """Ultralytics v8/v11 raw output ``[4 + nc, A]``: cx, cy, w, h, then class scores."""

    nms_iou: float = 0.45
    max_detections: int = 300
    name: str = "yolo_v8"

    def decode(self, outputs: Sequence[np.ndarray], lb: Letterbox, confidence: float) -> F32Array:
        pred = np.asarray(outputs[0], np.float32)
        cls_scores = pred[4:]
        classes = cls_scores.argmax(axis=0)
        scores = cls_scores[classes, np.arange(pred.shape[1])]
        sel = scores >= confidence
        if not sel.any():
            return empty_detections()
        xyxy = _xywh_to_xyxy(pred[:4, sel].T)
        return _nms_detections(
            xyxy, scores[sel], classes[sel], self.nms_iou, lb, self.max_detections
        )


@dataclass(frozen=True)
class YoloV5Head:
    """Ultralytics v5 raw output ``[A, 5 + nc]``: cx, cy, w, h, objectness, class scores."""

    nms_iou: float = 0.45
    max_detections: int = 300
    name: str = "yolo_v5"

    def decode(self, outputs: Sequence[np.ndarray], lb: Letterbox, confidence: float) -> F32Array:
        pred = np.asarray(outputs[0], np.float32)
        pred = pred[pred[:, 4] >= confidence]
        if not len(pred):
            return empty_detections()
        cls_scores = pred[:, 5:] * pred[:, 4:5]
        classes = cls_scores.argmax(axis=1)
        scores = cls_scores[np.arange(len(pred)), classes]
        sel = scores >= confidence
        if not sel.any():
            return empty_detections()
        xyxy = _xywh_to_xyxy(pred[sel, :4])
        return _nms_detections(
            xyxy, scores[sel], classes[sel], self.nms_iou, lb, self.max_detections
        )


@dataclass(frozen=True)
class EndToEndHead:
    """NMS-free ``[k, 6]`` output: x1, y1, x2, y2, score, class in input pixels."""

    max_detections: int = 300
    name: str = "end_to_end"

    def decode(self, outputs: Sequence[np.ndarray], lb: Letterbox, confidence: float) -> F32Array:
        pred = np.asarray(outputs[0], np.float32).reshape(-1, 6)
        dets = pred[pred[:, 4] >= confidence].copy()
        return _finish(dets, lb, self.max_detections)


@dataclass(frozen=True)
class EfficientNmsHead:
    """TensorRT EfficientNMS_TRT outputs: num_dets [1], boxes [k,4], scores [k], classes [k]."""

    max_detections: int = 300
    name: str = "efficient_nms"

    def decode(self, outputs: Sequence[np.ndarray], lb: Letterbox, confidence: float) -> F32Array:
        num = int(np.asarray(outputs[0]).reshape(-1)[0])
        boxes = np.asarray(outputs[1], np.float32).reshape(-1, 4)[:num]
        scores = np.asarray(outputs[2], np.float32).reshape(-1)[:num]
        classes = np.asarray(outputs[3], np.float32).reshape(-1)[:num]
        dets = np.concatenate([boxes, scores[:, None], classes[:, None]], axis=1)
        dets = dets[dets[:, 4] >= confidence]
        return _finish(np.ascontiguousarray(dets, np.float32), lb, self.max_detections)


def pick_head_name(output_shapes: Sequence[tuple[int, ...]]) -> str:
    """Which head decodes outputs of these (batch-first, concrete) shapes."""
    shapes = [tuple(s) for s in output_shapes]
    if len(shapes) == 4 and len(shapes[1]) == 3 and shapes[1][-1] == 4:
        return "efficient_nms"
    if len(shapes) == 1:
        s = shapes[0]
        if len(s) == 4 and s[1] == 1:
            return "dbnet"
        if len(s) == 3:
            _, a, b = s
            if b == 6 and a <= 1000:
                return "end_to_end"
            return "yolo_v8" if a < b else "yolo_v5"
    raise ModelError(
        f"cannot tell the model head from its output shapes {shapes}; set model.head to one of "
        f"{', '.join(HEAD_NAMES)}"
    )


def make_head(
    name: str,
    *,
    nms_iou: float = 0.45,
    max_detections: int = 300,
    bin_threshold: float = 0.3,
    unclip_ratio: float = 1.6,
    max_candidates: int = 1000,
    min_size: float = 3.0,
) -> Head:
    if name == "dbnet":
        return DbnetHead(bin_threshold, unclip_ratio, max_candidates, min_size, max_detections)
    if name == "yolo_v8":
        return YoloV8Head(nms_iou, max_detections)
    if name == "yolo_v5":
        return YoloV5Head(nms_iou, max_detections)
    if name == "end_to_end":
        return EndToEndHead(max_detections)
    if name == "efficient_nms":
        return EfficientNmsHead(max_detections)
    raise ModelError(f"unknown head {name!r}; known: {', '.join(HEAD_NAMES)}")


def filter_classes(dets: F32Array, classes: frozenset[int] | None) -> F32Array:
    """Keep only detections whose class is in ``classes`` (``None`` keeps all)."""
    if classes is None or not len(dets):
        return dets
    mask = np.isin(dets[:, 5].astype(np.int64), np.fromiter(classes, np.int64, len(classes)))
    return dets[mask]
