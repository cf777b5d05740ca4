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

Raw YOLO heads run a confidence filter and class-aware NMS (:func:`batched_nms`). A GPU
engine may NMS a YOLO v8/v11 output on the device (:func:`yolo_v8_device_nms`); the v8 head
then reads its kept candidates (:func:`decode_device_nms`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import cv2
import numpy as np
import numpy.typing as npt

from ..errors import ModelError
from .device_post import NMS_KEPT, NMS_UNDECIDED, db_map_levels
from .shape import Letterbox

if TYPE_CHECKING:
    from ..config import ModelConfig

F32Array = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.intp]

HEAD_NAMES = ("dbnet", "yolo_v5", "yolo_v8", "end_to_end", "efficient_nms")


def empty_detections() -> F32Array:
    return np.zeros((0, 6), np.float32)


def nms(
    boxes: F32Array, scores: F32Array, iou_threshold: float, classes: F32Array | None = None
) -> IntArray:
    """Greedy non-maximum suppression; indices kept, best score first (ties in the given
    order). With ``classes``, only boxes of one class suppress each other."""
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
        stays = iou <= iou_threshold
        if classes is not None:
            stays |= classes[rest] != classes[i]
        order = rest[stays]
    return np.asarray(keep, dtype=np.intp)


def batched_nms(
    boxes: F32Array, scores: F32Array, classes: F32Array, iou_threshold: float
) -> IntArray:
    """Class-aware NMS: boxes of different classes never suppress each other."""
    if len(boxes) == 0:
        return np.zeros(0, np.intp)
    return nms(boxes[:, :4], scores, iou_threshold, classes)


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
    """DB post-processing of a ``[1, H, W]`` text probability map, step for step as PP-OCR's
    reference ``DBPostProcess`` (shipped in the rapidocr wheel as ``ch_ppocr_det``) does it.

    1. binarise at ``bin_threshold`` (0.3), only inside the letterboxed frame;
    2. dilate the bitmap with a 2×2 kernel (``use_dilation``: joins characters a thin gap
       splits, so small text such as a name tag becomes one kernel);
    3. outer contours, at most ``max_candidates``; the minimum-area rectangle of each, dropped
       when its short side is under ``min_size``;
    4. box score "fast": the mean probability inside that rectangle (its corners truncated to
       whole pixels, as the reference's ``fillPoly`` gets them), dropped under ``confidence``;
    5. unclip: the rectangle offset outwards by ``D = A · unclip_ratio / L`` (area over
       perimeter; the paper's section 3.5), as a polygon offset of the whole-pixel corners
       with round joins would, then the minimum-area rectangle of that, dropped when its short
       side is under ``min_size + 2``;
    6. into frame pixels, rounded to whole pixels and clipped to the frame; boxes with a side
       of 3 frame pixels or less are dropped (the reference's ``filter_det_res``).

    The service returns the axis-aligned box of that rectangle.

    One step the reference does not have: a box whose short side (the text's height) after
    the unclip is more than ``max_height_fraction`` of the frame's short side is dropped.
    On photos without fine structure (a cup, a silhouette, a smooth gradient) the model
    answers with one soft blob centred in its input whose size follows the *input*,
    0.6-0.8 × its height and 0.7-0.85 × its width at every input size tried (640-1280); the
    unclip then grows it by ``D = A · r / L`` (over 100 input pixels) past every edge, so
    it came back as one box covering the whole frame at 0.7-0.9 (docs/results.md). Text
    whose line is taller than the frame is not text a frame can show whole.
    """

    bin_threshold: float = 0.3
    unclip_ratio: float = 1.6
    max_candidates: int = 1000
    min_size: float = 3.0
    max_detections: int = 300
    name: str = "dbnet"
    dilate: bool = True
    max_height_fraction: float = 0.9

    def decode(self, outputs: Sequence[np.ndarray], lb: Letterbox, confidence: float) -> F32Array:
        return self.decode_quads(outputs, lb, confidence)[0]

    def decode_quads(
        self, outputs: Sequence[np.ndarray], lb: Letterbox, confidence: float
    ) -> tuple[F32Array, F32Array]:
        """:meth:`decode`, plus each detection's rotated rectangle: ``(N, 4, 2)`` corners in
        frame pixels (``cv2.boxPoints`` order), which the read stage straightens (read.py).

        The map is the model's float probabilities, or the byte map a GPU engine made of
        them on the device (:data:`DB_MAP_BYTES`)."""
        raw = np.asarray(outputs[0])
        on_device = raw.dtype == np.uint8
        prob = raw.reshape(raw.shape[-2:])
        if not on_device:
            prob = prob.astype(np.float32, copy=False)
        # Only the letterboxed frame, not the padding, can hold text.
        region = prob[lb.pad_y : lb.pad_y + lb.new_h, lb.pad_x : lb.pad_x + lb.new_w]
        # A byte map is binarised already (its top bit): one OpenCV pass reads it out, in less
        # time than numpy's comparison (docs/benchmarks.md, "The per-frame cuts"); bool -> 0/1
        # is a view.
        if on_device:
            bitmap = cv2.threshold(region, 127, 1, cv2.THRESH_BINARY)[1]
        else:
            bitmap = np.greater(region, self.bin_threshold).view(np.uint8)
        levels = db_map_levels(self.bin_threshold) if on_device else None
        if self.dilate:
            bitmap = np.asarray(cv2.dilate(bitmap, _DILATION_KERNEL), np.uint8)
        contours, _ = cv2.findContours(bitmap, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
        rows: list[tuple[float, float, float, float, float]] = []
        quads: list[npt.NDArray[Any]] = []
        for contour in contours[: self.max_candidates]:
            rect = cv2.minAreaRect(contour)
            if min(rect[1]) < self.min_size:
                continue
            corners = cv2.boxPoints(rect)
            score = _mean_inside(region, corners, levels)
            if score < confidence:
                continue
            grown = _unclip(corners, self.unclip_ratio)
            if min(grown[1]) < self.min_size + 2:
                continue
            if min(grown[1]) > self.max_height_fraction * min(region.shape):
                continue  # taller than the frame can hold: a whole-image response, not text
            pts = cv2.boxPoints(grown)
            (x0, y0), (x1, y1), (x2, y2), (x3, y3) = pts.tolist()  # float32 -> float: exact
            rows.append(
                (
                    min(x0, x1, x2, x3),
                    min(y0, y1, y2, y3),
                    max(x0, x1, x2, x3),
                    max(y0, y1, y2, y3),
                    score,
                )
            )
            quads.append(pts)
        if not rows:
            return empty_detections(), np.zeros((0, 4, 2), np.float32)
        dets = np.zeros((len(rows), 6), np.float32)
        dets[:, :5] = rows
        # Map region pixels to frame pixels: the region starts at the letterbox's origin.
        sx, sy = lb.src_w / lb.new_w, lb.src_h / lb.new_h
        # Rounded half to even (np.rint is np.round's decimals=0), then clipped to the frame;
        # ufuncs in place, as numpy's clip and round wrappers cost more than the few rows.
        scale = np.array((sx, sy, sx, sy), np.float32)
        frame = np.array((lb.src_w, lb.src_h, lb.src_w, lb.src_h), np.float32)
        box = np.rint(dets[:, :4] * scale)
        dets[:, :4] = np.minimum(np.maximum(box, 0, out=box), frame, out=box)
        big = (dets[:, 2] - dets[:, 0] > 3) & (dets[:, 3] - dets[:, 1] > 3)
        corners = np.asarray(quads, np.float32)[big] * scale[:2]
        corners = np.minimum(np.maximum(corners, 0, out=corners), frame[:2], out=corners)
        dets = dets[big]
        order = np.argsort(-dets[:, 4], kind="stable")[: self.max_detections]
        return dets[order], corners[order]


_DILATION_KERNEL = np.ones((2, 2), np.uint8)

RotatedRect = tuple[tuple[float, float], tuple[float, float], float]


def _mean_inside(
    prob: npt.NDArray[Any], corners: npt.NDArray[Any], levels: F32Array | None = None
) -> float:
    """Mean probability inside a rectangle (DB's 'fast' box score); ``levels``: what each
    byte of a :data:`DB_MAP_BYTES` map stands for.

    The corners are truncated towards zero to whole pixels before filling, as the reference
    does (``astype(int32)``); rounding instead shifts small boxes by a pixel."""
    h, w = prob.shape
    # Scalar math in plain Python: numpy's per-call cost dominates at four corners a box.
    # float32 -> float is exact, and so is a corner minus a whole pixel (both under 2**24),
    # so truncating here gives what ``(corners - (xmin, ymin)).astype(int32)`` gives.
    pts = corners.tolist()
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    xmin = min(max(math.floor(min(xs)), 0), w - 1)
    xmax = min(max(math.ceil(max(xs)), 0), w - 1)
    ymin = min(max(math.floor(min(ys)), 0), h - 1)
    ymax = min(max(math.ceil(max(ys)), 0), h - 1)
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), np.uint8)
    local = np.array([(math.trunc(x - xmin), math.trunc(y - ymin)) for x, y in pts], np.int32)
    cv2.fillPoly(mask, [local], 1)
    roi = prob[ymin : ymax + 1, xmin : xmax + 1]
    if levels is not None:  # each byte's probability: OpenCV's table lookup, as levels[roi]
        roi = cv2.LUT(roi, levels)
    return float(cv2.mean(roi, mask)[0])


