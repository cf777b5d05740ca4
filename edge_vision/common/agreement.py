"""How far two engines' detections agree: one pure numpy function, no I/O.

Used wherever one engine's answer is checked against another's: the INT8 accuracy gate
(an INT8 plan against FP16 or ONNX Runtime), ``edge-vision doctor`` (the board's engine
against ONNX Runtime on the CPU) and the result comparisons of the benchmarks.

Both inputs use the project's one output contract: ``(N, 6)`` float arrays of
``x1, y1, x2, y2, score, class`` in original-frame pixels. Matching is greedy: candidate
boxes are taken in descending score order and each is paired with the still unmatched
reference box of the same class (unless ``class_aware`` is off) that it overlaps most,
if that overlap is at least ``iou_threshold``. This is the matching COCO's evaluation
uses for one IoU threshold, without the precision/recall curve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F32Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Agreement:
    """The matching of ``candidate`` detections against ``reference`` ones.

    ``recall`` is the fraction of reference boxes a candidate box matched, ``precision``
    the fraction of candidate boxes that matched a reference box. Both are 1.0 when both
    sides are empty (two engines that agree there is nothing agree perfectly).
    """

    reference: int
    candidate: int
    matched: int
    iou_threshold: float
    mean_iou: float  # mean IoU of the matched pairs; 1.0 when nothing was matched

    @property
    def recall(self) -> float:
        return (
            self.matched / self.reference if self.reference else 1.0 if not self.candidate else 0.0
        )

    @property
    def precision(self) -> float:
        return (
            self.matched / self.candidate if self.candidate else 1.0 if not self.reference else 0.0
        )

    @property
    def score(self) -> float:
        """The lower of recall and precision: one figure to compare with a threshold."""
        return min(self.recall, self.precision)

    def __add__(self, other: Agreement) -> Agreement:
        """Pool two matchings (e.g. of several frames) made at the same threshold."""
        if other.iou_threshold != self.iou_threshold:
            raise ValueError("cannot pool agreements made at different IoU thresholds")
        matched = self.matched + other.matched
        mean = (
            (self.mean_iou * self.matched + other.mean_iou * other.matched) / matched
            if matched
            else 1.0
        )
        return Agreement(
            self.reference + other.reference,
            self.candidate + other.candidate,
            matched,
            self.iou_threshold,
            mean,
        )

    def as_dict(self) -> dict[str, float | int]:
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "matched": self.matched,
            "iou_threshold": self.iou_threshold,
            "recall": round(self.recall, 4),
            "precision": round(self.precision, 4),
            "mean_iou": round(self.mean_iou, 4),
        }

    def describe(self) -> str:
        return (
            f"{self.matched} of {self.reference} reference boxes matched "
            f"(recall {self.recall:.3f}), {self.matched} of {self.candidate} candidate boxes "
            f"(precision {self.precision:.3f}) at IoU >= {self.iou_threshold:g}"
        )


def pairwise_iou(a: npt.NDArray[np.floating], b: npt.NDArray[np.floating]) -> F32Array:
    """IoU of every box in ``a`` (M, >=4) with every box in ``b`` (N, >=4): an (M, N) array."""
    a = np.asarray(a, dtype=np.float32).reshape(-1, np.shape(a)[-1] if np.size(a) else 4)
    b = np.asarray(b, dtype=np.float32).reshape(-1, np.shape(b)[-1] if np.size(b) else 4)
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-9), 0.0).astype(np.float32)


def match_detections(
    reference: npt.NDArray[np.floating],
    candidate: npt.NDArray[np.floating],
    iou_threshold: float = 0.5,
    class_aware: bool = True,
) -> Agreement:
    """Match ``candidate`` (N, 6) detections against ``reference`` (M, 6) ones, greedily.

    Raises ``ValueError`` for arrays that are not (K, 6) (or (K, 4) with
    ``class_aware=False``; boxes without scores are then taken in the given order).
    """
    ref = _as_detections(reference, class_aware)
    cand = _as_detections(candidate, class_aware)
    if not 0.0 < iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must be in (0, 1], not {iou_threshold}")
    if not len(ref) or not len(cand):
        return Agreement(len(ref), len(cand), 0, iou_threshold, 1.0)
    ious = pairwise_iou(cand, ref)
    if class_aware:
        ious = np.where(cand[:, None, 5] == ref[None, :, 5], ious, 0.0)
    order = np.argsort(-cand[:, 4], kind="stable") if cand.shape[1] > 4 else np.arange(len(cand))
    taken = np.zeros(len(ref), dtype=bool)
    matched_ious: list[float] = []
    for i in order:
        row = np.where(taken, -1.0, ious[i])
        j = int(np.argmax(row))
        if row[j] >= iou_threshold:
            taken[j] = True
            matched_ious.append(float(row[j]))
    mean = float(np.mean(matched_ious)) if matched_ious else 1.0
    return Agreement(len(ref), len(cand), len(matched_ious), iou_threshold, mean)


def _as_detections(dets: npt.NDArray[np.floating], class_aware: bool) -> F32Array:
    arr = np.asarray(dets, dtype=np.float32)
    if arr.size == 0:
        return np.zeros((0, 6), dtype=np.float32)
    need = 6 if class_aware else 4
    if arr.ndim != 2 or arr.shape[1] < need:
        raise ValueError(f"detections must be a (N, {need}) array, not shape {arr.shape}")
    return arr
