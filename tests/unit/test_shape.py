"""Input shape choice, letterbox geometry and exact mapping back to frame pixels."""

from __future__ import annotations

import numpy as np
import pytest

from edge_vision.model.shape import (
    InputLimits,
    choose_input_shape,
    letterbox_into,
    normalise_into,
    plan_fit,
    plan_for_frame,
    plan_letterbox,
    side_range,
)
from edge_vision.model.spec import PRESETS

LIM = InputLimits(target=640, stride=32, min_side=32, max_side=1280)  # letterbox (YOLO's)
# The default text detector's (model.fit: preset → stretch, as PP-OCR's DetPreProcess).
STRETCH = InputLimits(target=640, stride=32, min_side=32, max_side=1280, fit="stretch")


@pytest.mark.parametrize(
    ("w", "h", "expected"),
    [
        (1920, 1080, (384, 640)),  # 16:9 runs at 640x384, not 640x640
        (1280, 720, (384, 640)),
        (640, 480, (480, 640)),
        (1080, 1920, (640, 384)),  # portrait
        (1000, 1000, (640, 640)),
        (320, 240, (480, 640)),  # small frames are scaled up to the target
        (4000, 100, (32, 640)),  # clamped to min_side
    ],
)
def test_choose_input_shape(w: int, h: int, expected: tuple[int, int]) -> None:
    assert choose_input_shape(w, h, LIM) == expected


@pytest.mark.parametrize(
    ("w", "h", "expected"),
    [
        # Each side to the *nearest* multiple of 32, the scaled side truncated first, as the
        # reference does: 1080 * 640/1920 = 360 → 352 (a letterbox rounds up to 384).
        (1920, 1080, (352, 640)),
        (1280, 720, (352, 640)),
        (640, 360, (352, 640)),
        (640, 480, (480, 640)),
        (1080, 1920, (640, 352)),  # portrait
        (1000, 1000, (640, 640)),
        (1000, 560, (352, 640)),  # 358.4 → 358 → 11.19 strides → 352
        (1000, 580, (384, 640)),  # 371.2 → 371 → 11.59 strides → 384
        (4000, 100, (32, 640)),  # clamped to min_side
    ],
)
def test_choose_input_shape_stretch_rounds_to_the_nearest_stride(
    w: int, h: int, expected: tuple[int, int]
) -> None:
    assert choose_input_shape(w, h, STRETCH) == expected


def test_the_default_model_stretches_a_16_9_frame_to_fill_640x352() -> None:
    from edge_vision.config import ModelConfig
    from edge_vision.model.spec import load_model_spec

    spec = load_model_spec(ModelConfig())  # model.fit: preset, the PP-OCR detector
    assert spec.limits == STRETCH
    lb = plan_for_frame(1280, 720, spec.limits)
    assert (lb.out_w, lb.out_h, lb.new_w, lb.new_h, lb.pad_x, lb.pad_y) == (
        640,
        352,
        640,
        352,
        0,
        0,
    )
    # letterbox stays available: model.fit: letterbox gives the padded 640x384
    boxed = load_model_spec(ModelConfig(fit="letterbox"))
    assert plan_for_frame(1280, 720, boxed.limits).shape == (384, 640)


def test_stretch_maps_boxes_back_per_axis_exactly() -> None:
    lb = plan_for_frame(1280, 720, STRETCH)  # x by 0.5, y by 352/720
    boxes = np.array([[0, 0, 640, 352, 0.9, 0], [320, 176, 330, 187, 0.5, 1]], np.float32)
    lb.to_frame(boxes)
    np.testing.assert_allclose(boxes[0, :4], [0, 0, 1280, 720], rtol=1e-6)
    np.testing.assert_allclose(boxes[1, :4], [640, 360, 660, 382.5], rtol=1e-6)