def _unclip(corners: npt.NDArray[Any], ratio: float) -> RotatedRect:
    """The minimum-area rectangle of a rectangle offset outwards by ``D = A · ratio / L``,
    as the reference gets it from Clipper.

    ``A`` and ``L`` are the area and perimeter of the rectangle as found (not rounded).
    The reference offsets the polygon with Clipper's round joins, which work on integer
    coordinates: the corners are truncated, and every point of the offset polygon is
    rounded to a whole pixel. The rectangle around those points differs from the exact
    offset rectangle by up to a pixel on rotated boxes, which is enough to change what the
    recogniser reads from a blurred crop. :func:`_round_offset` computes the same points."""
    # The sides in the corners' own float32, as the reference measures them: in float64
    # the distance moves enough to flip a rounding of Clipper's points now and then.
    sides = corners[1:3] - corners[0:2]
    w, h = np.hypot(sides[:, 0], sides[:, 1]).tolist()
    distance = w * h * ratio / (2.0 * (w + h)) if w + h > 0 else 0.0
    whole = [(math.trunc(x), math.trunc(y)) for x, y in corners.tolist()]
    points = np.asarray(whole, np.int32) if distance < 1e-9 else _round_offset(whole, distance)
    (cx, cy), (rw, rh), angle = cv2.minAreaRect(points)
    return (cx, cy), (rw, rh), angle


