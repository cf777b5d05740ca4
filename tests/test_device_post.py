"""DBNet's byte map (post.DB_MAP_BYTES), which the torch engine makes on the GPU inside its
captured graph (engine.torch.device_post): here its torch function runs on the CPU build
of torch, on the real model's maps of real photos, and the DB head must find the same
boxes in it as in the float map the host path decodes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest

from edge_vision.bench.sizes import TEXT_PHOTOS, our_input, photo_frame
from edge_vision.models import ModelSpec
from edge_vision.post import DbnetHead, db_map_bytes, db_map_levels
from edge_vision.shape import Letterbox

torch = pytest.importorskip(
    "torch", reason="torch is not installed here; the byte map is made by a torch function"
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
