"""Serving on a TensorRT plan, driven by the MOCK ``tensorrt`` module and CUDA layer of
tests/support/mock_tensorrt.py (neither TensorRT nor a GPU can exist on this machine).

What this proves: the engine makes the TensorRT 10 run-time calls in a workable order
(``deserialize_cuda_engine`` → named I/O → ``set_input_shape`` → ``get_tensor_shape`` →
``set_tensor_address`` → ``execute_async_v3``), keeps a slot while a cancelled batch's
outputs are still to be copied out, takes GPU-decoded frames once its stream has waited
for their decode, degrades to ONNX Runtime when a run fails, loads a DLA plan on its core
and pads batches to its static profile, and frees what it allocates. What it cannot
prove: that real TensorRT behaves like the mock.
"""

from __future__ import annotations

import asyncio
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_vision.common.messages import FrameMessage
from edge_vision.engines import create_engine
from edge_vision.engines.device_frame import DeviceFrame
from edge_vision.frames.infer import InferenceService
from edge_vision.frames.pipeline import FramePipeline, FrameSettings
from edge_vision.model.spec import ModelSpec

from ..support import mock_tensorrt
from ..support.images import text_scene
from ..support.mock_tensorrt import (
    MockState,
    _to_thread,
    ort_reference,
    trt_config,
)

# The mock TensorRT fixture, bound here so that pytest finds it for this module's tests.
mock_trt = mock_tensorrt.mock_trt


@pytest.fixture
def cpu_torch() -> Any:
    """torch (its CPU build here), imported before the test's event loop runs."""
    return pytest.importorskip(
        "torch", reason="torch is not installed here (device frames are torch tensors)"
    )


