"""TensorRT plans, driven by the MOCK ``tensorrt`` module and CUDA layer of
tests/support/mock_tensorrt.py (neither TensorRT nor a GPU can exist on this machine).

What this proves: the engine and ``edge-vision build-engine`` make the TensorRT 10 build
calls in a workable order (parse → profile → flags → timing cache → progress monitor →
calibrator → ``build_serialized_network``), find, reuse, refuse and rebuild plans as the
key says, name the nodes TensorRT's ONNX parser rejects, feed the INT8 calibrator real
frames, target a DLA core, and write plan + JSON + caches. What it cannot prove: that
real TensorRT behaves like the mock.
"""

from __future__ import annotations

import asyncio
import json
import types
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import pytest

from edge_vision.cli import main
from edge_vision.engines import create_engine
from edge_vision.errors import EngineError
from edge_vision.frames.infer import InferenceService
from edge_vision.model.shape import letterbox_into, plan_for_frame
from edge_vision.model.spec import ModelSpec

from ..support import mock_tensorrt
from ..support.mock_tensorrt import (
    MockState,
    _to_thread,
    listing,
    ort_reference,
    start_and_close,
    trt_config,
)
from ..support.video import write_image_folder

# The mock TensorRT fixture, bound here so that pytest finds it for this module's tests.
mock_trt = mock_tensorrt.mock_trt


