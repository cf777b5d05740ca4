"""The text recogniser's TensorRT plan (edge_vision.engines.tensorrt.recogniser), driven
by the MOCK ``tensorrt`` module and CUDA layer of tests/support/mock_tensorrt.py (neither
TensorRT nor a GPU can exist on this machine).

What this proves: the recogniser gets its own plan, built the same way as the
detector's (its profile, its key beside the detector's, ahead of serve by
``edge-vision build-engine --read``), reads the strings ONNX Runtime reads, squeezes a
crop wider than its profile into it, sends boxes unread when a run fails, and falls back
to ONNX Runtime with a log line when TensorRT is absent. What it cannot prove: that real
TensorRT behaves like the mock.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.read import _sample_crops
from edge_vision.cli import main
from edge_vision.config import Config
from edge_vision.engines.recognisers import OnnxRuntimeRecogniser, load_recogniser
from edge_vision.engines.tensorrt import recogniser as trt_recogniser
from edge_vision.frames.read import ReadStage, TextReader, recogniser_batches
from edge_vision.frames.track import Tracker
from edge_vision.model.spec import ModelSpec, default_recogniser_path

from ..support import mock_tensorrt
from ..support.mock_tensorrt import (
    MockState,
    listing,
    start_and_close,
)
from ..support.server import make_config

# The mock TensorRT fixture, bound here so that pytest finds it for this module's tests.
mock_trt = mock_tensorrt.mock_trt


# ---------------------------------------------------------------------------------------
# The recogniser's plan (edge_vision.engines.tensorrt.recogniser): the mock "plan" runs the
# recogniser with its arg-max appended on ONNX Runtime, so the strings read are real ones.


def reading_config(engine_dir: Path, **read: Any) -> Config:
    return make_config(
        {
            "engine": {"kind": "tensorrt", "tensorrt": {"engine_dir": str(engine_dir)}},
            "read": {"max_width": 960, **read},
        }
    )


@pytest.fixture(scope="module")
def cpu_reader() -> TextReader:
    return TextReader(OnnxRuntimeRecogniser(default_recogniser_path(), threads=2))


def test_mock_tensorrt_recogniser_builds_a_second_plan_and_reads_as_onnx_runtime_does(
    mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path, cpu_reader: TextReader
) -> None:
    state, _ = mock_trt
    cfg = reading_config(tmp_path)
    rec = load_recogniser(None, "tensorrt", config=cfg)
    try:
        assert isinstance(rec, trt_recogniser.TensorRTRecogniser)
        (build,) = state.builds
        # NCHW float32 crops: batches 1..6 (read.batch), height 48, widths 320..960.
        assert build["profile"] == ((1, 3, 48, 320), (6, 3, 48, 320), (6, 3, 48, 960))
        assert build["flags"] == ["FP16"]  # engine.tensorrt.precision fp16 (the default)
        assert rec.describe()["built_now"] is True and rec.max_width == 960
        crops = _sample_crops(np.random.default_rng(3), 8)
        got = TextReader(rec).read_crops(crops)
        want = cpu_reader.read_crops(crops)
        assert [g.text for g in got] == [w.text for w in want]
        assert got[0].text.startswith("LOT ")
        np.testing.assert_allclose([g.score for g in got], [w.score for w in want], atol=1e-5)
        # Only the arg-max and its probability come back: two [N, T] arrays.
        x = recogniser_batches(crops, 6)[0][1]
        idx, prob = rec.run(x)
        assert idx.shape == prob.shape == (6, x.shape[3] // 8) and idx.dtype == np.int64
    finally:
        rec.close()
    assert state.open_buffers == 0  # close() freed every device and pinned buffer
    files = listing(tmp_path)
    plans = [f for f in files if f.endswith(".plan")]
    assert len(plans) == 1 and plans[0].startswith("pp-ocrv6-rec-small-fp16-nvidia-mockgpu-")

    again = load_recogniser(None, "tensorrt", config=cfg)
    try:
        assert isinstance(again, trt_recogniser.TensorRTRecogniser)
        assert again.describe()["built_now"] is False and again.describe()["plan"] == plans[0]
    finally:
        again.close()
    assert len(state.builds) == 1  # found again by its key, not rebuilt


async def test_mock_tensorrt_recogniser_plan_lives_beside_the_detector_s_with_its_own_key(
    mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path, spec: ModelSpec
) -> None:
    state, _ = mock_trt
    await start_and_close(spec, tmp_path)  # the detector's plan
    cfg = reading_config(tmp_path)
    cfg.engine.tensorrt.precision = "fp32"
    rec = await asyncio.to_thread(load_recogniser, None, "tensorrt", config=cfg)
    rec_key = rec.plan.key if isinstance(rec, trt_recogniser.TensorRTRecogniser) else None
    if isinstance(rec, trt_recogniser.TensorRTRecogniser):
        rec.close()
    assert rec_key is not None and rec_key.precision == "fp32"
    assert state.builds[1]["flags"] == []  # an FP32 plan: no FP16 flag
    files = await asyncio.to_thread(listing, tmp_path)
    assert sum(f.endswith(".plan") for f in files) == 2
    assert sum(f.endswith(".json") for f in files) == 2
    # One timing cache for the GPU and TensorRT version, shared by both builds.
    assert [f for f in files if f.startswith("timing-")] == [
        "timing-nvidia-mockgpu-sm_90-trt10-3-0.cache"
    ]
    assert state.timing_caches_given[1].startswith(b"TC:")


def test_mock_tensorrt_recogniser_squeezes_a_crop_wider_than_its_profile(
    mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    rec = load_recogniser(None, "tensorrt", config=reading_config(tmp_path, max_width=640))
    try:
        line = np.full((20, 1200, 3), 230, np.uint8)  # 60:1, 2880 px wide at height 48
        (batch,) = recogniser_batches([line], 6, max_width=rec.max_width)
        assert batch[1].shape == (1, 3, 48, 640)
        (read,) = TextReader(rec).read_crops([line])  # runs inside the profile
        assert read.text == ""
        with pytest.raises(Exception, match="outside the TensorRT profile"):
            rec.run(np.zeros((1, 3, 48, 704), np.float32))
    finally:
        rec.close()


def test_mock_tensorrt_build_engine_read_builds_the_recogniser_plan_ahead_of_serve(
    mock_trt: tuple[MockState, types.ModuleType],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, _ = mock_trt
    argv = ["build-engine", "--read", "--engine-dir", str(tmp_path), "--set", "read.max_width=640"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert len(state.builds) == 2  # the detector's plan, then the recogniser's
    assert state.builds[1]["profile"] == ((1, 3, 48, 320), (6, 3, 48, 320), (6, 3, 48, 640))
    assert "recogniser built " in out and "pp-ocrv6-rec-small-fp16-" in out
    assert main(argv) == 0  # nothing changed: nothing built
    assert "recogniser up to date: " in capsys.readouterr().out and len(state.builds) == 2
    cfg = make_config(
        {
            "engine": {
                "kind": "tensorrt",
                "tensorrt": {"engine_dir": str(tmp_path), "build_if_missing": False},
            },
            "read": {"max_width": 640},
        }
    )
    rec = load_recogniser(None, "tensorrt", config=cfg)  # serve finds it, builds nothing
    try:
        assert isinstance(rec, trt_recogniser.TensorRTRecogniser)
        assert rec.describe()["built_now"] is False
    finally:
        rec.close()
    assert main([*argv, "--force"]) == 0 and len(state.builds) == 4


async def test_mock_tensorrt_read_stage_follows_engine_kind_and_a_failed_run_sends_boxes_unread(
    mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    stage = ReadStage(reading_config(tmp_path))
    assert stage.engine_kind == "tensorrt"  # read.engine: auto follows engine.kind
    try:
        reader = await stage.reader()
        assert reader.recogniser.kind == "tensorrt"
        image = np.full((120, 400, 3), 235, np.uint8)
        import cv2

        cv2.putText(image, "K4 77", (20, 80), cv2.FONT_HERSHEY_SIMPLEX, 1.6, (20, 20, 20), 3)
        dets = np.array([[10, 30, 200, 100, 0.9, 0]], np.float32)
        reading = stage.session(Tracker())
        (text,) = await stage.read(
            reading, dets, None, 0.0, lambda: (image, lambda: None), wait=True
        )
        assert text is not None and text.text.replace(" ", "") == "K477"
        # The reply gives the box its track, where the text stays (connection.py).
        reading.settle(reading.tracker.update(dets, 0.0).tolist(), dets, [text])
        state.fail_execute = True  # the GPU goes away: the boxes still go, unread
        later = dets.copy()
        later[0, 2] = 380  # a box much wider: read again
        (gone,) = await stage.read(
            reading, later, None, 1.0, lambda: (image, lambda: None), wait=True
        )
        assert stage.failures == 1 and gone is not None and gone.text == text.text  # carried
    finally:
        await stage.close()


def test_mock_tensorrt_absent_the_recogniser_falls_back_to_onnx_runtime_with_a_log_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    with caplog.at_level(logging.WARNING, logger="edge_vision.engines.recognisers"):
        rec = load_recogniser(None, "tensorrt", threads=1, config=reading_config(tmp_path))
    assert isinstance(rec, OnnxRuntimeRecogniser)
    (line,) = [
        r.getMessage() for r in caplog.records if r.name == "edge_vision.engines.recognisers"
    ]
    assert "runs on ONNX Runtime on the CPU" in line and "TensorRT's Python bindings" in line
