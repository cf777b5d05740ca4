"""The ``triton`` engine against a real Triton Inference Server (tritonserver 2.51 on the CPU).

Triton runs from ``.triton-venv`` (``scripts/setup-triton-env``) as a separate process,
started once for this module, serving the default model's network under the tensor names
and shapes of ``deploy/triton/model_repository/ppocr_det/config.pbtxt`` with Triton's
dynamic batcher. Tests that kill it leave it to the next test's fixture to start again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest

from edge_vision.config import Config
from edge_vision.engines.onnxruntime import OnnxRuntimeEngine
from edge_vision.engines.triton import TritonEngine
from edge_vision.errors import EngineMismatch, EngineUnavailable
from edge_vision.frames.infer import InferenceService
from edge_vision.model.shape import letterbox_into, plan_for_frame
from edge_vision.model.spec import ModelSpec

from ..support.assertions import assert_box_overlaps, assert_same_boxes
from ..support.clients import connect, frame_binary, recv
from ..support.images import Scene, text_scene
from ..support.scrape import metric, metrics_text
from ..support.server import RunningServer, free_port, make_config, running_server
from ..support.timing import T
from ..support.triton import (
    WRONG_DIMS_MODEL,
    WRONG_NAME_MODEL,
    TritonCounts,
    TritonProcess,
    triton_env_missing,
)

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(triton_env_missing() is not None, reason=str(triton_env_missing())),
]


# -- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def triton_process(
    tmp_path_factory: pytest.TempPathFactory, spec: ModelSpec
) -> Iterator[TritonProcess]:
    proc = TritonProcess(tmp_path_factory.mktemp("triton"), spec.path)
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def triton(triton_process: TritonProcess) -> TritonProcess:
    """The module's Triton, started again if an earlier test killed it."""
    if not triton_process.alive:
        triton_process.stop()
        triton_process.start()
    return triton_process


def triton_config(server: TritonProcess, **engine: Any) -> dict[str, Any]:
    """Overrides for an edge_vision server whose engine is this Triton."""
    triton_keys = {
        "url": server.url,
        "stats_interval_s": 0.2,
        "reconnect_backoff_s": 0.5,
        "timeout_s": 30.0,
        **engine.pop("triton", {}),
    }
    return {
        "engine": {
            "kind": "triton",
            "fallback": "none",
            "retry_primary_s": 0.5,
            "triton": triton_keys,
            **engine,
        }
    }


def letterboxed(scene: Scene, spec: ModelSpec) -> np.ndarray:
    """The scene as the engine sees it: BGR, letterboxed to its per-frame input shape."""
    lb = plan_for_frame(scene.width, scene.height, spec.limits)
    canvas = np.empty((lb.out_h, lb.out_w, 3), np.uint8)
    letterbox_into(np.ascontiguousarray(scene.rgb[:, :, ::-1]), lb, canvas, spec.pad_value)
    return canvas


async def readyz(session: aiohttp.ClientSession, server: RunningServer) -> tuple[int, Any]:
    async with session.get(server.url + "/readyz") as r:
        return r.status, await r.json()


async def until(check: Any, timeout: float, what: str) -> Any:
    """Poll ``await check()`` until it returns something truthy."""
    deadline = time.monotonic() + T(timeout)
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {T(timeout)} s waiting for {what}")


async def served_since(
    triton: TritonProcess, before: TritonCounts, inferences: int
) -> TritonCounts:
    """Triton's counts since ``before``, once they show ``inferences`` frames: Triton
    records a request's statistics when it releases it, just after the response goes out."""

    async def check() -> TritonCounts | None:
        done = (await asyncio.to_thread(triton.counts)).since(before)
        return done if done.inferences >= inferences else None

    try:
        found: TritonCounts = await until(
            check, 5, f"{inferences} inferences in Triton's statistics"
        )
    except AssertionError:
        return (await asyncio.to_thread(triton.counts)).since(before)
    return found


