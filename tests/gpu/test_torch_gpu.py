"""The torch engine on a CUDA GPU: FP16 against ONNX Runtime on the CPU, CUDA graphs,
pinned frame buffers, several batches in flight, a free event loop. Run for both CUDA
layer implementations."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from benchmarks.yolo_post import yolo_v8_output
from edge_vision.common.messages import FrameMessage
from edge_vision.config import Config
from edge_vision.engines import create_engine
from edge_vision.frames.infer import InferenceService
from edge_vision.frames.pipeline import FramePipeline, FrameSettings
from edge_vision.model.device_post import NMS_UNDECIDED, db_map_levels, yolo_v8_device_nms
from edge_vision.model.heads import YoloV8Head
from edge_vision.model.shape import Letterbox
from edge_vision.model.spec import ModelSpec

from ..support.assertions import assert_same_boxes, iou
from ..support.images import text_scene
from ..support.server import make_config


def _gpu_config(backend: str, **engine: Any) -> Config:
    base: dict[str, Any] = {
        "kind": "torch",
        "fallback": "none",
        "max_batch": 8,
        "in_flight": 3,
        "cuda_backend": backend,
        "warmup_shapes": [[720, 1280]],  # a 16:9 camera frame
        "torch": {"device": "cuda:0", "fp16": True, "cuda_graphs": True},
    }
    base.update(engine)
    return make_config({"engine": base})


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


async def _outputs(kind: str, spec: ModelSpec, cfg: Config, frames: list[np.ndarray]) -> Any:
    engine = create_engine(kind, spec, cfg)
    await engine.start()
    try:
        await engine.prepare([frames[0].shape[:2]])
        return (await engine.infer(frames))[0], engine.describe()
    finally:
        await engine.close()


async def test_fp16_matches_onnx_runtime_on_real_frames_and_fp32_everywhere(
    spec: ModelSpec, backend: str
) -> None:
    """FP16 against ONNX Runtime's FP32 on the CPU, relative error ‖a−b‖/‖b‖.

    On camera-like frames FP16 stays far inside 1e-2. On uniform random noise it does not:
    1.34e-2 was measured on the H200 on 2026-11-30 (docs/benchmarks.md; the onnx2torch
    module of an earlier run there gave 1.45e-2), because noise drives
    activations into ranges where FP16's 10-bit mantissa loses more; that case is bounded
    at 2e-2 here and judged by detections instead (next test). FP32 through the same
    converter, graphs and buffers must match closely on both."""
    rng = np.random.default_rng(0)
    random_frames = [rng.integers(0, 255, (384, 640, 3), dtype=np.uint8) for _ in range(4)]
    real = [
        text_scene(640, 384, texts=[(f"UNIT {i}7-{i}B", (40 + 30 * i, 120 + 40 * i))], seed=i)
        .rgb[:, :, ::-1]
        .copy()
        for i in range(4)
    ]
    limits = {
        ("fp16", "real"): 1e-2,
        ("fp16", "random"): 2e-2,
        ("fp32", "real"): 1e-3,
        ("fp32", "random"): 1e-3,
    }
    for precision in ("fp16", "fp32"):
        cfg = _gpu_config(backend)
        cfg.engine.torch.fp16 = precision == "fp16"
        cfg.engine.torch.device_post = False  # the network's own float map, not its byte map
        for name, frames in (("real", real), ("random", random_frames)):
            got, info = await _outputs("torch", spec, cfg, frames)
            ref, _ = await _outputs("onnxruntime", spec, cfg, frames)
            err = _rel(got, ref)
            print(f"{backend} {precision} {name} frames: relative error {err:.2e}")
            assert got.shape == ref.shape
            limit = limits[(precision, name)]
            assert err <= limit, f"{precision} {name}: relative error {err:.2e} > {limit}"
            assert info["graphs_captured"] > 0 and info["cuda_backend"] == backend


async def test_same_detections_as_onnx_runtime_after_post_processing(
    spec: ModelSpec, backend: str
) -> None:
    scenes = [
        text_scene(
            1280, 720, texts=[("SERIAL 4711-AB", (200, 250)), ("LOT 0042", (700, 520))], seed=s
        )
        for s in range(3)
    ]
    found: dict[str, list[list[list[float]]]] = {}
    for kind in ("onnxruntime", "torch"):
        cfg = _gpu_config(backend, kind=kind)
        service = InferenceService(spec, cfg)
        await service.start()
        if kind == "torch":  # its DB map is binarised on the GPU (engine.torch.device_post)
            assert service.engine is not None and service.engine.describe()["device_post"]
        pipeline = FramePipeline(cfg, service)
        try:
            results = await asyncio.gather(
                *(
                    pipeline.process(
                        FrameMessage(i, 0.0, sc.jpeg(), False, time.perf_counter()),
                        FrameSettings(0.5),
                    )
                    for i, sc in enumerate(scenes)
                )
            )
        finally:
            await pipeline.close()
            await service.close()
        found[kind] = [[d[:4].tolist() for d in r.detections] for r in results]
    for i, sc in enumerate(scenes):
        assert_same_boxes(found["torch"][i], found["onnxruntime"][i], tol=2.0)
        for box in sc.text_boxes:
            assert max(iou(b, box) for b in found["torch"][i]) >= 0.5


async def test_frames_are_decoded_into_pinned_memory_while_the_gpu_engine_serves(
    spec: ModelSpec, backend: str
) -> None:
    cfg = _gpu_config(backend)
    service = InferenceService(spec, cfg)
    await service.start()
    pipeline = FramePipeline(cfg, service)
    try:
        engine = service.engine
        assert engine is not None
        allocator = engine.host_allocator()
        assert allocator is not None and pipeline.pool._allocator == allocator
        res = await pipeline.process(
            FrameMessage(1, 0.0, text_scene(1280, 720).jpeg(), False, time.perf_counter()),
            FrameSettings(0.5),
        )
        assert len(res.detections) >= 1
        assert pipeline.pool.allocations >= 1
    finally:
        await pipeline.close()
        await service.close()


async def test_several_batches_in_flight_complete_in_order_of_their_own_data(
    spec: ModelSpec, backend: str
) -> None:
    """Three slots run concurrently; each caller gets the outputs of its own frames."""
    cfg = _gpu_config(backend)
    engine = create_engine("torch", spec, cfg)
    await engine.start()
    try:
        await engine.prepare([(384, 640)])
        blank = np.zeros((384, 640, 3), np.uint8)
        texty = text_scene(640, 384, texts=[("ABC 123", (100, 150))]).rgb[:, :, ::-1].copy()
        batches = [[texty if (i + j) % 2 else blank for j in range(8)] for i in range(12)]
        outs = await asyncio.gather(*(engine.infer(b) for b in batches))
        for b, out in zip(batches, outs, strict=True):
            for frame, raw in zip(b, out[0], strict=True):
                # A DB map comes back as its byte map on the GPU (engine.torch.device_post).
                levels = db_map_levels(cfg.model.dbnet.bin_threshold)
                prob = levels[raw] if raw.dtype == np.uint8 else raw
                has_text = prob.max() > 0.5
                assert has_text == (frame is texty)
    finally:
        await engine.close()


@pytest.mark.parametrize("depth", [3])
async def test_event_loop_stays_free_while_the_gpu_is_saturated(
    spec: ModelSpec, backend: str, depth: int
) -> None:
    cfg = _gpu_config(backend, max_batch=32, in_flight=depth)
    engine = create_engine("torch", spec, cfg)
    await engine.start()
    try:
        await engine.prepare([(384, 640)])
        frames = [np.zeros((384, 640, 3), np.uint8)] * 32
        lags: list[float] = []
        stop = time.perf_counter() + 3.0

        async def probe() -> None:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                await asyncio.sleep(0.001)
                lags.append((time.perf_counter() - t - 0.001) * 1000)

        async def load() -> None:
            while time.perf_counter() < stop:
                await engine.infer(frames)

        await asyncio.gather(probe(), *(load() for _ in range(depth)))
        p99 = float(np.percentile(lags, 99))
        print(
            f"{backend}: loop lag p50 {np.percentile(lags, 50):.2f} ms p99 {p99:.2f} ms "
            f"over {len(lags)} probes"
        )
        assert p99 < 5.0, f"event loop lag p99 {p99:.1f} ms while the GPU was saturated"
    finally:
        await engine.close()


@pytest.mark.timeout(900)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's own imports
async def test_compiled_engine_is_captured_and_matches_the_interpreter_on_the_gpu(
    spec: ModelSpec, backend: str, tmp_path: Any
) -> None:
    """engine.torch.compile default on a CUDA GPU: the warm-up compiles each batch bucket
    of the shape (Triton kernels), the CUDA graphs capture the compiled code, and a batch
    gives the interpreter's outputs (both FP16 with device post off, so the float map):
    within FP16 rounding of the fused kernels' different order."""
    rng = np.random.default_rng(7)
    frames = [
        text_scene(640, 384, texts=[(f"LOT {i}4-{i}C", (60 + 20 * i, 100 + 50 * i))], seed=i)
        .rgb[:, :, ::-1]
        .copy()
        for i in range(3)
    ] + [rng.integers(0, 255, (384, 640, 3), dtype=np.uint8)]
    results = {}
    for mode in ("off", "default"):
        cfg = _gpu_config(backend, max_batch=4)
        cfg.engine.torch.device_post = False
        cfg.engine.torch.compile = mode  # type: ignore[assignment]
        cfg.engine.torch.compile_cache = tmp_path / "inductor"
        t0 = time.perf_counter()
        results[mode] = await _outputs("torch", spec, cfg, frames)
        print(f"{backend} compile {mode}: prepared and ran in {time.perf_counter() - t0:.1f} s")
    (got, info), (ref, _) = results["default"], results["off"]
    assert info["compiled_shapes"] == 3  # buckets 1, 2 and 4 of the one shape
    assert info["graphs_captured"] > 0
    err = _rel(got, ref)
    print(f"{backend} compiled against the interpreter: relative error {err:.2e}")
    assert got.shape == ref.shape and err <= 5e-3


