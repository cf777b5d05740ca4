"""agreement.match_detections: literal boxes in, the figures a gate or a report shows out."""

from __future__ import annotations

import numpy as np
import pytest

from edge_vision.common.agreement import Agreement, match_detections, pairwise_iou

pytestmark = pytest.mark.timeout(10)


def dets(*rows: tuple[float, ...]) -> np.ndarray:
    return np.array(rows, dtype=np.float32).reshape(-1, 6)


REF = dets((0, 0, 10, 10, 0.9, 0), (20, 20, 40, 40, 0.8, 1), (50, 0, 60, 10, 0.7, 0))


def test_identical_detections_agree_fully() -> None:
    a = match_detections(REF, REF.copy())
    assert (a.recall, a.precision, a.score, a.matched) == (1.0, 1.0, 1.0, 3)
    assert a.mean_iou == pytest.approx(1.0)


def test_both_empty_agree_and_one_empty_does_not() -> None:
    empty = dets()
    assert match_detections(empty, empty).score == 1.0
    missing = match_detections(REF, empty)
    assert (missing.recall, missing.precision) == (0.0, 0.0)
    extra = match_detections(empty, REF)
    assert (extra.recall, extra.precision, extra.candidate) == (0.0, 0.0, 3)


def test_a_missed_box_lowers_recall_not_precision() -> None:
    a = match_detections(REF, REF[:2])
    assert a.recall == pytest.approx(2 / 3)
    assert a.precision == 1.0
    assert a.score == pytest.approx(2 / 3)


def test_an_extra_box_lowers_precision_not_recall() -> None:
    cand = np.vstack([REF, dets((100, 100, 120, 120, 0.95, 0))])
    a = match_detections(REF, cand)
    assert (a.recall, a.precision) == (1.0, 0.75)


def test_shifted_box_matches_only_above_the_threshold() -> None:
    shifted = dets((0, 5, 10, 15, 0.9, 0))  # IoU with (0,0,10,10) is 50/150 = 1/3
    assert match_detections(REF[:1], shifted, iou_threshold=0.3).matched == 1
    assert match_detections(REF[:1], shifted, iou_threshold=0.5).matched == 0
    assert match_detections(REF[:1], shifted, iou_threshold=0.3).mean_iou == pytest.approx(1 / 3)


def test_class_mismatch_is_not_a_match_unless_classes_are_ignored() -> None:
    other_class = dets((0, 0, 10, 10, 0.9, 5))
    assert match_detections(REF[:1], other_class).matched == 0
    assert match_detections(REF[:1], other_class, class_aware=False).matched == 1


def test_one_reference_box_matches_one_candidate_only_highest_score_first() -> None:
    dup = dets((0, 0, 10, 10, 0.5, 0), (0, 0, 10, 11, 0.9, 0))
    a = match_detections(REF[:1], dup)
    assert (a.matched, a.recall, a.precision) == (1, 1.0, 0.5)
    # the higher-scored duplicate took the match: its IoU is 100/110, not 1.0
    assert a.mean_iou == pytest.approx(100 / 110, rel=1e-5)


def test_pooling_frames_adds_counts() -> None:
    total = match_detections(REF, REF) + match_detections(REF, REF[:1])
    assert (total.reference, total.candidate, total.matched) == (6, 4, 4)
    assert total.recall == pytest.approx(4 / 6)
    assert total.as_dict()["precision"] == 1.0
    assert "4 of 6 reference boxes" in total.describe()


def test_pooling_different_thresholds_is_refused() -> None:
    with pytest.raises(ValueError, match="thresholds"):
        _ = Agreement(1, 1, 1, 0.5, 1.0) + Agreement(1, 1, 1, 0.7, 1.0)


def test_bad_shapes_and_thresholds_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\(N, 6\)"):
        match_detections(np.zeros((2, 4), np.float32), REF)
    with pytest.raises(ValueError, match="iou_threshold"):
        match_detections(REF, REF, iou_threshold=0.0)


def test_pairwise_iou_literal_values() -> None:
    a = np.array([[0, 0, 10, 10], [0, 0, 0, 0]], np.float32)
    b = np.array([[5, 0, 15, 10]], np.float32)
    ious = pairwise_iou(a, b)
    assert ious.shape == (2, 1)
    assert ious[0, 0] == pytest.approx(50 / 150)
    assert ious[1, 0] == 0.0  # a degenerate box overlaps nothing
