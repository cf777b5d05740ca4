"""Reading the text in the boxes (edge_vision.frames.read) with the real recogniser.

* generated labels with known strings (serials, lot codes, mixed case, digits) read
  through the real server with ``read: true``;
* a label read once is carried on its track, not read again every frame;
* latest-wins with reading on: a newer frame's boxes are not held back by more than the
  one read in progress (a test wrapper adds a fixed delay around the real recogniser);
* real photos (the scikit-image wheel's) against the reference pipeline
  (``rapidocr.RapidOCR``, the same wheel's recogniser behind PP-OCR's own steps);
* the torch converter runs the recogniser like ONNX Runtime (CPU torch build here).
"""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import cv2
import numpy as np
import orjson
import pytest

from edge_vision.common.agreement import match_detections, pairwise_iou
from edge_vision.engines.recognisers import OnnxRuntimeRecogniser, Recogniser, TorchRecogniser
from edge_vision.errors import ModelError
from edge_vision.frames.read import TextReader, recogniser_batches
from edge_vision.model.heads import DbnetHead
from edge_vision.model.spec import ModelSpec, default_recogniser_path
from edge_vision.serve.server import CONNECTIONS, PIPELINE
from tests.support.reference import TEXT_PHOTOS, our_input, photo_frame

from ..support.assertions import iou
from ..support.clients import connect, frame_binary, recv_type
from ..support.images import Scene, text_scene
from ..support.server import RunningServer
from ..support.timing import T
from .test_asyncapi import assert_valid_server_message

pytestmark = pytest.mark.timeout(240)

# Strings a label on a line would carry: serials, lot codes, mixed case, digits.
LABELS = [
    ["SN 4711-AB93", "LOT K2O44X7", "Batch 2026/12/01", "0123456789"],
    ["EXP 12-2027", "MiXeD CaSe qz", "REF 88-4410-C", "Qty: 250 pcs"],
    ["S/N 9Y3F-07T2", "lot 5521b", "Part No. 7731", "20261201-0815"],
    ["IMEI 356938035643809", "Model XR-550", "Rev B4", "v2.14.8"],
    ["LOT 0042-ZK", "Made in EU", "MFG 2026-11", "Code 3141592"],
    ["PN: 44-0017", "Serial 00A9F3", "CAT-6 UTP", "Tel 0171 234567"],
]


def scene_for(texts: list[str], seed: int) -> Scene:
    places = [(90, 90), (700, 90), (90, 420), (700, 420)]
    return text_scene(1280, 720, list(zip(texts, places, strict=True)), font_size=38, seed=seed)


def edit_distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def read_where_drawn(result: dict[str, Any], scene: Scene) -> list[str | None]:
    """The text of the detection over each drawn string (None: no detection there)."""
    out: list[str | None] = []
    for box in scene.text_boxes:
        hits = sorted(result["detections"], key=lambda d: -iou(d["box"], box))
        out.append(hits[0]["text"] if hits and iou(hits[0]["box"], box) >= 0.3 else None)
    return out


