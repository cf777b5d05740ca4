"""What the torch engine makes on the GPU inside its captured graph
(engine.torch.device_post), with its torch functions run here on the CPU build of torch:

* DBNet's byte map (post.DB_MAP_BYTES), on the real model's maps of real photos: the DB
  head must find the same boxes in it as in the float map the host path decodes;
* a YOLO v8/v11 output cut to its best anchors (post.yolo_v8_top_anchors), on synthetic
  outputs (no YOLO weights exist on this machine): the v8 head must find the same
  detections in it as in the whole output.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest

from edge_vision.bench.sizes import TEXT_PHOTOS, our_input, photo_frame
from edge_vision.models import ModelSpec
from edge_vision.post import (
    DbnetHead,
    YoloV8Head,
    db_map_bytes,
    db_map_levels,
    pick_head_name,
    yolo_v8_top_anchors,
)
from edge_vision.shape import Letterbox

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


def _yolo_v8_output(rng: np.random.Generator, objects: int, batch: int = 2) -> np.ndarray:
    """A YOLO v8 raw output ``[B, 84, 8400]`` shaped as a trained model's looks: every
    anchor a faint guess (class scores under 0.05), and round each object a cluster of
    anchors whose boxes overlap it, scoring 0.3-0.95 in its class. Synthetic: no YOLO
    weights exist on this machine (none ship, and nothing is downloaded at run time)."""
    nc, anchors = 80, 8400
    out = np.zeros((batch, 4 + nc, anchors), np.float32)
    out[:, :2] = rng.uniform(0, 640, (batch, 2, anchors))
    out[:, 2:4] = rng.uniform(4, 60, (batch, 2, anchors))
    out[:, 4:] = rng.uniform(0, 0.05, (batch, nc, anchors))
    for b in range(batch):
        for _ in range(objects):
            cx, cy, w, h = rng.uniform(40, 600), rng.uniform(40, 600), *rng.uniform(20, 120, 2)
            cls = rng.integers(nc)
            for a in rng.choice(anchors, rng.integers(3, 12), replace=False):
                out[b, :4, a] = cx + rng.normal(0, 3), cy + rng.normal(0, 3), w, h
                out[b, 4 + cls, a] = rng.uniform(0.3, 0.95)
    return out


def test_yolo_best_anchors_give_the_host_head_the_same_detections_synthetic_yolo_v8() -> None:
    """post.yolo_v8_top_anchors, which the torch engine runs on the GPU inside its graph
    (engine.torch.device_post): 1,024 of 8,400 anchors come back, still in v8's layout, and
    the host's v8 head finds exactly the detections it finds in the whole output."""
    rng = np.random.default_rng(11)
    raw = _yolo_v8_output(rng, objects=40)
    top = yolo_v8_top_anchors(torch, torch.from_numpy(raw), 1024).numpy()
    assert top.shape == (2, 84, 1024)
    assert pick_head_name([top.shape]) == "yolo_v8"  # the head chosen from it is v8's
    head = YoloV8Head()
    lb = Letterbox(640, 640, 640, 640, 640, 640, 0, 0)
    found = 0
    for b in range(len(raw)):
        for confidence in (0.25, 0.5):
            want = head.decode([raw[b]], lb, confidence)
            got = head.decode([top[b]], lb, confidence)
            order = np.lexsort(want.T[::-1])
            np.testing.assert_array_equal(got[np.lexsort(got.T[::-1])], want[order])
            found += len(want)
    assert found >= 100  # real detections were compared, not two empty lists


def test_yolo_best_anchors_are_the_best_scoring_synthetic_yolo_v8() -> None:
    """With more anchors above the threshold than come back, the ones kept are the
    highest-scoring: every anchor left out scores at most what the last one kept does."""
    rng = np.random.default_rng(12)
    raw = _yolo_v8_output(rng, objects=300, batch=1)  # about 2,000 strong anchors
    top = yolo_v8_top_anchors(torch, torch.from_numpy(raw), 1024).numpy()
    kept = top[0, 4:].max(axis=0)
    everything = np.sort(raw[0, 4:].max(axis=0))[::-1]
    np.testing.assert_array_equal(kept, everything[:1024])  # highest first
    small = raw[:, :, :900]  # no more anchors than are asked for: returned as it is
    assert yolo_v8_top_anchors(torch, torch.from_numpy(small), 1024).shape == small.shape