SCENES = [
    text_scene(1280, 720),
    text_scene(960, 540, texts=[("LOT 0042", (300, 200)), ("EXP 2027-01", (80, 400))]),
    text_scene(480, 800, texts=[("ABC 123", (60, 500))], font_size=48),
]


# -- same answers as the local engine ---------------------------------------------------


async def test_one_request_per_batch_with_the_local_engines_outputs(
    triton: TritonProcess, spec: ModelSpec
) -> None:
    """Batches of 1 and 4 go as one request each and come back as ONNX Runtime computes
    them on this machine (same float32 network, so within float rounding)."""
    config = make_config(triton_config(triton))
    frames = [letterboxed(text_scene(1280, 720, seed=s), spec) for s in range(4)]
    remote, local = TritonEngine(spec, config), OnnxRuntimeEngine(spec, config)
    await remote.start()
    await local.start()
    try:
        before = await asyncio.to_thread(triton.counts)
        for batch in (frames[:1], frames):
            got = await remote.infer(batch)
            want = await local.infer(batch)
            assert [g.shape for g in got] == [w.shape for w in want]
            assert got[0].shape[:2] == (len(batch), 1)
            assert np.abs(got[0] - want[0]).max() < 1e-3
        done = await served_since(triton, before, 5)
    finally:
        await remote.close()
        await local.close()
    assert (done.requests, done.inferences) == (2, 5), done
    assert remote.describe()["triton_version"] == "2.51.0"


async def test_engine_triton_returns_the_local_engines_detections(
    triton: TritonProcess, server_factory: Any
) -> None:
    local = await server_factory()
    remote = await server_factory(triton_config(triton))
    results: dict[str, list[dict[str, Any]]] = {}
    async with aiohttp.ClientSession() as s:
        for name, server in (("local", local), ("triton", remote)):
            ws, hello = await connect(s, server.ws_url)
            assert hello["engine"]["active"] == ("triton" if name == "triton" else "onnxruntime")
            results[name] = []
            for i, scene in enumerate(SCENES):
                await ws.send_bytes(frame_binary(i, float(i), scene.jpeg()))
                results[name].append(await recv(ws))
            await ws.close()
        status, ready = await readyz(s, remote)
    assert status == 200 and ready["engine"]["active"] == "triton", ready
    assert not ready["engine"]["degraded"]
    for scene, want, got in zip(SCENES, results["local"], results["triton"], strict=True):
        assert got["type"] == want["type"] == "result", (want, got)
        assert_box_overlaps(got, scene.text_boxes[0])
        assert_same_boxes(
            [d["box"] for d in got["detections"]], [d["box"] for d in want["detections"]], tol=1.0
        )
        for g, w in zip(got["detections"], want["detections"], strict=True):
            assert abs(g["score"] - w["score"]) < 0.01


# -- batching on the Triton side --------------------------------------------------------


