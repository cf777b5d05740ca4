"""What the torch engine makes on the GPU inside its captured graph
(engine.torch.device_post), with its torch functions run here on the CPU build of torch:

* DBNet's byte map (post.DB_MAP_BYTES), on the real model's maps of real photos: the DB
  head must find the same boxes in it as in the float map the host path decodes;
* a YOLO v8/v11 output NMS'd on the device (post.yolo_v8_device_nms), on synthetic
  outputs (no YOLO weights exist on this machine): the v8 head must find the same
  detections in it as in the whole output, settled on the device or not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from benchmarks.yolo_post import yolo_v8_output
from edge_vision.errors import ModelError
from edge_vision.model.device_post import (
    NMS_KEPT,
    NMS_UNDECIDED,
    db_map_bytes,
    db_map_levels,
    yolo_v8_device_nms,
)
from edge_vision.model.heads import DbnetHead, YoloV8Head, nms, pick_head_name
from edge_vision.model.shape import Letterbox
from edge_vision.model.spec import ModelSpec
from tests.support.reference import TEXT_PHOTOS, our_input, photo_frame

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed here; the byte map and the YOLO cut are torch functions",
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def maps(spec: ModelSpec) -> Iterator[list[tuple[np.ndarray, Letterbox]]]:
    """The model's float probability map and letterbox of each text photo (1280×720)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    session = ort.InferenceSession(str(spec.path), opts, providers=["CPUExecutionProvider"])
    out = []
    for name in TEXT_PHOTOS:
        x, lb = our_input(spec, photo_frame(name, 1280, 720), 640)
        out.append((session.run(None, {spec.input_name: x})[0], lb))
    yield out


@pytest.mark.parametrize("threshold", [0.3, 0.5])
def test_the_byte_map_s_top_bit_is_the_host_threshold_and_the_rest_the_probability(
    maps: list[tuple[np.ndarray, Letterbox]], threshold: float
) -> None:
    levels = db_map_levels(threshold)
    for prob, _ in maps:
        byte_map = db_map_bytes(torch, torch.from_numpy(prob), threshold).numpy()
        assert byte_map.dtype == np.uint8 and byte_map.shape == prob.shape
        np.testing.assert_array_equal(byte_map >= 128, prob > threshold)
        err = np.abs(levels[byte_map] - prob)
        assert err.max() <= (1 - threshold) / 254 + 1e-6, err.max()


def test_the_db_head_finds_the_same_boxes_in_the_byte_map_as_in_the_float_map(
    maps: list[tuple[np.ndarray, Letterbox]],
) -> None:
    head = DbnetHead()
    boxes = 0
    for prob, lb in maps:
        want, want_quads = head.decode_quads([prob[0]], lb, 0.5)
        byte_map = db_map_bytes(torch, torch.from_numpy(prob), head.bin_threshold).numpy()
        got, got_quads = head.decode_quads([byte_map[0]], lb, 0.5)
        assert len(got) == len(want)
        np.testing.assert_array_equal(got[:, [0, 1, 2, 3, 5]], want[:, [0, 1, 2, 3, 5]])
        np.testing.assert_array_equal(got_quads, want_quads)
        np.testing.assert_allclose(got[:, 4], want[:, 4], atol=0.003)
        boxes += len(want)
    assert boxes >= 10  # the photos hold text: the comparison covered real boxes


def _sorted(dets: np.ndarray) -> np.ndarray:
    return dets[np.lexsort(dets.T[::-1])]


def test_yolo_nmsd_on_the_device_gives_the_host_head_s_detections_synthetic_yolo_v8() -> None:
    """post.yolo_v8_device_nms, which the torch engine runs on the GPU inside its graph
    (engine.torch.device_post): 1,024 of 8,400 anchors come back with 28 bytes each
    instead of 336, their NMS settled on the device, and the v8 head reads from them
    exactly the detections it finds in the whole output, at any confidence."""
    rng = np.random.default_rng(11)
    raw = yolo_v8_output(rng, objects=40)
    dets, state = (o.numpy() for o in yolo_v8_device_nms(torch, torch.from_numpy(raw), 1024, 0.45))
    assert dets.shape == (2, 1024, 6) and state.shape == (2, 1024) and state.dtype == np.uint8
    assert dets.nbytes + state.nbytes == 2 * 1024 * 25  # 1,024 candidates × (6 floats + 1 byte)
    assert pick_head_name([dets.shape, state.shape]) == "yolo_v8"  # the head chosen from it
    assert not (state == NMS_UNDECIDED).any()  # settled on the device: no NMS on the host
    head = YoloV8Head()
    lb = Letterbox(640, 640, 640, 640, 640, 640, 0, 0)
    found = 0
    for b in range(len(raw)):
        for confidence in (0.25, 0.5):
            want = head.decode([raw[b]], lb, confidence)
            got = head.decode([dets[b], state[b]], lb, confidence)
            np.testing.assert_array_equal(got[:, 4], want[:, 4])  # best first, as the host
            np.testing.assert_allclose(_sorted(got), _sorted(want), atol=1e-4)
            found += len(want)
    assert found >= 100  # real detections were compared, not two empty lists


