"""The read stage's pure parts with literal inputs: CTC greedy decoding, crops that
straighten rotated boxes, recogniser batches, and what a session re-reads."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edge_vision.errors import ModelError
from edge_vision.frames.read import (
    CtcDecoder,
    ReadText,
    SessionReading,
    batch_width,
    box_quad,
    crop_quad,
    order_quad,
    recogniser_batches,
    resize_into,
)
from edge_vision.frames.track import Tracker

pytestmark = pytest.mark.timeout(30)

# Classes: 0 blank, 1 "A", 2 "B", 3 "7", 4 " " (appended space).
DECODER = CtcDecoder(["A", "B", "7"])


def decode_one(indices: list[int], probs: list[float] | None = None) -> tuple[str, float]:
    p = probs if probs is not None else [0.9] * len(indices)
    return DECODER.decode(np.array([indices]), np.array([p]))[0]


def test_class_list_is_blank_then_the_models_characters_then_a_space() -> None:
    assert DECODER.classes == ["", "A", "B", "7", " "]
    assert DECODER.num_classes == 5


def test_repeats_merge_and_blanks_separate_doubled_letters() -> None:
    assert decode_one([1, 1, 0, 2, 2, 2])[0] == "AB"
    assert decode_one([1, 0, 1])[0] == "AA"  # a blank between repeats keeps both
    assert decode_one([3, 4, 1, 1, 4, 2])[0] == "7 A B"


def test_score_is_the_mean_probability_of_the_kept_columns() -> None:
    text, score = decode_one([0, 1, 1, 0, 2], [0.99, 0.8, 0.2, 0.99, 0.6])
    assert text == "AB"
    assert score == pytest.approx((0.8 + 0.6) / 2)


def test_nothing_read_is_an_empty_string_with_score_zero() -> None:
    assert decode_one([0, 0, 0]) == ("", 0.0)


def test_a_class_past_the_character_list_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="5 classes"):
        decode_one([1, 9])


def test_the_list_comes_from_the_models_metadata() -> None:
    dec = CtcDecoder.from_metadata({"character": "x\ny\nz"})
    assert dec.classes == ["", "x", "y", "z", " "]
    with pytest.raises(ModelError, match="'character'"):
        CtcDecoder.from_metadata({}, "rec.onnx")


def test_quad_corners_in_any_order_come_back_clockwise_from_top_left() -> None:
    corners = np.array([[10, 40], [10, 20], [90, 20], [90, 40]], np.float32)  # boxPoints-like
    assert order_quad(corners).tolist() == [[10, 20], [90, 20], [90, 40], [10, 40]]
    assert box_quad([1, 2, 3, 4]).tolist() == [[1, 2], [3, 2], [3, 4], [1, 4]]


def test_a_rotated_box_is_straightened_to_its_own_side_lengths() -> None:
    # A dark 120x30 bar on white, rotated by 20 degrees: the crop of its rotated
    # rectangle is upright, 120x30, and dark all over.
    img = np.full((300, 300, 3), 255, np.uint8)
    rect = ((150.0, 150.0), (120.0, 30.0), 20.0)
    corners = cv2.boxPoints(rect)
    cv2.fillPoly(img, [corners.astype(np.int32)], (0, 0, 0))
    crop = crop_quad(img, corners)
    h, w = crop.shape[:2]
    assert abs(h - 30) <= 1 and abs(w - 120) <= 1  # side lengths truncated, as the reference
    inner = crop[4:-4, 4:-4]
    assert inner.mean() < 20  # all bar, no white corners: it was straightened
    # The axis-aligned box of the same bar would be mostly white around it.
    x1, y1 = corners.min(axis=0)
    x2, y2 = corners.max(axis=0)
    assert crop_quad(img, box_quad([x1, y1, x2, y2])).mean() > 60


def test_a_tall_crop_is_turned_to_read_as_a_line() -> None:
    img = np.zeros((200, 200, 3), np.uint8)
    crop = crop_quad(img, box_quad([10, 10, 30, 110]))  # 20 wide, 100 tall
    assert crop.shape[:2] == (20, 100)


def test_corners_are_cropped_at_whole_pixels_as_the_reference_rounds_its_polygons() -> None:
    rng = np.random.default_rng(4)
    img = rng.integers(0, 256, (120, 200, 3), dtype=np.uint8)
    exact = np.array(
        [[688.2 - 640, 69.2], [768.7 - 640, 53.8], [774.1 - 640, 83.2], [693.5 - 640, 98.6]]
    )
    rounded = np.round(exact)  # 48, 69 / 129, 54 / 134, 83 / 54, 99: half to even
    np.testing.assert_array_equal(crop_quad(img, exact), crop_quad(img, rounded))
    nudged = rounded + 0.3  # a third of a pixel off: another crop before rounding
    np.testing.assert_array_equal(crop_quad(img, nudged), crop_quad(img, rounded))
    assert not np.array_equal(crop_quad(img, rounded + 1.0), crop_quad(img, rounded))


def test_a_batch_is_as_wide_as_its_widest_crop_and_never_under_320() -> None:
    assert batch_width([2.0, 3.0]) == 320
    assert batch_width([2.0, 10.0]) == 480
    # ... and never over a TensorRT profile's widest: a wider crop is squeezed into it
    assert batch_width([2.0, 80.0], max_width=2560) == 2560
    assert batch_width([2.0, 10.0], max_width=2560) == 480


def test_resize_keeps_the_aspect_ratio_and_pads_with_zero() -> None:
    crop = np.full((24, 48, 3), 255, np.uint8)  # ratio 2: 96 wide at height 48
    out = np.full((3, 48, 320), 7.0, np.float32)
    resize_into(crop, out)
    assert np.allclose(out[:, :, :96], 1.0)  # white is (255/255 - 0.5) / 0.5
    assert np.all(out[:, :, 96:] == 0.0)


def test_batches_group_crops_of_similar_width_and_keep_their_indices() -> None:
    crops = [np.zeros((48, w, 3), np.uint8) for w in (900, 100, 500, 120)]
    batches = recogniser_batches(crops, batch=2)
    assert [idx for idx, _ in batches] == [[1, 3], [2, 0]]
    assert batches[0][1].shape == (2, 3, 48, 320)
    assert batches[1][1].shape == (2, 3, 48, 900)


def dets(*boxes: tuple[float, float, float, float, float]) -> np.ndarray:
    return np.array([[*b, 0.0] for b in boxes], np.float32)


def reply(
    s: SessionReading, plan_texts: list[ReadText | None], frame: np.ndarray, t: float
) -> list[int]:
    """What the connection does when the frame's reply goes out, in frame order."""
    ids = s.tracker.update(frame, t).tolist()
    s.settle(ids, frame, plan_texts)
    return ids