def _round_half_away(v: float) -> int:
    return math.floor(v + 0.5) if v >= 0 else math.ceil(v - 0.5)


def _round_offset(pts: Sequence[tuple[int, int]], delta: float) -> npt.NDArray[np.int32]:
    """The integer polygon a closed convex polygon (whole-pixel corners) becomes when
    offset outwards by ``delta`` with round joins, as Clipper's offsetting does it: each
    edge moved out along its unit normal; at each corner an arc from one edge's normal to
    the next, in steps that keep the arc within 0.25 px of a circle; every point rounded
    half away from zero. Scalar math on a handful of points per box, so :mod:`math`, not
    numpy, with the rounding written out (a call a point is most of the cost)."""
    p = [(float(x), float(y)) for x, y in pts]
    n = len(p)
    area2 = sum(p[i][0] * p[(i + 1) % n][1] - p[(i + 1) % n][0] * p[i][1] for i in range(n))
    if area2 < 0:  # counter-clockwise in image coordinates, so the normals point out
        p.reverse()
    tolerance = min(0.25, delta * 0.25)
    steps = min(math.pi / math.acos(1.0 - tolerance / delta), delta * math.pi)
    step_sin, step_cos = math.sin(2.0 * math.pi / steps), math.cos(2.0 * math.pi / steps)
    steps_per_radian = steps / (2.0 * math.pi)
    normals = []
    hypot = math.hypot
    for (ax, ay), (bx, by) in zip(p, p[1:] + p[:1], strict=True):
        dx, dy = bx - ax, by - ay
        length = hypot(dx, dy)
        normals.append((dy / length, -dx / length) if length > 0 else (0.0, 0.0))
    floor, ceil = math.floor, math.ceil
    out: list[tuple[int, int]] = []
    add = out.append
    kx, ky = normals[-1]
    for (jx, jy), (px, py) in zip(normals, p, strict=True):
        sin_a = kx * jy - jx * ky
        cos_a = kx * jx + ky * jy
        if abs(sin_a * delta) < 1.0 and cos_a > 0:  # nearly straight: one point
            steps_here = 0
        else:
            sin_a = max(-1.0, min(1.0, sin_a))
            if sin_a * delta < 0:  # a concave corner: both offset ends and the corner itself
                r = _round_half_away
                add((r(px + kx * delta), r(py + ky * delta)))
                add((int(px), int(py)))
                add((r(px + jx * delta), r(py + jy * delta)))
                kx, ky = jx, jy
                continue
            steps_here = max(_round_half_away(steps_per_radian * abs(math.atan2(sin_a, cos_a))), 1)
        # The arc's normals from the last edge's (rotated a step at a time), then this
        # edge's; each point rounded as _round_half_away, written out.
        x, y = kx, ky
        for i in range(steps_here + 1):
            if steps_here and i == steps_here:
                x, y = jx, jy
            vx, vy = px + x * delta, py + y * delta
            add(
                (
                    floor(vx + 0.5) if vx >= 0 else ceil(vx - 0.5),
                    floor(vy + 0.5) if vy >= 0 else ceil(vy - 0.5),
                )
            )
            x, y = x * step_cos - step_sin * y, x * step_sin + y * step_cos
        kx, ky = jx, jy
    return np.array(out, np.int32)


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
    """Ultralytics v8/v11 raw output ``[4 + nc, A]``: cx, cy, w, h, then class scores; or
    the same model NMS'd on the device (:func:`yolo_v8_device_nms`)."""

    nms_iou: float = 0.45
    max_detections: int = 300
    name: str = "yolo_v8"

    def decode(self, outputs: Sequence[np.ndarray], lb: Letterbox, confidence: float) -> F32Array:
        if len(outputs) == 2:
            if not is_device_nms(outputs):
                raise ModelError(
                    "a YOLO v8 head got two outputs that are not the device NMS's "
                    f"(shapes {[tuple(np.shape(o)) for o in outputs]}); set model.head"
                )
            return decode_device_nms(outputs, lb, confidence, self.nms_iou, self.max_detections)
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