def test_a_chain_the_device_rounds_do_not_settle_is_nmsd_on_the_host() -> None:
    """Boxes in a row, each overlapping the next: greedy NMS keeps every other one, and
    each box's fate hangs on the one before, so 8 rounds cannot settle a chain of 30. The
    frame comes back undecided and the host's NMS gives greedy's answer; with rounds
    enough, the device gives the same answer itself."""
    n = 30
    raw = np.zeros((1, 5, 40), np.float32)  # one class; 10 empty anchors
    raw[0, 0, :n] = 100 + 10 * np.arange(n)  # cx: 10 px apart, 20 px wide: IoU 1/3
    raw[0, 1, :n], raw[0, 2, :n], raw[0, 3, :n] = 50, 20, 20
    raw[0, 4, :n] = np.linspace(0.9, 0.6, n)  # scores fall along the row
    x = torch.from_numpy(raw)
    head = YoloV8Head(nms_iou=0.3)
    lb = Letterbox(640, 640, 640, 640, 640, 640, 0, 0)
    want = head.decode([raw[0]], lb, 0.5)
    assert len(want) == len(np.arange(n)[raw[0, 4, :n] >= 0.5][::2])  # every other box
    dets, state = (o.numpy() for o in yolo_v8_device_nms(torch, x, 1024, 0.3, rounds=8))
    assert (state == NMS_UNDECIDED).all()
    np.testing.assert_array_equal(head.decode([dets[0], state[0]], lb, 0.5), want)
    dets, state = (o.numpy() for o in yolo_v8_device_nms(torch, x, 1024, 0.3, rounds=n + 1))
    assert not (state == NMS_UNDECIDED).any() and (state[0, :n:2] == NMS_KEPT).all()
    np.testing.assert_array_equal(head.decode([dets[0], state[0]], lb, 0.5), want)


def test_yolo_candidates_nmsd_on_the_device_are_the_best_scoring_synthetic_yolo_v8() -> None:
    """With more anchors above the threshold than come back, the ones kept are the
    highest-scoring, highest first: every anchor left out scores at most what the last
    one kept does; and an output with fewer anchors than asked for comes back whole."""
    rng = np.random.default_rng(12)
    raw = yolo_v8_output(rng, objects=300, batch=1)  # about 2,000 strong anchors
    dets, _ = yolo_v8_device_nms(torch, torch.from_numpy(raw), 1024, 0.45)
    everything = np.sort(raw[0, 4:].max(axis=0))[::-1]
    np.testing.assert_array_equal(dets[0, :, 4].numpy(), everything[:1024])
    small = torch.from_numpy(raw[:, :, :900])
    assert yolo_v8_device_nms(torch, small, 1024, 0.45)[0].shape == (1, 900, 6)


def test_class_aware_nms_never_lets_one_class_suppress_another() -> None:
    """The host's NMS (which decodes frames the device left undecided) masks by class as
    the device does: two same-place boxes of two classes both stay."""
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [1, 1, 10, 10]], np.float32)
    scores = np.array([0.9, 0.8, 0.7], np.float32)
    assert nms(boxes, scores, 0.5).tolist() == [0]
    assert nms(boxes, scores, 0.5, np.array([0, 1, 0], np.float32)).tolist() == [0, 1]


def test_the_yolo_post_bench_reads_the_same_detections_from_every_form(tmp_path: Path) -> None:
    """``python -m benchmarks.yolo_post``: the host's v8 head on the whole output,
    on its best 1,024 anchors and on the device NMS's candidates finds the same detections
    when fewer anchors than that reach the threshold, and says how many bytes each form
    brings back (the device form ~110x fewer than the whole output)."""
    from benchmarks.yolo_post import main

    out = tmp_path / "yolo.json"
    assert main(["--objects", "20", "--frames", "3", "--rounds", "1", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["objects"]["20"]
    assert row["same_detections"] == {"top": True, "device": True}
    assert row["detections_per_frame"] >= 10 and row["device_undecided_frames"] == 0
    assert row["raw"]["bytes_back"] == 84 * 8400 * 4 and row["device"]["bytes_back"] == 1024 * 25
    assert all(row[f]["frames"] == 3 and row[f]["cpu_median_ms"] > 0 for f in ("raw", "device"))


def test_tied_fp16_scores_keep_the_box_the_host_keeps_synthetic_yolo_v8() -> None:
    """An FP16 engine's scores tie often (about 5e-4 apart near 1): of two tied,
    overlapping boxes of one class the device keeps the one the host keeps (the lower
    anchor, as a stable sort orders them), in every frame."""
    rng = np.random.default_rng(21)
    raw = yolo_v8_output(rng, objects=60, batch=40).astype(np.float16).astype(np.float32)
    dets, state = (o.numpy() for o in yolo_v8_device_nms(torch, torch.from_numpy(raw), 1024, 0.45))
    head = YoloV8Head()
    lb = Letterbox(640, 640, 640, 640, 640, 640, 0, 0)
    for b in range(len(raw)):
        want = head.decode([raw[b]], lb, 0.25)
        got = head.decode([dets[b], state[b]], lb, 0.25)
        np.testing.assert_array_equal(_sorted(got), _sorted(want), err_msg=f"frame {b}")


def test_the_device_nms_refuses_no_rounds_and_the_v8_head_two_foreign_outputs() -> None:
    """Zero rounds would mark every candidate settled and kept: refused. Two outputs that
    are not the device NMS's (a float second output) get a clear error, not boxes."""
    raw = torch.zeros((1, 84, 2000))
    with pytest.raises(ValueError, match="at least one round"):
        yolo_v8_device_nms(torch, raw, 1024, 0.45, rounds=0)
    lb = Letterbox(640, 640, 640, 640, 640, 640, 0, 0)
    foreign = [np.zeros((100, 6), np.float32), np.zeros(100, np.float32)]
    with pytest.raises(ModelError, match="not the device NMS"):
        YoloV8Head().decode(foreign, lb, 0.5)