async def test_mock_tensorrt_a_cancelled_batch_keeps_its_slot_until_its_outputs_are_copied_out(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    """A client gone mid-batch must not let the next batch into a slot whose pinned
    outputs the first batch's run thread is still to copy out: with one slot, the next
    batch waits for that copy-out, then gets its own outputs."""
    state, _ = mock_trt
    config = trt_config(tmp_path)
    config.engine.in_flight = 1
    engine = create_engine("tensorrt", spec, config)
    await engine.start()
    try:
        rng = np.random.default_rng(7)
        first = [rng.integers(0, 256, (352, 640, 3), dtype=np.uint8)]
        second = [rng.integers(0, 256, (352, 640, 3), dtype=np.uint8)]
        state.gpu_done = threading.Event()
        gone = asyncio.create_task(engine.infer(first))
        assert await _to_thread(state.synchronising.wait, 10), "the batch never reached the GPU"
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert engine._slot_pool.free == 0, "a slot went back while its copy-out was pending"
        nxt = asyncio.create_task(engine.infer(second))
        await asyncio.sleep(0.2)
        assert state.executions == 1, "the next batch ran in the slot of a pending copy-out"
        assert not nxt.done()
        state.gpu_done.set()
        got = await asyncio.wait_for(nxt, 10)
    finally:
        if state.gpu_done is not None:
            state.gpu_done.set()
        await engine.close()
    ref = await _to_thread(ort_reference, spec, second)
    assert np.linalg.norm(got[0] - ref) / np.linalg.norm(ref) < 1e-5
    assert state.open_buffers == 0


async def test_mock_tensorrt_takes_gpu_decoded_frames_once_its_stream_has_waited_for_their_decode(
    spec: ModelSpec,
    mock_trt: tuple[MockState, types.ModuleType],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cpu_torch: Any,
) -> None:
    """TensorRT gets the GPU decoder's frames through the shared GPU engine base: its
    slot's stream waits, on the GPU, for each decode batch's event before the
    device-to-device copies (mock events and streams: CI has no GPU), then serves them
    as it serves host frames; the slot lets go of them once the batch is done."""
    torch = cpu_torch
    state, _ = mock_trt

    class _WaitingStream:  # the slot's stream as torch sees it (ExternalStream)
        def __init__(self, handle: int, device: Any = None) -> None:
            self.handle = handle

        def wait_event(self, event: Any) -> None:
            state.stream_log.append(("wait", (self.handle, event)))

    monkeypatch.setattr(torch.cuda, "ExternalStream", _WaitingStream)
    engine = create_engine("tensorrt", spec, trt_config(tmp_path))
    await engine.start()
    try:
        rng = np.random.default_rng(11)
        pixels = [rng.integers(0, 256, (352, 640, 3), dtype=np.uint8) for _ in range(4)]
        decoded_together, decoded_later = object(), object()  # two decode batches' events
        frames: list[Any] = [
            DeviceFrame(torch.from_numpy(pixels[0]), decoded_together),
            DeviceFrame(torch.from_numpy(pixels[1]), decoded_together),
            pixels[2],  # decoded on the host
            DeviceFrame(torch.from_numpy(pixels[3]), decoded_later),
        ]
        got = await engine.infer(frames)
        slots_reading = [len(slot.reading) for slot in engine._all_slots]
    finally:
        await engine.close()
    (slot_stream,) = {handle for kind, handle in state.stream_log if kind == "copy"}
    assert state.stream_log == [
        ("wait", (slot_stream, decoded_together)),
        ("wait", (slot_stream, decoded_later)),
        ("copy", slot_stream),
        ("copy", slot_stream),
        ("copy", slot_stream),
    ]
    assert slots_reading == [0, 0]  # let go once the batch was done
    ref = await _to_thread(ort_reference, spec, pixels)
    assert np.linalg.norm(got[0] - ref) / np.linalg.norm(ref) < 1e-5


async def test_mock_tensorrt_run_time_failure_degrades_to_onnxruntime_and_the_frame_is_answered(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    cfg = trt_config(tmp_path)
    cfg.engine.fallback = "onnxruntime"
    scene = text_scene(1280, 720, texts=[("PART 77-A", (300, 260))])
    msg = FrameMessage(1, 0.0, scene.jpeg(), False, 0.0)
    service = InferenceService(spec, cfg)
    await service.start()
    pipeline = FramePipeline(cfg, service)
    try:
        assert service.status.active == "tensorrt"
        on_trt = await pipeline.process(msg, FrameSettings(0.5))
        state.fail_execute = True  # the GPU goes away mid-stream
        on_cpu = await pipeline.process(msg, FrameSettings(0.5))
        status = service.status
    finally:
        await pipeline.close()
        await service.close()
    assert len(on_trt.detections) == 1 and len(on_cpu.detections) == 1
    np.testing.assert_allclose(on_cpu.detections[:, :4], on_trt.detections[:, :4], atol=1.0)
    assert status.active == "onnxruntime" and status.degraded
    assert "execute_async_v3 failed" in str(status.reason)


async def test_mock_tensorrt_dla_plan_loads_on_its_core_and_pads_batches(
    spec: ModelSpec, mock_trt: tuple[MockState, types.ModuleType], tmp_path: Path
) -> None:
    state, _ = mock_trt
    cfg = trt_config(tmp_path, dla_core=0)
    cfg.model.min_side = cfg.model.max_side = 640
    cfg.engine.max_batch = 2  # a DLA profile is static: every batch runs as 2
    from edge_vision.model.spec import load_model_spec

    dla_spec = await _to_thread(load_model_spec, cfg.model)
    engine = create_engine("tensorrt", dla_spec, cfg)
    await engine.start()
    try:
        frame = np.full((640, 640, 3), 90, np.uint8)
        out = await engine.infer([frame])  # runs as a batch of 2, one row returned
    finally:
        await engine.close()
    assert state.runtime_dla_cores == [0]
    assert state.builds[0]["profile"] == ((2, 640, 640, 3),) * 3
    assert out[0].shape == (1, 1, 640, 640)
