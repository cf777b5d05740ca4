"""Model heads on literal outputs: one (N, 6) contract in frame pixels."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from edge_vision.config import ModelConfig
from edge_vision.errors import ModelError
from edge_vision.model.heads import (
    DbnetHead,
    EfficientNmsHead,
    EndToEndHead,
    YoloV5Head,
    YoloV8Head,
    batched_nms,
    choose_head,
    filter_classes,
    nms,
    pick_head_name,
)
from edge_vision.model.shape import InputLimits, plan_for_frame, plan_letterbox

# A 1280x720 frame letterboxed into 640x384: scale 0.5, 12 px top padding.
LB = plan_letterbox(1280, 720, 384, 640)


def test_nms_suppresses_overlaps_and_keeps_best_first() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], np.float32)
    scores = np.array([0.8, 0.9, 0.7], np.float32)
    assert nms(boxes, scores, 0.5).tolist() == [1, 2]


def test_class_aware_nms_keeps_overlapping_boxes_of_other_classes() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11]], np.float32)
    scores = np.array([0.8, 0.9], np.float32)
    assert sorted(batched_nms(boxes, scores, np.array([0, 1], np.float32), 0.5).tolist()) == [0, 1]


def test_dbnet_finds_a_text_blob_and_maps_it_to_frame_pixels() -> None:
    prob = np.zeros((1, 384, 640), np.float32)
    prob[0, 112:132, 100:300] = 0.9  # a shrunk text kernel, input pixels
    dets = DbnetHead(unclip_ratio=1.5).decode([prob], LB, confidence=0.5)
    assert dets.shape == (1, 6) and dets[0, 5] == 0
    x1, y1, x2, y2, score = dets[0, :5]
    # The 2x2 dilation grows the kernel by a pixel, so the mean over its rectangle takes in
    # a ring of zeros: 0.853, what the reference DBPostProcess gives for this map too.
    assert score == pytest.approx(0.853, abs=0.005)
    # kernel in frame pixels: x 200..600, y 200..240; unclip grows it by a few px per side
    assert 170 < x1 < 200 and 600 < x2 < 630 and 170 < y1 < 200 and 240 < y2 < 270


def test_dbnet_maps_a_stretched_input_back_per_axis() -> None:
    # The default model's fit: a 1280x720 frame stretched to fill 640x352 (x by 0.5, y by
    # 352/720, no padding), as the reference pipeline feeds it.
    lb = plan_for_frame(1280, 720, InputLimits(fit="stretch"))
    assert lb.shape == (352, 640) and (lb.pad_x, lb.pad_y) == (0, 0)
    prob = np.zeros((1, 352, 640), np.float32)
    prob[0, 110:130, 100:300] = 0.9
    dets = DbnetHead(unclip_ratio=1.5).decode([prob], lb, confidence=0.5)
    assert dets.shape == (1, 6)
    x1, y1, x2, y2 = dets[0, :4]
    # kernel in frame pixels: x 200..600, y 110/0.489=225..266; unclip grows it a little
    assert 170 < x1 < 200 and 600 < x2 < 630 and 190 < y1 < 225 and 266 < y2 < 300


def test_dbnet_ignores_weak_blobs_and_padding() -> None:
    prob = np.zeros((1, 384, 640), np.float32)
    prob[0, 100:120, 100:300] = 0.4  # above binarisation, below the box score threshold
    prob[0, 0:10, 0:640] = 0.99  # inside the letterbox padding
    assert len(DbnetHead().decode([prob], LB, confidence=0.5)) == 0


def test_yolo_v8_raw_output() -> None:
    a = 3
    pred = np.zeros((4 + 2, a), np.float32)
    pred[:4, 0] = [320, 192, 100, 50]  # cx, cy, w, h in input pixels
    pred[4:, 0] = [0.1, 0.8]  # class 1
    pred[:4, 1] = [322, 194, 100, 50]  # duplicate, lower score
    pred[4:, 1] = [0.05, 0.6]
    pred[4:, 2] = [0.2, 0.1]  # below threshold
    dets = YoloV8Head().decode([pred], LB, confidence=0.25)
    assert dets.shape == (1, 6)
    np.testing.assert_allclose(dets[0], [540, 310, 740, 410, 0.8, 1], atol=1e-4)


def test_yolo_v5_raw_output_uses_objectness() -> None:
    pred = np.array(
        [[320, 192, 100, 50, 0.5, 0.9, 0.1], [320, 192, 100, 50, 0.2, 0.9, 0.9]], np.float32
    )
    dets = YoloV5Head().decode([pred], LB, confidence=0.3)
    assert dets.shape == (1, 6)
    assert dets[0, 4] == pytest.approx(0.45) and dets[0, 5] == 0


def test_end_to_end_and_efficient_nms_outputs() -> None:
    e2e = np.array([[270, 162, 370, 212, 0.9, 3], [0, 0, 1, 1, 0.1, 0]], np.float32)
    dets = EndToEndHead().decode([e2e], LB, confidence=0.5)
    np.testing.assert_allclose(dets, [[540, 300, 740, 400, 0.9, 3]])
    outs = [
        np.array([1]),
        np.array([[270, 162, 370, 212], [0, 0, 0, 0]], np.float32),
        np.array([0.7, 0.0], np.float32),
        np.array([2, 0], np.float32),
    ]
    dets = EfficientNmsHead().decode(outs, LB, confidence=0.5)
    np.testing.assert_allclose(dets, [[540, 300, 740, 400, 0.7, 2]])


@pytest.mark.parametrize(
    ("shapes", "head"),
    [
        ([(1, 1, 384, 640)], "dbnet"),
        ([(1, 84, 5040)], "yolo_v8"),
        ([(1, 25200, 85)], "yolo_v5"),
        ([(1, 300, 6)], "end_to_end"),
        ([(1, 1), (1, 100, 4), (1, 100), (1, 100)], "efficient_nms"),
    ],
)
def test_head_is_picked_from_output_shapes(shapes: list[tuple[int, ...]], head: str) -> None:
    assert pick_head_name(shapes) == head


def test_the_head_is_chosen_once_with_the_model_settings() -> None:
    model = ModelConfig(dbnet={"bin_threshold": 0.4, "dilate": False}, max_detections=7)
    head = choose_head(None, [(1, 1, 384, 640)], model)
    assert head == DbnetHead(bin_threshold=0.4, max_detections=7, dilate=False)
    # model.head set: it wins over what the shapes would say
    assert choose_head("yolo_v5", [(1, 1, 384, 640)], model) == YoloV5Head(max_detections=7)


def test_unknown_outputs_name_the_config_key() -> None:
    with pytest.raises(ModelError, match=r"model\.head"):
        pick_head_name([(1, 2, 3, 4, 5)])


def test_class_filter() -> None:
    dets = np.array([[0, 0, 1, 1, 0.9, 0], [0, 0, 1, 1, 0.8, 2]], np.float32)
    assert filter_classes(dets, frozenset({2}))[:, 5].tolist() == [2]
    assert len(filter_classes(dets, None)) == 2


def test_the_unclip_gives_the_reference_s_clipper_rectangle_on_rotated_boxes() -> None:
    """The reference grows each DB box with Clipper's integer round-join offset (pyclipper,
    a dependency of its wheel); ours computes the same points, so the rectangle around them
    is the reference's to the pixel, rotated boxes included."""
    import cv2

    pyclipper = pytest.importorskip(
        "pyclipper",
        reason="pyclipper (rapidocr's offsetter) is not installed here",
    )
    from edge_vision.model.heads import _unclip

    rng = np.random.default_rng(7)
    rotated = 0
    for _ in range(1000):
        centre = (rng.uniform(20, 600), rng.uniform(20, 400))
        size = (rng.uniform(3, 300), rng.uniform(3, 60))
        angle = rng.uniform(-90, 90)
        corners = cv2.boxPoints((centre, size, angle))
        w = float(np.hypot(*(corners[1] - corners[0])))
        h = float(np.hypot(*(corners[2] - corners[1])))
        offset = pyclipper.PyclipperOffset()
        offset.AddPath(corners, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
        grown = np.array(offset.Execute(w * h * 1.6 / (2 * (w + h)))).reshape(-1, 1, 2)
        want = cv2.minAreaRect(grown.astype(np.int32))
        got = _unclip(corners, 1.6)
        np.testing.assert_allclose(got[0], want[0], atol=1e-4)
        np.testing.assert_allclose(got[1], want[1], atol=1e-4)
        assert abs(got[2] - want[2]) < 1e-4
        rotated += abs(angle) % 90 > 1
    assert rotated > 900


def test_the_post_bench_decodes_float_and_byte_maps_as_a_git_revision_does(
    tmp_path: Path,
) -> None:
    """``python -m benchmarks.post``: the same detections as post.py at HEAD on
    maps with lines to find, from the float map and from a GPU engine's byte map."""
    pytest.importorskip("torch", reason="the bench makes byte maps with post.db_map_bytes")
    from benchmarks.post import main

    out = tmp_path / "post.json"
    args = ["--boxes", "2", "30", "--maps", "3", "--rounds", "1", "--baseline", "HEAD"]
    threads = cv2.getNumThreads()
    try:
        assert main([*args, "--opencv-threads", "1", "--gap-ms", "1", "--json", str(out)]) == 0
    finally:
        cv2.setNumThreads(threads)
    got = json.loads(out.read_text())
    assert got["versions"] == ["current", "HEAD"]
    assert got["opencv_threads"] == 1 and got["gap_ms"] == 1
    for key in ("float-2", "float-30", "bytes-2", "bytes-30"):
        row = got["maps"][key]
        assert row["same_detections"] is True
        assert row["detections_per_frame"] >= 1
        assert row["current"]["frames"] == 3 and row["current"]["cpu_median_ms"] > 0