def is_db_map(output_shapes: Sequence[tuple[int, ...]]) -> bool:
    """One output, one probability map a frame (``[B, 1, H, W]``): DBNet's."""
    return len(output_shapes) == 1 and len(output_shapes[0]) == 4 and output_shapes[0][1] == 1


def is_yolo_v8_raw(output_shapes: Sequence[tuple[int, ...]]) -> bool:
    """One output ``[B, 4 + nc, A]`` with more anchors than rows: Ultralytics v8/v11's."""
    shapes = [tuple(s) for s in output_shapes]
    return len(shapes) == 1 and len(shapes[0]) == 3 and pick_head_name(shapes) == "yolo_v8"


def is_device_nms(outputs: Sequence[Any]) -> bool:
    """Outputs from :func:`yolo_v8_device_nms`: candidates ``[B, k, 6]`` and a state
    ``[B, k]`` (batch-first shapes, as the head is chosen from), or one frame's arrays
    ``[k, 6]`` float and ``[k]`` uint8."""
    if len(outputs) != 2:
        return False
    if all(hasattr(o, "dtype") for o in outputs):  # one frame's arrays
        dets, state = outputs
        shapes_fit = dets.ndim == 2 and dets.shape[1] == 6 and state.shape == dets.shape[:1]
        return bool(shapes_fit and np.dtype(state.dtype) == np.uint8)
    d, st = (tuple(o) for o in outputs)
    return len(d) == 3 and d[-1] == 6 and st == d[:-1]


