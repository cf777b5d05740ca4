"""Domain assertions with readable names."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

Box = Sequence[float]


def iou(a: Box, b: Box) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def boxes_of(result: dict[str, Any]) -> list[Box]:
    return [d["box"] for d in result["detections"]]


def assert_box_overlaps(result: dict[str, Any], region: Box, iou_min: float = 0.5) -> None:
    """Some detection in ``result`` overlaps ``region`` with IoU >= ``iou_min``."""
    best = max((iou(b, region) for b in boxes_of(result)), default=0.0)
    assert best >= iou_min, (
        f"no detection overlaps {list(region)} with IoU >= {iou_min} (best {best:.2f}); "
        f"detections: {result['detections']}"
    )


def assert_no_detections(result: dict[str, Any]) -> None:
    assert result["detections"] == [], f"expected no detections, got {result['detections']}"


def assert_boxes_inside_frame(result: dict[str, Any]) -> None:
    w, h = result["width"], result["height"]
    for b in boxes_of(result):
        assert 0 <= b[0] <= b[2] <= w and 0 <= b[1] <= b[3] <= h, f"box {b} outside {w}x{h}"


def assert_timings_present(result: dict[str, Any]) -> None:
    timing = result["timing"]
    for key in ("decode_ms", "queue_ms", "infer_ms", "post_ms", "server_ms"):
        assert key in timing and timing[key] >= 0, f"timing lacks {key}: {timing}"
    assert timing["server_ms"] >= timing["infer_ms"]


def assert_same_boxes(a: Iterable[Box], b: Iterable[Box], tol: float) -> None:
    la, lb = sorted(map(list, a)), sorted(map(list, b))
    assert len(la) == len(lb), f"{len(la)} boxes vs {len(lb)}: {la} / {lb}"
    for x, y in zip(la, lb, strict=True):
        assert max(abs(p - q) for p, q in zip(x, y, strict=True)) <= tol, f"{x} vs {y} (tol {tol})"