async def turn_reading_on(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    await ws.send_json({"type": "settings", "read": True})
    return await recv_type(ws, "settings", timeout=60)


async def test_generated_labels_are_read_through_the_server(server: RunningServer) -> None:
    expected: list[str] = []
    got: list[str] = []
    read_ms: list[float] = []
    boxes = 0
    async with aiohttp.ClientSession() as s:
        for i, texts in enumerate(LABELS):
            # A connection per scene: the same places on one connection would carry the
            # previous scene's text on the tracks, as a label that did not change.
            ws, hello = await connect(s, server.ws_url)
            assert "read" in hello["features"] and hello["settings"]["read"] is False
            ack = await turn_reading_on(ws)
            assert ack["read"] is True
            scene = scene_for(texts, seed=i)
            await ws.send_bytes(frame_binary(i, None, scene.jpeg(92)))
            res = await recv_type(ws, "result", timeout=60)
            await ws.close()
            assert "read_ms" in res["timing"]
            read_ms.append(res["timing"]["read_ms"])
            boxes += len(res["detections"])
            for d in res["detections"]:
                assert isinstance(d["text"], str) and 0.0 <= d["text_score"] <= 1.0
            expected += texts
            got += [t or "" for t in read_where_drawn(res, scene)]
    errors = sum(edit_distance(g, e) for g, e in zip(got, expected, strict=True))
    accuracy = 1 - errors / sum(len(e) for e in expected)
    exact = sum(g == e for g, e in zip(got, expected, strict=True)) / len(expected)
    wrong = [(g, e) for g, e in zip(got, expected, strict=True) if g != e]
    print(
        f"\nread {len(expected)} strings: character accuracy {accuracy:.4f}, exact {exact:.3f}; "
        f"read_ms per frame {np.mean(read_ms):.0f} for {boxes / len(LABELS):.1f} boxes "
        f"({sum(read_ms) / boxes:.0f} ms a box); wrong: {wrong}"
    )
    assert accuracy >= 0.95, wrong
    assert exact >= 0.90, wrong


async def test_reading_is_off_by_default_and_a_label_read_once_is_carried(
    server: RunningServer,
) -> None:
    scene = scene_for(LABELS[0], seed=3)
    async with aiohttp.ClientSession() as s:
        ws, _ = await connect(s, server.ws_url)
        await ws.send_bytes(frame_binary(0, None, scene.jpeg(92)))
        off = await recv_type(ws, "result", timeout=60)
        ack = await turn_reading_on(ws)
        results = []
        for i in range(1, 4):
            await ws.send_bytes(frame_binary(i, None, scene.jpeg(92)))
            results.append(await recv_type(ws, "result", timeout=60))
        await ws.close()
        async with s.get(server.url + "/metrics") as resp:
            metrics = await resp.text()
    reads = [ln for ln in metrics.splitlines() if 'stage_seconds_count{stage="read"}' in ln]
    assert reads and float(reads[0].split()[-1]) == 3, reads  # /metrics has the read stage
    assert ack["read"] is True
    for message in (off, *results):  # docs/asyncapi.yaml describes the new fields
        assert_valid_server_message(message)
    assert off["detections"] and all("text" not in d for d in off["detections"])
    assert "read_ms" not in off["timing"]
    first, *later = results
    assert read_where_drawn(first, scene) == LABELS[0]
    for res in later:  # the same labels, the same boxes: carried, nothing read again
        assert read_where_drawn(res, scene) == LABELS[0]
        assert res["timing"]["read_ms"] < first["timing"]["read_ms"] / 4, (first, res)


class DelayedRecogniser:
    """The real recogniser with a fixed delay before every run (test wrapper)."""

    def __init__(self, inner: Recogniser, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.kind = inner.kind
        self.metadata = inner.metadata
        self.max_width = inner.max_width
        self.runs = 0

    def run(self, x: Any) -> Any:
        self.runs += 1
        time.sleep(self.delay_s)  # runs in the read worker, never on the loop
        return self.inner.run(x)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


async def test_latest_wins_a_newer_frame_waits_at_most_one_read(server: RunningServer) -> None:
    delay = T(3.0)
    scene_a = scene_for(LABELS[1], seed=5)
    # B: other labels at other places, so its boxes would need reading of their own.
    scene_b = text_scene(1280, 720, [("LOT 0042-ZK", (300, 250))], font_size=44, seed=6)
    async with aiohttp.ClientSession() as s:
        ws, hello = await connect(s, server.ws_url)
        await turn_reading_on(ws)
        reader = await server.app[PIPELINE].reading.reader()
        real = reader.recogniser
        slow = DelayedRecogniser(real, delay)
        reader.recogniser = slow
        try:
            conn = server.app[CONNECTIONS][hello["session_id"]]
            await ws.send_bytes(frame_binary("a", None, scene_a.jpeg(92)))
            deadline = time.monotonic() + T(30)
            while not conn.reading.busy:  # A's boxes are being read now
                assert time.monotonic() < deadline, "frame a was never read"
                await asyncio.sleep(0.01)
            sent_b = time.monotonic()
            await ws.send_bytes(frame_binary("b", None, scene_b.jpeg(92)))
            res_a = await recv_type(ws, "result", timeout=60)
            res_b = await recv_type(ws, "result", timeout=60)
            b_latency = time.monotonic() - sent_b
            # Once the read is over, a frame showing B again is read.
            await ws.send_bytes(frame_binary("c", None, scene_b.jpeg(92)))
            res_c = await recv_type(ws, "result", timeout=60)
        finally:
            reader.recogniser = real
        await ws.close()
    assert res_a["id"] == "a" and res_b["id"] == "b"
    assert read_where_drawn(res_a, scene_a) == LABELS[1]
    # B waited for the end of A's read at most (one read), not for a read of its own:
    # its new box came back unread, and it was answered well within two reads.
    assert read_where_drawn(res_b, scene_b) == [None]
    assert b_latency < delay + T(1.5), (b_latency, res_b["timing"])
    assert res_b["timing"]["read_ms"] < delay * 1000 / 10  # ms: no read of its own
    assert read_where_drawn(res_c, scene_b) == ["LOT 0042-ZK"]
    assert slow.runs == 2  # A's boxes, then C's: B was never read


async def test_every_mode_reads_each_frame_in_turn(server: RunningServer) -> None:
    """In every mode a frame that finds a read in progress waits for it and is read."""
    scene_a = scene_for(LABELS[3], seed=9)
    scene_b = text_scene(1280, 720, [("LOT 0042-ZK", (300, 250))], font_size=44, seed=6)
    async with aiohttp.ClientSession() as s:
        ws, hello = await connect(s, server.ws_url + "?mode=every")
        await turn_reading_on(ws)
        reader = await server.app[PIPELINE].reading.reader()
        real = reader.recogniser
        slow = DelayedRecogniser(real, T(1.0))
        reader.recogniser = slow
        try:
            conn = server.app[CONNECTIONS][hello["session_id"]]
            await ws.send_bytes(frame_binary("a", None, scene_a.jpeg(92)))
            deadline = time.monotonic() + T(30)
            while not conn.reading.busy:
                assert time.monotonic() < deadline, "frame a was never read"
                await asyncio.sleep(0.01)
            await ws.send_bytes(frame_binary("b", None, scene_b.jpeg(92)))
            res_a = await recv_type(ws, "result", timeout=60)
            res_b = await recv_type(ws, "result", timeout=60)
        finally:
            reader.recogniser = real
        await ws.close()
    assert read_where_drawn(res_a, scene_a) == LABELS[3]
    assert read_where_drawn(res_b, scene_b) == ["LOT 0042-ZK"]
    assert slow.runs == 2


class FailingRecogniser(DelayedRecogniser):
    def run(self, x: Any) -> Any:
        raise ModelError("recogniser broke (test)")


async def test_a_failed_read_still_sends_the_boxes_unread(server: RunningServer) -> None:
    scene = scene_for(LABELS[2], seed=8)
    async with aiohttp.ClientSession() as s:
        ws, _ = await connect(s, server.ws_url)
        await turn_reading_on(ws)
        stage = server.app[PIPELINE].reading
        reader = await stage.reader()
        real = reader.recogniser
        reader.recogniser = FailingRecogniser(real, 0.0)
        try:
            await ws.send_bytes(frame_binary(1, None, scene.jpeg(92)))
            res = await recv_type(ws, "result", timeout=60)
        finally:
            reader.recogniser = real
        await ws.close()
    assert len(res["detections"]) >= 4
    assert read_where_drawn(res, scene) == [None] * 4
    assert stage.failures == 1


async def test_read_refused_where_the_server_turns_it_off(server_factory: Any) -> None:
    srv = await server_factory({"read": {"enabled": False}})
    async with aiohttp.ClientSession() as s:
        ws, hello = await connect(s, srv.ws_url)
        assert "read" not in hello["features"]
        await ws.send_json({"type": "settings", "read": True})
        err = await recv_type(ws, "error")
        await ws.close()
    assert err["code"] == "bad_settings" and "read" in err["message"]


# -- real photos against the reference pipeline -------------------------------------------


@pytest.fixture(scope="module")
def reader() -> TextReader:
    return TextReader(OnnxRuntimeRecogniser(default_recogniser_path(), threads=2))


#: The reference pipeline doing what ours does: its detector at our long side (1280, each
#: side to the nearest multiple of 32, as our default stretch) so both detectors see the
#: same input (as tests/integration/test_fidelity.py compares them), and without its text-direction
#: classifier, a stage ours does not have (it turns some crops over before reading).
REFERENCE_PARAMS = {
    "Global.log_level": "warning",
    "Global.use_cls": False,
    "Det.limit_type": "max",
    "Det.limit_side_len": 1280,
}


@pytest.fixture(scope="module")
def reference_read() -> Iterator[list[tuple[np.ndarray, Any]]]:
    """Each photo frame and what the reference pipeline found and read in it (once)."""
    from rapidocr import RapidOCR

    ocr = RapidOCR(params=REFERENCE_PARAMS)
    yield [(img, out) for img in photo_frames() if (out := ocr(img)).boxes is not None]


def photo_frames() -> list[np.ndarray]:
    """The text photos as 1280×720 camera frames, and those with text whole at their own
    aspect ratio, 1280 on the long side (BGR)."""
    frames = [photo_frame(name, 1280, 720) for name in TEXT_PHOTOS]
    for name in ("page.png", "motorcycle_left.png", "motorcycle_right.png", "astronaut.png"):
        img = cv2.imread(str(importlib.resources.files("skimage") / "data" / name))
        h, w = img.shape[:2]
        scale = 1280 / max(h, w)
        size = (round(w * scale), round(h * scale))
        frames.append(cv2.resize(img, size, interpolation=cv2.INTER_CUBIC))
    return frames


def test_on_the_reference_boxes_we_read_the_reference_strings(
    reader: TextReader, reference_read: list[tuple[np.ndarray, Any]]
) -> None:
    """Same boxes in, same strings out: crop, straighten, resize, batch and CTC-decode
    as the reference does (our own code)."""
    same = total = 0
    wrong = []
    for img, ref in reference_read:
        ours = reader.read(img, list(ref.boxes))
        for o, t in zip(ours, ref.txts, strict=True):
            total += 1
            same += o.text == t
            if o.text != t:
                wrong.append((o.text, t))
    print(f"\nreference boxes: {same}/{total} strings equal; differ: {wrong}")
    assert total >= 10
    assert same / total >= 0.95, wrong


def test_end_to_end_strings_against_the_reference_on_real_photos(
    spec: ModelSpec, reader: TextReader, reference_read: list[tuple[np.ndarray, Any]]
) -> None:
    """Our boxes and our reading against the reference's boxes and strings, matched by
    IoU >= 0.5 (edge_vision.common.agreement), both detectors at the same input (ours at 1280
    with the default fit, a stretch: 1280x704 for 16:9; REFERENCE_PARAMS).

    Measured 28/28 on 2026-12-01 (the issue asks 90 %). Two causes of the earlier 25/28,
    both on the blurred YAMAHA lettering of the motorcycle photos, which the recogniser
    reads differently from boxes a pixel apart (docs/reading.md): the crop's corners were
    not whole pixels as the reference's are (crop_quad rounds them), and the DB head's
    unclip gave rotated rectangles up to a pixel off the reference's, which grows them with
    Clipper's integer round-join offset (post._unclip now computes the same points).
    (With the reference at its own defaults, 1312x736 and its direction classifier:
    23/26.)"""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    det = ort.InferenceSession(str(spec.path), opts, providers=["CPUExecutionProvider"])
    same = total = 0
    wrong = []
    for img, ref in reference_read:
        ref_dets = np.zeros((len(ref.boxes), 6), np.float32)
        ref_dets[:, :4] = [[*b.min(axis=0), *b.max(axis=0)] for b in ref.boxes]
        ref_dets[:, 4] = ref.scores
        x, lb = our_input(spec, img, 1280)
        dets, quads = DbnetHead().decode_quads([det.run(None, {"x": x})[0][0]], lb, 0.5)
        ours = reader.read(img, list(quads))
        agreement = match_detections(ref_dets, dets)
        ious = pairwise_iou(dets, ref_dets)
        taken: set[int] = set()
        for i in np.argsort(-dets[:, 4], kind="stable"):  # the greedy matching agreement uses
            row = np.where([j in taken for j in range(len(ref_dets))], -1.0, ious[i])
            j = int(np.argmax(row))
            if row[j] >= 0.5:
                taken.add(j)
                total += 1
                same += ours[i].text == ref.txts[j]
                if ours[i].text != ref.txts[j]:
                    wrong.append((ours[i].text, ref.txts[j]))
        assert len(taken) == agreement.matched
    print(f"\nend to end: {same}/{total} matched boxes read alike; differ: {wrong}")
    assert total >= 15
    assert same / total >= 0.9, wrong


# -- the torch converter -------------------------------------------------------------------


def test_torch_converter_runs_the_recogniser_as_onnx_runtime_does(reader: TextReader) -> None:
    """AveragePool and BatchNormalization (the recogniser's) in the torch engine's
    converter, on the CPU build of torch here; the GPU run is docs/reading.md's command."""
    torch_rec = TorchRecogniser(default_recogniser_path(), device="cpu", fp16=False)
    crops = [photo_frame("page.png", 640, 360)[40:90, 20:420], np.full((40, 200, 3), 255, np.uint8)]
    x = recogniser_batches(crops, 6)[0][1]
    import torch

    with torch.inference_mode():
        got = torch_rec.module(torch.from_numpy(x))[0].numpy()
    rec = reader.recogniser
    assert isinstance(rec, OnnxRuntimeRecogniser)
    want = rec.session.run(None, {rec.input_name: x})[0]
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert rel < 1e-4, rel
    via_torch = TextReader(torch_rec).read_crops(crops)
    assert [r.text for r in via_torch] == [r.text for r in reader.read_crops(crops)]


MEASURE_ARGS = ["--engine", "torch", "--device", "cpu", "--boxes", "2", "--repeats", "1"]
MEASURE_ARGS += ["--compare", "--threads", "2"]


def test_the_measurement_command_runs_and_compares_torch_with_onnx_runtime() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.read", *MEASURE_ARGS],
        capture_output=True,
        text=True,
        timeout=T(180),
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["recogniser"]["kind"] == "torch"
    assert report["rel_error"] < 1e-4
    assert report["same_text"] == 2
    assert report["ms_per_box"] > 0


def test_cv2_is_the_one_resampler() -> None:
    """Crops are resized with OpenCV's bilinear resize, as the reference: a 2× crop of a
    known image resizes to exactly what cv2.resize gives."""
    img = (np.arange(24 * 96 * 3) % 251).astype(np.uint8).reshape(24, 96, 3)
    x = recogniser_batches([img], 1)[0][1][0]
    want = cv2.resize(img, (192, 48)).astype(np.float32).transpose(2, 0, 1) / 127.5 - 1.0
    assert np.allclose(x[:, :, :192], want, atol=1e-5)


# -- replay and the annotated video ---------------------------------------------------------


def test_replay_with_read_writes_the_text_to_the_jsonl_and_the_video(tmp_path: Path) -> None:
    from edge_vision.tools import replay

    from ..support.video import read_video, write_text_clip

    clip = write_text_clip(tmp_path / "clip.mp4", frames=10, text="LOT 0042-ZK")
    jsonl, video = tmp_path / "run.jsonl", tmp_path / "run.mp4"
    argv = [str(clip.path), "--every-frame", "--read", "--jsonl", str(jsonl)]
    code = replay.main([*argv, "--out", str(video), "--no-progress"])
    assert code == 0
    lines = [orjson.loads(line) for line in jsonl.read_bytes().splitlines()]
    assert len(lines) == clip.frames
    read = []
    for line, box in zip(lines, clip.boxes, strict=True):
        hits = [d for d in line["detections"] if iou(d["box"], box) >= 0.3]
        read.append(hits[0]["text"] if hits else None)
        assert "read_ms" in line["timing"]
    assert read.count("LOT 0042-ZK") >= 0.9 * clip.frames, read
    frames, _ = read_video(video)
    assert len(frames) == clip.frames


def test_the_annotated_frame_labels_a_box_with_its_text() -> None:
    from edge_vision.tools.annotate import draw_detections

    det = {"box": [40, 60, 300, 100], "score": 0.9, "class": 0, "label": "text"}
    plain = np.zeros((200, 400, 3), np.uint8)
    with_text = plain.copy()
    draw_detections(plain, [det])
    draw_detections(with_text, [{**det, "text": "LOT 0042-ZK 99x"}])
    label_row = slice(30, 60)  # the label sits just above the box
    lit_plain = int((plain[label_row] > 0).any(axis=2).sum())
    lit_text = int((with_text[label_row] > 0).any(axis=2).sum())
    assert lit_text > lit_plain * 1.5  # a longer label: the text, not "text 0.90"