async def test_concurrent_connections_are_batched_by_tritons_dynamic_batcher(
    triton: TritonProcess, server_factory: Any
) -> None:
    """Each frame goes as its own request (edge_vision max_batch 1, 4 in flight), as from
    several small nodes; Triton's dynamic batcher runs queued requests together."""
    server = await server_factory(triton_config(triton, max_batch=1, triton={"in_flight": 4}))
    scene = text_scene(1280, 720)
    jpg = scene.jpeg()
    connections, frames_each = 4, 4
    before = await asyncio.to_thread(triton.counts)

    async def client(s: aiohttp.ClientSession, c: int) -> list[dict[str, Any]]:
        ws, _ = await connect(s, server.ws_url + "?mode=every")
        for i in range(frames_each):
            await ws.send_bytes(frame_binary(f"{c}/{i}", float(i), jpg))
        replies = [await recv(ws, timeout=120) for _ in range(frames_each)]
        await ws.close()
        return replies

    async with aiohttp.ClientSession() as s:
        per_client = await asyncio.gather(*(client(s, c) for c in range(connections)))
        done = await served_since(triton, before, connections * frames_each)
        for replies in per_client:
            for r in replies:
                assert r["type"] == "result", r
                assert_box_overlaps(r, scene.text_boxes[0])

        total = connections * frames_each
        assert done.requests == total and done.inferences == total, done
        assert done.executions < done.requests, f"Triton ran every request alone: {done}"
        assert max(done.batch_sizes) > 1, done

        # /metrics: the client round trip of every request, and Triton's own statistics.
        async def polled() -> str | None:
            text = await metrics_text(s, server.url)
            ok = metric(text, "edge_vision_triton_server_inferences_total") >= total
            return text if ok else None

        text = await until(polled, 10, "Triton's statistics in /metrics")
    assert metric(text, "edge_vision_triton_request_seconds_count") >= total
    executions = metric(text, "edge_vision_triton_server_executions_total")
    assert 0 < executions < metric(text, "edge_vision_triton_server_inferences_total")
    assert metric(text, 'edge_vision_triton_server_seconds_total{phase="compute_infer"}') > 0
    assert metric(text, 'edge_vision_triton_server_seconds_total{phase="queue"}') > 0


# -- Triton outages -------------------------------------------------------------------