def test_a_label_read_once_is_carried_while_its_box_keeps_its_size() -> None:
    s = SessionReading(Tracker(), max_boxes=8, reread_size_change=0.15)
    first = dets((100, 100, 200, 130, 0.9))
    plan = s.plan(first, 0.0)
    assert plan.to_read == [0] and plan.texts == [None]
    s.store(plan, first, [ReadText("LOT 7", 0.98)])
    (track,) = reply(s, plan.texts, first, 0.0)
    # Moved by 10 px, same size: carried, not read again, on the session's track.
    moved = dets((110, 102, 210, 132, 0.9))
    again = s.plan(moved, 0.1)
    assert again.to_read == [] and again.tracks == [track]
    assert again.texts == [ReadText("LOT 7", 0.98)]
    assert reply(s, again.texts, moved, 0.1) == [track]
    # Grown by 30 % (came closer, or the text got longer): read again, shown as before
    # until then.
    grown = dets((110, 100, 240, 139, 0.9))
    changed = s.plan(grown, 0.2)
    assert changed.to_read == [0]
    assert changed.texts == [ReadText("LOT 7", 0.98)]


def test_text_read_for_a_new_box_stays_on_the_id_its_reply_gave_it() -> None:
    # Frame 1's box is read before any reply gave it a track; frame 2 (planned while
    # frame 1 was on its way) reads it again; once frame 1's reply gave it its id, frame 3
    # carries the text on that id and reads nothing.
    s = SessionReading(Tracker())
    box = dets((100, 100, 200, 130, 0.9))
    one = s.plan(box, 0.0)
    assert one.tracks == [0]  # a new track: the reply gives it its id
    s.store(one, box, [ReadText("K4", 0.9)])
    two = s.plan(box, 0.05)
    assert two.to_read == [0]
    (track,) = reply(s, one.texts, box, 0.0)
    three = s.plan(box, 0.1)
    assert three.to_read == [] and three.tracks == [track]
    assert three.texts == [ReadText("K4", 0.9)]


def test_what_a_forgotten_track_said_is_forgotten_with_it() -> None:
    s = SessionReading(Tracker())
    box = dets((100, 100, 200, 130, 0.9))
    plan = s.plan(box, 0.0)
    s.store(plan, box, [ReadText("K4", 0.9)])
    (first,) = reply(s, plan.texts, box, 0.0)
    empty = dets()
    for i in range(1, 6):  # gone for 5 frames over 2.5 s: past the tracker's keep time
        reply(s, [], empty, i * 0.5)
    back = s.plan(box, 3.0)
    assert back.tracks == [0] and back.texts == [None] and back.to_read == [0]
    assert reply(s, back.texts, box, 3.0)[0] > first  # a new id, never the old one


def test_a_select_filter_limits_what_is_read() -> None:
    s = SessionReading(Tracker())
    s.select = lambda d, w, h: [float(x1) < w / 2 for x1 in d[:, 0]]  # the left half
    frame = dets((10, 10, 90, 40, 0.9), (700, 10, 790, 40, 0.95))
    assert s.plan(frame, 0.0, 800, 600).to_read == [0]


def test_at_most_max_boxes_are_read_per_frame_unknown_and_best_first() -> None:
    s = SessionReading(Tracker(), max_boxes=2)
    frame = dets(
        (0, 0, 50, 20, 0.6), (0, 100, 50, 120, 0.95), (0, 200, 50, 220, 0.8), (0, 300, 50, 320, 0.7)
    )
    plan = s.plan(frame, 0.0)
    assert plan.to_read == [1, 2]
    s.store(plan, frame, [ReadText("b", 1.0), ReadText("c", 1.0)])
    reply(s, plan.texts, frame, 0.0)
    # The next frame reads the two left over.
    nxt = s.plan(frame, 0.05)
    assert sorted(nxt.to_read) == [0, 3]
    assert nxt.texts[1] == ReadText("b", 1.0)


def test_the_read_slot_is_one_read_at_a_time() -> None:
    s = SessionReading(Tracker())
    s.begin()
    assert s.busy
    with pytest.raises(RuntimeError):
        s.begin()
    s.end()
    assert not s.busy
