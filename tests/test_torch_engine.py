"""The torch engine's ONNX converter against ONNX Runtime, on the CPU (CI has no GPU).

The GPU path (pinned memory, streams, CUDA graphs) is proved in tests/gpu/ on a CUDA
machine; this checks the converter and the engine contract everywhere torch is installed.
"""

from __future__ import annotations

import numpy as np
import pytest

from edge_vision.config import Config
from edge_vision.engines import create_engine
from edge_vision.infer import InferenceService
from edge_vision.models import ModelSpec
from edge_vision.pipeline import FramePipeline, FrameSettings
from edge_vision.receive import FrameMessage

from .support.assertions import assert_same_boxes
from .support.images import text_scene
from .support.server import make_config

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed here (scripts/test installs a CPU build of torch only "
    "where one lies in /opt/wheels)",
)


def _cpu_config() -> Config:
    return make_config(
        {
            "engine": {
                "kind": "torch",
                "fallback": "none",
                "max_batch": 2,
                "warmup_shapes": [[384, 640]],
                "torch": {"device": "cpu", "fp16": False},
            }
        }
    )


async def test_converted_graph_matches_onnx_runtime_on_random_input(spec: ModelSpec) -> None:
    cfg = _cpu_config()
    ort_engine = create_engine("onnxruntime", spec, cfg)
    torch_engine = create_engine("torch", spec, cfg)
    await ort_engine.start()
    await torch_engine.start()
    try:
        rng = np.random.default_rng(3)
        frames = [rng.integers(0, 255, (384, 640, 3), dtype=np.uint8) for _ in range(2)]
        ref = (await ort_engine.infer(frames))[0]
        got = (await torch_engine.infer(frames))[0]
    finally:
        await ort_engine.close()
        await torch_engine.close()
    assert got.shape == ref.shape == (2, 1, 384, 640)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3


async def test_torch_engine_finds_the_same_text_as_onnx_runtime(spec: ModelSpec) -> None:
    scene = text_scene(1280, 720, texts=[("PART 77-A", (300, 260)), ("LOT 12", (700, 500))])
    msg = FrameMessage(1, 0.0, scene.jpeg(), False, 0.0)
    boxes = {}
    for kind in ("onnxruntime", "torch"):
        cfg = _cpu_config()
        cfg.engine.kind = kind  # type: ignore[assignment]
        service = InferenceService(spec, cfg)
        await service.start()
        pipeline = FramePipeline(cfg, service)
        try:
            res = await pipeline.process(msg, FrameSettings(0.5))
        finally:
            await pipeline.close()
            await service.close()
        boxes[kind] = [d[:4].tolist() for d in res.detections]
    assert len(boxes["torch"]) == 2
    assert_same_boxes(boxes["torch"], boxes["onnxruntime"], tol=1.0)