def test_yolo_device_nms_is_captured_in_a_cuda_graph_and_gives_the_host_s_detections() -> None:
    """post.yolo_v8_device_nms as the torch engine runs it (engine.torch.device_post):
    captured in a CUDA graph on the GPU, replayed on outputs copied into its static input,
    and the v8 head reads from what comes back the detections it finds in the whole raw
    output on the host (synthetic YOLO v8 outputs: no YOLO weights exist here)."""
    import torch

    rng = np.random.default_rng(5)
    raws = [yolo_v8_output(rng, objects=40, batch=4) for _ in range(3)]
    dev = torch.device("cuda:0")
    static = torch.zeros(raws[0].shape, dtype=torch.float32, device=dev)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        yolo_v8_device_nms(torch, static, 1024, 0.45)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            outputs = yolo_v8_device_nms(torch, static, 1024, 0.45)
    head = YoloV8Head()
    lb = Letterbox(640, 640, 640, 640, 640, 640, 0, 0)
    found = 0
    for raw in raws:  # the same graph, replayed on each batch
        static.copy_(torch.from_numpy(raw))
        graph.replay()
        dets, state = (o.cpu().numpy() for o in outputs)
        assert not (state == NMS_UNDECIDED).any()
        for b in range(len(raw)):
            want = head.decode([raw[b]], lb, 0.25)
            got = head.decode([dets[b], state[b]], lb, 0.25)
            assert len(got) == len(want)
            np.testing.assert_allclose(got, want, atol=1e-3)  # best first, both
            found += len(want)
    assert found >= 300