def test_stretch_fills_the_whole_input_without_padding() -> None:
    src = np.zeros((720, 1280, 3), np.uint8)
    src[:, 640:] = 255
    src[:8] = 90  # the top rows of the frame land in the top rows of the input
    lb = plan_fit(1280, 720, 352, 640, "stretch")
    assert lb == plan_for_frame(1280, 720, STRETCH)
    dst = np.zeros((352, 640, 3), np.uint8)
    letterbox_into(src, lb, dst, pad_value=114)
    assert (dst == 114).sum() == 0  # nothing padded
    assert dst[0, 100].max() == 90 and dst[200, 100].max() == 0 and dst[200, 500].min() == 255
    assert plan_fit(1280, 720, 384, 640, "letterbox") == plan_letterbox(1280, 720, 384, 640)


def test_shape_is_clamped_to_profile() -> None:
    lim = InputLimits(target=2000, stride=32, min_side=64, max_side=960)
    assert choose_input_shape(1920, 1080, lim) == (960, 960)


def test_side_range_is_the_clamp_and_stops_at_the_rounded_target() -> None:
    assert side_range(LIM) == (32, 640)  # max_side 1280 allows more; no frame gets there
    assert side_range(InputLimits(target=650, stride=32, min_side=40, max_side=1280)) == (64, 672)
    assert side_range(InputLimits(target=640, stride=32, min_side=640, max_side=640)) == (640, 640)
    sides = {
        side
        for w in (1, 100, 640, 1920, 5000)
        for h in (1, 100, 480, 1080, 5000)
        for side in choose_input_shape(w, h, LIM)
    }
    assert (min(sides), max(sides)) == side_range(LIM)


def test_letterbox_centres_and_maps_boxes_back_exactly() -> None:
    lb = plan_for_frame(1280, 720, LIM)
    assert (lb.out_w, lb.out_h, lb.new_w, lb.new_h, lb.pad_x, lb.pad_y) == (
        640,
        384,
        640,
        360,
        0,
        12,
    )
    boxes = np.array([[0, 12, 640, 372, 0.9, 0], [320, 192, 330, 202, 0.5, 1]], np.float32)
    lb.to_frame(boxes)
    np.testing.assert_allclose(boxes[0, :4], [0, 0, 1280, 720])
    np.testing.assert_allclose(boxes[1, :4], [640, 360, 660, 380])


def test_boxes_are_clipped_to_the_frame() -> None:
    lb = plan_letterbox(100, 50, 64, 128)
    boxes = np.array([[-20, -20, 500, 500, 1, 0]], np.float32)
    lb.to_frame(boxes)
    np.testing.assert_allclose(boxes[0, :4], [0, 0, 100, 50])


def test_letterbox_into_pads_with_the_pad_value() -> None:
    src = np.full((360, 640, 3), 200, np.uint8)
    lb = plan_letterbox(640, 360, 384, 640)
    dst = np.zeros((384, 640, 3), np.uint8)
    letterbox_into(src, lb, dst, pad_value=114)
    assert (dst[:12] == 114).all() and (dst[-12:] == 114).all()
    assert (dst[12:372] == 200).all()


def test_letterbox_resizes_a_larger_source() -> None:
    src = np.zeros((720, 1280, 3), np.uint8)
    src[:, 640:] = 255  # right half white
    lb = plan_letterbox(1280, 720, 384, 640)
    dst = np.zeros((384, 640, 3), np.uint8)
    letterbox_into(src, lb, dst, pad_value=0)
    assert dst[192, 100].max() == 0 and dst[192, 500].min() == 255


def test_normalise_ppocr_bgr_and_yolo_rgb() -> None:
    frame = np.zeros((2, 2, 3), np.uint8)
    frame[..., 0], frame[..., 1], frame[..., 2] = 0, 127, 255  # B, G, R
    out = np.empty((1, 3, 2, 2), np.float32)
    normalise_into(out, [frame], PRESETS["ppocr_det"][0])
    np.testing.assert_allclose(out[0, :, 0, 0], [-1.0, (127 - 127.5) / 127.5, 1.0], atol=1e-6)
    normalise_into(out, [frame], PRESETS["yolo"][0])
    np.testing.assert_allclose(out[0, :, 0, 0], [1.0, 127 / 255, 0.0], rtol=1e-6)  # R, G, B