async def test_mock_tensorrt_engine_builds_once_then_reuses_its_plan_and_matches_onnxruntime(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    engine = create_engine("tensorrt", spec, trt_config(tmp_path))
    await engine.start()
    try:
        assert engine.max_batch == 4 and len(state.builds) == 1
        assert state.builds[0]["flags"] == ["FP16"]
        # Tuned (OPT) for a 16:9 frame's input as the default model's stretch picks it.
        assert state.builds[0]["profile"] == ((1, 32, 32, 3), (4, 352, 640, 3), (4, 640, 640, 3))
        await engine.prepare([(352, 640), (640, 352)])
        rng = np.random.default_rng(5)
        wide = [rng.integers(0, 256, (352, 640, 3), dtype=np.uint8) for _ in range(2)]
        tall = [rng.integers(0, 256, (640, 352, 3), dtype=np.uint8)]
        # Two batches at once: one per slot, each with its own context and buffers.
        got_wide, got_tall = await _gather(engine.infer(wide), engine.infer(tall))
        description = engine.describe()
    finally:
        await engine.close()
    for got, frames in ((got_wide[0], wide), (got_tall[0], tall)):
        ref = await _to_thread(ort_reference, spec, frames)
        assert got.shape == ref.shape and got.dtype == np.float32
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
    assert state.open_buffers == 0  # close() freed every device and pinned buffer
    assert description["built_now"] is True and description["tensorrt"] == "10.3.0"
    files = await _to_thread(listing, tmp_path)
    stem = Path(str(description["plan"])).stem
    assert files == [f"{stem}.json", f"{stem}.plan", "timing-nvidia-mockgpu-sm_90-trt10-3-0.cache"]

    again = create_engine("tensorrt", spec, trt_config(tmp_path))
    await again.start()
    try:
        assert again.describe()["built_now"] is False and again.describe()["plan"] == f"{stem}.plan"
        out = await again.infer(tall)
    finally:
        await again.close()
    assert len(state.builds) == 1  # never rebuilt at start
    np.testing.assert_array_equal(out[0], got_tall[0])


async def test_mock_tensorrt_plan_for_another_tensorrt_version_is_refused_or_rebuilt_by_config(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, trt = mock_trt
    await start_and_close(spec, tmp_path)  # a plan for this machine, in tmp_path
    trt.__version__ = "10.7.0"  # type: ignore[attr-defined]  # JetPack upgraded

    strict = create_engine("tensorrt", spec, trt_config(tmp_path, build_if_missing=False))
    with pytest.raises(EngineError) as refused:
        await strict.start()
    await strict.close()
    message = str(refused.value)
    assert "plan built for NVIDIA MockGPU (sm_90)/TensorRT 10.3.0" in message
    assert "this machine is NVIDIA MockGPU (sm_90)/TensorRT 10.7.0" in message
    assert message.endswith(
        "rebuild with edge-vision build-engine --precision fp16 (with the same --config as serve)"
    )
    assert len(state.builds) == 1

    rebuilding = create_engine("tensorrt", spec, trt_config(tmp_path))
    await rebuilding.start()
    try:
        assert rebuilding.describe()["tensorrt"] == "10.7.0"
    finally:
        await rebuilding.close()
    assert len(state.builds) == 2
    files = await _to_thread(listing, tmp_path)
    assert sum(f.endswith(".plan") for f in files) == 2  # the old plan stays for the old key
    assert "timing-nvidia-mockgpu-sm_90-trt10-7-0.cache" in files


async def test_mock_tensorrt_without_a_plan_and_building_off_says_how_to_build_and_degrades(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    cfg = trt_config(tmp_path, build_if_missing=False)
    cfg.engine.fallback = "onnxruntime"
    service = InferenceService(spec, cfg)
    await service.start()
    try:
        assert service.status.active == "onnxruntime" and service.status.degraded
        reason = str(service.status.reason)
        assert "no TensorRT plan for this model and machine" in reason
        assert "build it with edge-vision build-engine" in reason
    finally:
        await service.close()
    assert mock_trt[0].builds == []


async def test_mock_tensorrt_parser_errors_name_the_unsupported_nodes(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    state.unsupported_ops = {"Resize"}
    model = await _to_thread(onnx.load, str(spec.path))
    resizes = [(i, n.name) for i, n in enumerate(model.graph.node) if n.op_type == "Resize"]
    assert resizes
    engine = create_engine("tensorrt", spec, trt_config(tmp_path))
    with pytest.raises(EngineError) as failed:
        await engine.start()
    await engine.close()
    lines = str(failed.value).splitlines()
    assert lines[0] == f"TensorRT's ONNX parser rejected {spec.path} ({len(resizes)} error(s)):"
    for (index, name), line in zip(resizes, lines[1:], strict=True):
        assert line == (
            f"  node {name!r} (Resize, #{index}): UNSUPPORTED_NODE: "
            "no importer registered for op: Resize"
        )
    assert await _to_thread(listing, tmp_path) == []  # nothing half-built left behind

    # While degraded the service retries its engine; a failed build is not redone each time.
    retry = create_engine("tensorrt", spec, trt_config(tmp_path))
    with pytest.raises(EngineError, match="failed earlier in this process"):
        await retry.start()
    await retry.close()
    assert state.parses == 1


async def test_mock_tensorrt_plan_refused_by_tensorrt_is_rebuilt_once_when_allowed(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    await start_and_close(spec, tmp_path)  # a plan for this machine, in tmp_path

    state.refuse_deserialize = 1
    strict = create_engine("tensorrt", spec, trt_config(tmp_path, build_if_missing=False))
    with pytest.raises(EngineError, match=r"could not load .*not compatible.*rebuild"):
        await strict.start()
    await strict.close()

    state.refuse_deserialize = 1
    await start_and_close(spec, tmp_path)  # allowed to build: heals the plan
    assert len(state.builds) == 2  # rebuilt once, in place, then loaded


def test_mock_tensorrt_build_engine_calibrates_int8_on_real_frames_and_reuses_its_caches(
    spec: ModelSpec,
    mock_trt: tuple[MockState, types.ModuleType],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, _ = mock_trt
    write_image_folder(tmp_path / "frames", 480, 270, frames=10)
    engines = tmp_path / "engines"
    argv = [
        "build-engine",
        str(spec.path),
        "--precision",
        "int8",
        "--calibration",
        str(tmp_path / "frames"),
        "--calibration-frames",
        "9",
        "--engine-dir",
        str(engines),
        "--set",
        "engine.tensorrt.calibration_batch=4",
        "--set",
        "engine.max_batch=4",  # the calibration batch is capped at the profile's max batch
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("built ") and "record: " in out
    build = state.builds[0]
    # The profile's OPT: a 16:9 frame's input with the default model's stretch.
    assert build["flags"] == ["FP16", "INT8"] and build["calibration_shape"] == (4, 352, 640, 3)
    # 9 frames at batch 4: two full batches of real frames fitted as serving fits them
    # (stretched to fill the input), the rest dropped.
    assert [b.shape for b in state.calibration_batches] == [(4, 352, 640, 3)] * 2
    first = cv2.imread(str(tmp_path / "frames" / "frame_0.png"))
    expected = np.empty((352, 640, 3), np.uint8)
    served = plan_for_frame(480, 270, spec.limits)
    assert served.shape == (352, 640) and spec.limits.fit == "stretch"
    letterbox_into(first, served, expected, spec.pad_value)
    np.testing.assert_array_equal(state.calibration_batches[0][0], expected)
    record = json.loads(next(engines.glob("*.json")).read_text())
    assert record["calibration"]["frames_used"] == 8
    calib_cache = Path(record["calibration"]["cache"])
    assert calib_cache.read_bytes() == b"calibration-table"

    assert main(argv) == 0  # nothing changed: nothing built
    assert capsys.readouterr().out.startswith("up to date: ")
    assert len(state.builds) == 1

    assert main([*argv, "--force"]) == 0
    assert len(state.builds) == 2 and len(state.calibration_batches) == 2  # not recalibrated
    assert state.calibration_cache_read == b"calibration-table"
    assert state.timing_caches_given[0] == b"" and state.timing_caches_given[1].startswith(b"TC:")


def test_mock_tensorrt_dla_build_targets_the_core_with_gpu_fallback_and_a_static_profile(
    spec: ModelSpec,
    mock_trt: tuple[MockState, types.ModuleType],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, _ = mock_trt
    static = ["--set", "model.min_side=640", "--set", "model.max_side=640", "--max-batch", "1"]
    argv = ["build-engine", "--dla-core", "1", "--engine-dir", str(tmp_path), *static]
    assert main(argv) == 0
    build = state.builds[0]
    assert build["device"] == "DLA" and build["dla_core"] == 1
    assert build["flags"] == ["FP16", "GPU_FALLBACK"]
    assert build["profile"] == ((1, 640, 640, 3),) * 3
    assert "-dla1-" in capsys.readouterr().out

    assert main([*argv[:2], "2", *argv[3:]]) == 2
    assert "DLA core 2 requested; this device has 2 DLA core(s)" in capsys.readouterr().err


async def _gather(*aws: Any) -> list[Any]:
    return list(await asyncio.gather(*aws))