def decode_device_nms(
    outputs: Sequence[np.ndarray], lb: Letterbox, confidence: float, iou: float, max_det: int
) -> F32Array:
    """The detections of one frame NMS'd on the device (:func:`yolo_v8_device_nms`): its
    kept candidates at or above ``confidence``; when the device's rounds did not settle,
    greedy NMS here on its candidates, in the device's order."""
    dets = np.asarray(outputs[0], np.float32).reshape(-1, 6)
    state = np.asarray(outputs[1]).reshape(-1)
    confident = dets[:, 4] >= confidence
    if (state == NMS_UNDECIDED).any():
        d = dets[confident]
        return _nms_detections(d[:, :4], d[:, 4], d[:, 5], iou, lb, max_det)
    return _finish(dets[confident & (state == NMS_KEPT)], lb, max_det)


def pick_head_name(output_shapes: Sequence[tuple[int, ...]]) -> str:
    """Which head decodes outputs of these (batch-first, concrete) shapes."""
    shapes = [tuple(s) for s in output_shapes]
    if len(shapes) == 4 and len(shapes[1]) == 3 and shapes[1][-1] == 4:
        return "efficient_nms"
    if is_device_nms(shapes):  # engine.torch.device_post's NMS (yolo_v8_device_nms)
        return "yolo_v8"
    if len(shapes) == 1:
        s = shapes[0]
        if is_db_map(shapes):
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
    dilate: bool = True,
    max_height_fraction: float = 0.9,
) -> Head:
    if name == "dbnet":
        return DbnetHead(
            bin_threshold,
            unclip_ratio,
            max_candidates,
            min_size,
            max_detections,
            dilate=dilate,
            max_height_fraction=max_height_fraction,
        )
    if name == "yolo_v8":
        return YoloV8Head(nms_iou, max_detections)
    if name == "yolo_v5":
        return YoloV5Head(nms_iou, max_detections)
    if name == "end_to_end":
        return EndToEndHead(max_detections)
    if name == "efficient_nms":
        return EfficientNmsHead(max_detections)
    raise ModelError(f"unknown head {name!r}; known: {', '.join(HEAD_NAMES)}")


def choose_head(
    configured: str | None, output_shapes: Sequence[tuple[int, ...]], model: ModelConfig
) -> Head:
    """The model's head, chosen once: ``configured`` (``model.head`` unless ``auto``) or
    else the one its batch-first output shapes call for (:func:`pick_head_name`), made
    with the ``model.*`` settings. The service chooses it when its first engine is warm;
    the pipeline and the INT8 gate decode with what this returns, never a copy."""
    d = model.dbnet
    return make_head(
        configured or pick_head_name(output_shapes),
        nms_iou=model.nms_iou,
        max_detections=model.max_detections,
        bin_threshold=d.bin_threshold,
        unclip_ratio=d.unclip_ratio,
        max_candidates=d.max_candidates,
        min_size=d.min_size,
        dilate=d.dilate,
        max_height_fraction=d.max_height_fraction,
    )


def filter_classes(dets: F32Array, classes: frozenset[int] | None) -> F32Array:
    """Keep only detections whose class is in ``classes`` (``None`` keeps all)."""
    if classes is None or not len(dets):
        return dets
    mask = np.isin(dets[:, 5].astype(np.int64), np.fromiter(classes, np.int64, len(classes)))
    return dets[mask]