class Stream:
    """One 'every'-mode connection sending a frame every ``interval`` s; collects replies."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, jpg: bytes) -> None:
        self.ws, self.jpg = ws, jpg
        self.sent = 0
        self.replies: list[dict[str, Any]] = []

    async def send(self, count: int, interval: float) -> None:
        for _ in range(count):
            await self.ws.send_bytes(frame_binary(self.sent, float(self.sent), self.jpg))
            self.sent += 1
            await asyncio.sleep(interval)

    async def receive_all(self) -> None:
        while len(self.replies) < self.sent:
            self.replies.append(await recv(self.ws, timeout=60))

    async def until_replies(self, n: int) -> None:
        while len(self.replies) < n:
            self.replies.append(await recv(self.ws, timeout=60))


async def kill_mid_stream(
    triton: TritonProcess, server_factory: Any, session: aiohttp.ClientSession, fallback: str
) -> tuple[RunningServer, Scene, Stream]:
    """An edge_vision server on this Triton with ``fallback``, one 'every'-mode stream of a
    text scene to it, and Triton killed while frames keep coming: every one gets an answer."""
    server = await server_factory(triton_config(triton, fallback=fallback))
    scene = text_scene(1280, 720)
    ws, _ = await connect(session, server.ws_url + "?mode=every")
    stream = Stream(ws, scene.jpeg())
    sender = asyncio.create_task(stream.send(12, 0.05))
    await stream.until_replies(2)  # Triton is serving this stream now
    await asyncio.to_thread(triton.crash)
    await sender
    await stream.receive_all()
    ids = [r["id"] for r in stream.replies]
    assert ids == list(range(stream.sent)), f"frames lost or out of order: {ids}"
    return server, scene, stream


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_triton_killed_mid_stream_degrades_to_the_local_engine_and_comes_back(
    triton: TritonProcess, server_factory: Any, session: aiohttp.ClientSession
) -> None:
    server, scene, stream = await kill_mid_stream(triton, server_factory, session, "onnxruntime")
    for r in stream.replies:  # the local engine re-ran the batches Triton dropped
        assert r["type"] == "result", r
        assert_box_overlaps(r, scene.text_boxes[0])
    status, ready = await readyz(session, server)
    assert status == 200 and ready["engine"]["active"] == "onnxruntime", ready
    assert ready["engine"]["degraded"], ready
    assert f"Triton at {triton.url}" in ready["engine"]["reason"], ready
    text = await metrics_text(session, server.url)
    assert metric(text, "edge_vision_engine_degraded") == 1

    await asyncio.to_thread(triton.start)

    async def back_on_triton() -> bool:
        status, ready = await readyz(session, server)
        return status == 200 and ready["engine"]["active"] == "triton"

    await until(back_on_triton, 30, "edge_vision to switch back to Triton by itself")
    before = await asyncio.to_thread(triton.counts)
    await stream.send(2, 0.0)
    await stream.receive_all()
    assert all(r["type"] == "result" for r in stream.replies[-2:]), stream.replies[-2:]
    served = await served_since(triton, before, 2)
    assert served.inferences == 2, served
    status, ready = await readyz(session, server)
    assert not ready["engine"]["degraded"], ready
    await stream.ws.close()


async def test_triton_killed_without_fallback_answers_engine_unavailable_and_recovers(
    triton: TritonProcess, server_factory: Any, session: aiohttp.ClientSession
) -> None:
    server, _, stream = await kill_mid_stream(triton, server_factory, session, "none")
    errors = [r for r in stream.replies if r["type"] == "error"]
    assert errors, "every frame got a result although Triton was killed"
    assert {r["code"] for r in errors} == {"engine_unavailable"}, errors
    assert all(r["type"] == "result" for r in stream.replies[: stream.replies.index(errors[0])])
    assert all(r["type"] == "error" for r in stream.replies[stream.replies.index(errors[0]) :])
    status, ready = await readyz(session, server)
    assert status == 503 and f"Triton at {triton.url}" in ready["engine_problem"], ready
    text = await metrics_text(session, server.url)
    rejected = metric(text, 'edge_vision_frames_rejected_total{code="engine_unavailable"}')
    assert rejected == len(errors)
    assert metric(text, 'edge_vision_triton_request_failures_total{status="UNAVAILABLE"}') > 0

    await asyncio.to_thread(triton.start)

    async def answered_by_triton() -> bool:
        await stream.send(1, 0.0)
        await stream.receive_all()
        return bool(stream.replies[-1]["type"] == "result")

    await until(answered_by_triton, 30, "frames to be answered again without a restart")
    status, ready = await readyz(session, server)
    assert status == 200 and ready["engine"]["active"] == "triton", ready
    await stream.ws.close()


async def test_unreachable_triton_at_start_degrades_or_stops_by_the_fallback_setting(
    spec: ModelSpec,
) -> None:
    url = f"127.0.0.1:{free_port()}"  # nothing listens there
    overrides = {"engine": {"kind": "triton", "triton": {"url": url}, "retry_primary_s": 0}}
    with_fallback = InferenceService(spec, make_config(overrides))
    await with_fallback.start()
    try:
        assert with_fallback.status.active == "onnxruntime" and with_fallback.status.degraded
        assert f"Triton at {url} is unreachable" in str(with_fallback.status.reason)
    finally:
        await with_fallback.close()

    overrides["engine"]["fallback"] = "none"
    without = InferenceService(spec, make_config(overrides))
    with pytest.raises(EngineUnavailable, match=f"Triton at {url} is unreachable"):
        await without.start()
    await without.close()


# -- metadata mismatch ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "triton_side", "onnx_side"),
    [
        (WRONG_NAME_MODEL, "input 'images' FP32 [-1,3,-1,-1]", "ONNX model input 'x'"),
        (
            WRONG_DIMS_MODEL,
            "input 'x' FP32 [-1,3,640,640]",
            "ONNX model input 'x' FP32 [-1,3,-1,-1]",
        ),
    ],
)
async def test_metadata_mismatch_stops_startup_naming_both_sides(
    triton: TritonProcess, spec: ModelSpec, model: str, triton_side: str, onnx_side: str
) -> None:
    # A fallback is configured: a mismatch must stop start-up anyway, not degrade.
    config: Config = make_config(
        triton_config(triton, fallback="onnxruntime", triton={"model_name": model})
    )
    with pytest.raises(EngineMismatch) as raised:
        async with running_server(config):
            pass
    message = str(raised.value)
    assert f"Triton model '{model}' {triton_side}" in message, message
    assert onnx_side in message, message
