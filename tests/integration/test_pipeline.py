"""The pipeline's two steps, prepare and finish, with the real model on ONNX Runtime: every
decoded canvas goes back to the pool, whether the frame is answered, superseded in the
engine's queue, or its caller is cancelled while it decodes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest

from edge_vision.common.buffers import BufferPool
from edge_vision.common.messages import FrameMessage
from edge_vision.frames.decode import DecodedFrame, Decoder, ImageHeader
from edge_vision.frames.infer import SUPERSEDED, InferenceService
from edge_vision.frames.pipeline import FramePipeline, FrameResult, FrameSettings
from edge_vision.model.spec import ModelSpec

from ..support.images import text_scene
from ..support.server import make_config
from ..support.timing import T

pytestmark = pytest.mark.timeout(120)

JPG = text_scene(640, 360, texts=[("PART 77-A", (120, 150))]).jpeg()
SETTINGS = FrameSettings(0.5)


class _HeldDecoder:
    """The real decoder, held at its start until the test lets it go: the only way to be
    sure a caller is cancelled while a worker decodes its frame."""

    def __init__(self, real: Decoder) -> None:
        self.real = real
        self.name = real.name
        self.started = threading.Event()
        self.go = threading.Event()

    def decode(
        self, data: bytes, header: ImageHeader, min_size: tuple[int, int] | None, pool: BufferPool
    ) -> DecodedFrame:
        self.started.set()
        self.go.wait(T(30))
        return self.real.decode(data, header, min_size, pool)


@pytest.fixture
async def service(spec: ModelSpec) -> AsyncIterator[InferenceService]:
    cfg = make_config({"engine": {"kind": "onnxruntime"}})
    service = InferenceService(spec, cfg)
    await service.start()
    yield service
    await service.close()


def _frame(i: int) -> FrameMessage:
    return FrameMessage(i, 0.0, JPG, False, 0.0)


async def test_a_frame_superseded_in_the_engines_queue_gives_its_canvas_back(
    service: InferenceService,
) -> None:
    pipeline = FramePipeline(service.config, service)
    try:
        a, b, c = [await pipeline.prepare(_frame(i), SETTINGS) for i in range(3)]
        assert pipeline.pool.in_use_bytes > 0  # three canvases handed out
        session = object()
        outcomes: list[Any] = await asyncio.gather(
            pipeline.finish(_frame(0), a, SETTINGS, 0.0),
            pipeline.finish(_frame(1), b, SETTINGS, 0.0, supersede_key=session),
            pipeline.finish(_frame(2), c, SETTINGS, 0.0, supersede_key=session),
        )
    finally:
        await pipeline.close()
    first, replaced, newest = outcomes
    assert replaced is SUPERSEDED  # a value, not an exception
    assert isinstance(first, FrameResult) and isinstance(newest, FrameResult)
    assert len(newest.detections) >= 1 and newest.frame.id == 2
    assert pipeline.pool.in_use_bytes == 0


async def test_a_caller_cancelled_while_its_frame_decodes_leaves_no_canvas_out(
    service: InferenceService,
) -> None:
    pipeline = FramePipeline(service.config, service)
    held = _HeldDecoder(pipeline.decoder)
    pipeline.decoder = held
    try:
        task = asyncio.create_task(pipeline.prepare(_frame(0), SETTINGS))
        assert await asyncio.to_thread(held.started.wait, T(30))
        task.cancel()  # the worker is inside the decode: it will still make a canvas
        with pytest.raises(asyncio.CancelledError):
            await task
        held.go.set()
    finally:
        held.go.set()
        await pipeline.close()  # waits for the abandoned decode
    assert pipeline.pool.allocations >= 1  # the decode did hand out a canvas ...
    assert pipeline.pool.in_use_bytes == 0  # ... and it went back
    assert pipeline.budget.held_by("decode") == 0


async def test_a_gpu_decoder_that_cannot_start_leaves_host_decode_serving_mocked_gpu_engine(
    service: InferenceService, caplog: pytest.LogCaptureFixture
) -> None:
    """decode.device cuda on a machine without CUDA, when an engine that takes device frames
    becomes active (a mock: there is no GPU here): the engine switch must not fail on the
    decoder, which would leave it half done (the old engine never retired, the retry task
    dead). The pipeline says why in the log and decodes on the host; frames are answered."""
    cfg = make_config({"engine": {"kind": "onnxruntime"}, "decode": {"device": "cuda"}})
    pipeline = FramePipeline(cfg, service)
    engine = service.engine
    assert engine is not None

    class _TakesDeviceFrames:  # the active engine, as a CUDA engine would present itself
        accepts_device_frames = True

        def host_allocator(self) -> None:
            return None

    try:
        with caplog.at_level("ERROR", logger="edge_vision.frames.pipeline"):
            pipeline._engine_changed(_TakesDeviceFrames())  # type: ignore[arg-type]
        assert pipeline.decoding.device is None
        assert "decode.device cuda unavailable, decoding on the host" in caplog.text
        result = await pipeline.process(_frame(1), SETTINGS)
        assert isinstance(result, FrameResult) and len(result.detections) >= 1
    finally:
        await pipeline.close()


async def test_one_frames_failed_post_processing_costs_no_other_frame_of_its_batch(
    spec: ModelSpec,
) -> None:
    """A batch's posts run together in one post job (infer.py): a post that raises fails
    its own frame only; the others of the same batch get their detections."""
    cfg = make_config({"engine": {"kind": "onnxruntime", "max_batch": 4, "batch_window_ms": 200}})
    service = InferenceService(spec, cfg)
    await service.start()
    pipeline = FramePipeline(cfg, service)
    threads: list[str] = []

    def boxes(outputs: list[Any], lb: Any) -> Any:
        threads.append(threading.current_thread().name)
        return pipeline.postprocess(outputs, lb, SETTINGS)

    def broken(outputs: list[Any]) -> Any:
        raise ValueError("a head that fails on this frame")

    try:
        prepared = [await pipeline.prepare(_frame(i), SETTINGS) for i in range(3)]
        posts = [
            partial(boxes, lb=prepared[0].letterbox),
            broken,
            partial(boxes, lb=prepared[2].letterbox),
        ]
        outcomes = await asyncio.gather(
            *(service.infer_then(p.canvas, post) for p, post in zip(prepared, posts, strict=True)),
            return_exceptions=True,
        )
        for p in prepared:
            pipeline.release(p)
    finally:
        await pipeline.close()
        await service.close()
    first, failed, last = outcomes
    assert isinstance(failed, ValueError)
    for outcome in (first, last):
        assert isinstance(outcome, tuple)
        dets, batch = outcome
        assert len(dets) >= 1 and batch.size == 3  # one batch, answered
        assert batch.post_s > 0
    assert len(threads) == 2 and threads[0] == threads[1] and threads[0].startswith("post")


async def test_the_engine_runs_the_next_batch_while_a_batch_is_post_processed(
    spec: ModelSpec,
) -> None:
    """A batch leaves the engine's in-flight count when the engine is done with it: with
    one batch in flight, a frame whose post-processing is held does not hold up the next
    frame's inference, nor its answer."""
    cfg = make_config({"engine": {"kind": "onnxruntime", "in_flight": 1}})
    service = InferenceService(spec, cfg)
    await service.start()
    pipeline = FramePipeline(cfg, service)
    go, posting = threading.Event(), threading.Event()

    def held(outputs: list[Any]) -> int:
        posting.set()
        go.wait(T(30))
        return len(outputs)

    try:
        first, second = [await pipeline.prepare(_frame(i), SETTINGS) for i in range(2)]
        slow = asyncio.create_task(service.infer_then(first.canvas, held))
        assert await asyncio.to_thread(posting.wait, T(30)), "the first post never started"
        outputs, info = await asyncio.wait_for(service.infer(second.canvas), T(30))
        assert len(outputs) == 1 and info.size == 1
        assert not slow.done()  # the first frame's post is still held
        go.set()
        value, _ = await asyncio.wait_for(slow, T(30))
        assert value == 1
        for p in (first, second):
            pipeline.release(p)
    finally:
        go.set()
        await pipeline.close()
        await service.close()
