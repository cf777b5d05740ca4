"""The GPU process and its workers' hand-off, for real but in one process: a real
:class:`~edge_vision.gpu_process.process.GpuProcess` (the CPU stand-in: host decode, with
an engine that records its batches and can be held) on a real Unix socket, and workers'
real rings in /dev/shm, driven through the server's own session core and runner
(edge_vision.session.runner with the hand-off pipeline). What a user would notice: frames
of every worker run in one engine batch, a camera's older frame replaced while it waits is
never decoded and is counted dropped, replies come in the order sent, a cancelled or
orphaned frame goes, and a worker that vanishes costs the others nothing."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_vision.common.messages import FrameMessage
from edge_vision.common.settings import FrameSettings
from edge_vision.config import Config
from edge_vision.engines import Engine
from edge_vision.errors import ClientError
from edge_vision.frames.decode_batch import DecodeRequest, Prepared
from edge_vision.frames.infer import Superseded
from edge_vision.gpu_process.handoff import GpuProcessService, HandoffPipeline, worker_side
from edge_vision.gpu_process.process import GpuProcess
from edge_vision.gpu_process.ring import PREFIX, SHM_DIR
from edge_vision.model.spec import ModelSpec
from edge_vision.session.core import SessionCore
from edge_vision.session.runner import FrameCore, FrameTicket, SessionRunner

from ..support.images import text_scene
from ..support.server import make_config
from ..support.timing import T

pytestmark = pytest.mark.timeout(120)

JPEG = text_scene(320, 192).jpeg()
#: Probability 0.9 in DB's byte map (model/device_post.py: above the 0.3 threshold, 128 +
#: its place in the upper half).
BYTE_0_9 = 128 + round((0.9 - 0.3) * 127 / 0.7)
SETTINGS = FrameSettings(confidence=0.3)


class HeldEngine(Engine):
    """Stands in for the device engine: a zero probability map (no boxes), each batch's
    size recorded, and batches held while ``gate`` is closed (after warm-up)."""

    kind = "onnxruntime"

    def __init__(self, spec: ModelSpec, config: Config) -> None:
        super().__init__(spec, config)
        self.batches: list[int] = []
        self.held = 0  # batches waiting at the gate
        self.box: tuple[int, int, int, int] | None = None
        self.byte_map = False  # DB's byte map, as a GPU engine's device post answers
        self.gate = asyncio.Event()
        self.gate.set()

    async def start(self) -> None:
        pass

    async def infer(self, frames: Sequence[Any]) -> list[np.ndarray]:
        self.held += 1
        await self.gate.wait()
        self.held -= 1
        self.batches.append(len(frames))
        h, w = frames[0].shape[:2]
        out = np.zeros((len(frames), 1, h, w), np.uint8 if self.byte_map else np.float32)
        if self.box is not None:  # one "text line" a frame where the test asks
            y0, y1, x0, x1 = self.box
            out[:, :, y0:y1, x0:x1] = BYTE_0_9 if self.byte_map else 0.9
        return [out]

    async def close(self) -> None:
        pass


class _Flag(threading.Event):
    """An event whose changes wake the waiters of ``changed`` too."""

    def __init__(self, changed: threading.Condition) -> None:
        super().__init__()
        self._wake = changed

    def set(self) -> None:
        super().set()
        with self._wake:
            self._wake.notify_all()


class DecodeGate:
    """Holds the GPU process's host decodes while closed (but for the ones let through
    with :meth:`let`), and counts them."""

    def __init__(self, decode: Callable[[DecodeRequest], Prepared]) -> None:
        self._decode = decode
        self._changed = threading.Condition()
        self.open = _Flag(self._changed)
        self.open.set()
        self.decoded = 0
        self._permits = 0

    def let(self, n: int = 1) -> None:
        with self._changed:
            self._permits += n
            self._changed.notify_all()

    def __call__(self, request: DecodeRequest) -> Prepared:
        with self._changed:
            self._changed.wait_for(lambda: self.open.is_set() or self._permits > 0, T(30))
            if not self.open.is_set():
                self._permits -= 1
        self.decoded += 1
        return self._decode(request)


@dataclass
class Node:
    process: GpuProcess
    engine: HeldEngine
    gate: DecodeGate
    path: str
    config: Config
    spec: ModelSpec
    stack: AsyncExitStack
    workers: list[tuple[GpuProcessService, HandoffPipeline]] = field(default_factory=list)

    async def worker(self) -> tuple[GpuProcessService, HandoffPipeline]:
        index = len(self.workers)
        service, pipeline = await asyncio.to_thread(
            worker_side, self.config, self.spec, [self.path], "test-node", worker=index
        )

        async def close() -> None:
            await pipeline.close()
            await service.close()

        self.stack.push_async_callback(close)
        await asyncio.wait_for(service.start(), T(30))
        self.workers.append((service, pipeline))
        return service, pipeline


@asynccontextmanager
async def gpu_node(
    tmp_path: Path, spec: ModelSpec, *, overrides: dict[str, Any] | None = None
) -> AsyncIterator[Node]:
    """A GPU process (CPU stand-in, :class:`HeldEngine`) listening in ``tmp_path``."""
    config = make_config(
        {
            "engine": {"max_batch": 8, "in_flight": 1, "batch_window_ms": 1},
            "decode": {"workers": 2},
            "model": {"input_size": 320},
            **(overrides or {}),
        }
    )
    engines: list[HeldEngine] = []

    def factory(kind: str, spec: ModelSpec, cfg: Config) -> Engine:
        engines.append(HeldEngine(spec, cfg))
        return engines[-1]

    process = GpuProcess(config, stand_in=True, spec=spec, engine_factory=factory)
    gate = DecodeGate(process.pipeline.host_decoder.decode_one)
    process.pipeline.host_decoder.decode_one = gate
    path = str(tmp_path / "gpu.sock")
    stop = asyncio.Event()
    running = asyncio.create_task(process.run(path, None, stop))
    async with AsyncExitStack() as stack:
        for _ in range(int(T(300))):
            if process.service.status.ready:
                break
            await asyncio.sleep(0.1)
        node = Node(process, engines[0], gate, path, config, spec, stack)
        try:
            yield node
        finally:
            await stack.aclose()
            stop.set()
            await asyncio.wait_for(running, T(30))


def message(i: int) -> FrameMessage:
    return FrameMessage(i, None, JPEG, False, asyncio.get_running_loop().time())


async def hand_over(
    pipeline: HandoffPipeline, i: int, owner: object, key: object | None = None
) -> Any:
    frame = message(i)
    prepared = await pipeline.prepare(frame, SETTINGS, owner=owner)
    loop_now = asyncio.get_running_loop().time()
    return await pipeline.finish(
        frame, prepared, SETTINGS, loop_now, supersede_key=key, owner=owner
    )


async def until(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + T(timeout)
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("the condition did not come true")
        await asyncio.sleep(0.01)


def shm_names() -> list[str]:
    return [p.name for p in SHM_DIR.iterdir() if p.name.startswith(PREFIX)]


async def test_cpu_stand_in_runs_frames_of_every_worker_in_one_engine_batch(
    tmp_path: Path, spec: ModelSpec
) -> None:
    async with gpu_node(tmp_path, spec) as node:
        (_, w0), (_, w1) = await node.worker(), await node.worker()
        node.engine.gate.clear()  # the engine is busy: frames gather behind it
        first = asyncio.create_task(hand_over(w0, 0, "cam-a"))
        await until(lambda: node.engine.held == 1)
        later = [
            asyncio.create_task(hand_over(w, i, f"cam-{w is w0}-{i}"))
            for i in range(1, 4)
            for w in (w0, w1)
        ]
        await until(lambda: node.gate.decoded == 7)
        await asyncio.sleep(0.1)
        node.engine.gate.set()
        results = await asyncio.gather(first, *later)
    assert not any(isinstance(r, Superseded) for r in results)
    assert node.engine.batches[-2:] == [1, 6]  # the held frame, then both workers' six
    sizes = sorted(r.timing["batch_size"] for r in results)
    assert sizes == [1.0] + [6.0] * 6


@pytest.mark.parametrize("byte_map", [True, False], ids=["device_post_byte_map", "float_map"])
async def test_cpu_stand_in_workers_post_process_their_own_frames(
    tmp_path: Path, spec: ModelSpec, monkeypatch: pytest.MonkeyPatch, byte_map: bool
) -> None:
    """The GPU process answers the engine's outputs when they are the device post's (DB's
    byte map) and each worker finds the boxes in them on its own threads (one interpreter
    a GPU cannot post every camera of a node); outputs too large to ship (a float map)
    are post-processed in the GPU process. The same boxes either way."""
    async with gpu_node(tmp_path, spec) as node:
        node.engine.box = (60, 90, 40, 200)
        node.engine.byte_map = byte_map
        (_, w0), (_, w1) = await node.worker(), await node.worker()
        posted_there: list[int] = []
        own_post = node.process.pipeline._post_frame

        def counted(*args: Any, **kw: Any) -> Any:
            posted_there.append(1)
            return own_post(*args, **kw)

        monkeypatch.setattr(node.process.pipeline, "_post_frame", counted)
        handed = [hand_over(w, i, f"c{i}") for i in range(3) for w in (w0, w1)]
        results = await asyncio.gather(*handed)
        assert len(posted_there) == (0 if byte_map else len(handed))
        lb = w0.request_for(message(0), None).letterbox
        h, w = lb.out_h, lb.out_w
        outputs = [np.zeros((1, h, w), np.uint8 if byte_map else np.float32)]
        outputs[0][:, 60:90, 40:200] = BYTE_0_9 if byte_map else 0.9
        want = own_post(outputs, lb=lb, settings=SETTINGS, quads=False)[0]
    assert len(want) == 1  # the line is found, and every worker found the same box
    for r in results:
        np.testing.assert_allclose(r.detections, want, atol=1e-4)


async def test_cpu_stand_in_drops_a_replaced_frame_before_its_decode_and_the_books_hold(
    tmp_path: Path, spec: ModelSpec
) -> None:
    async with gpu_node(tmp_path, spec) as node:
        node.process.capacity = 1  # one frame decoding at a time: the rest wait in the queue
        _, pipeline = await node.worker()
        sent: list[FrameTicket] = []

        async def send(ticket: FrameTicket) -> None:
            sent.append(ticket)

        core: FrameCore = SessionCore("latest", latest_in_flight=3)
        runner = SessionRunner(core, pipeline, settings=lambda: SETTINGS, send=send)
        runner.start()
        node.gate.open.clear()  # frame 0 decoding, held
        node.engine.gate.clear()  # and then held in the engine, so nothing replaces it
        for i in range(6):
            await runner.admit(message(i))
            await asyncio.sleep(0.05)  # each reaches the GPU process before the next
        node.gate.let(1)  # frame 0 decodes and goes into the engine
        await until(lambda: node.engine.held == 1)
        node.gate.open.set()  # then the newest, which waited in the queue
        node.engine.gate.set()
        await asyncio.wait_for(runner.wait_idle(), T(30))
        await runner.close()
    books = core.books
    answered = [t.frame.id for t in sent]
    assert answered == [0, 5]  # the frame held first, and the newest: the last is answered
    assert books.received == 6 and books.answered == 2 and books.dropped == 4
    assert node.gate.decoded == 2  # the four dropped were never decoded
    assert node.process.counts["superseded"] >= 1  # some in the GPU process's queue


async def test_cpu_stand_in_every_mode_replies_in_the_order_sent(
    tmp_path: Path, spec: ModelSpec
) -> None:
    async with gpu_node(tmp_path, spec) as node:
        workers = [await node.worker(), await node.worker()]
        sent: dict[int, list[Any]] = {0: [], 1: []}
        runners = []
        for w, (_, pipeline) in enumerate(workers):

            async def send(ticket: FrameTicket, w: int = w) -> None:
                sent[w].append(ticket.reply)

            core: FrameCore = SessionCore("every", every_in_flight=3, every_queue=16)
            runner = SessionRunner(core, pipeline, settings=lambda: SETTINGS, send=send)
            runner.start()
            runners.append(runner)
        for i in range(12):
            for runner in runners:
                await runner.admit(message(i))
        for runner in runners:
            await asyncio.wait_for(runner.wait_idle(), T(60))
            await runner.close()
    for w in (0, 1):
        assert [r.frame.id for r in sent[w]] == list(range(12))
        assert all(r.width == 320 and r.height == 192 for r in sent[w])
    assert max(node.engine.batches) > 1  # the two sessions' frames shared batches


async def test_cpu_stand_in_a_vanished_worker_costs_the_others_nothing(
    tmp_path: Path, spec: ModelSpec
) -> None:
    async with gpu_node(tmp_path, spec) as node:
        node.process.capacity = 1
        (gone_service, gone), (_, stays) = await node.worker(), await node.worker()
        node.gate.open.clear()
        held = asyncio.create_task(hand_over(stays, 0, "cam-stays"))
        await until(lambda: node.process.decoding == 1)
        orphans = [asyncio.create_task(hand_over(gone, i, f"cam-gone-{i}")) for i in range(4)]
        await until(lambda: len(node.process.queue) == 4)
        after = asyncio.create_task(hand_over(stays, 1, "cam-stays-2"))
        await until(lambda: len(node.process.queue) == 5)
        # The worker dies: its connection to the GPU process closes mid-stream.
        link = gone_service.links[0]
        assert link._writer is not None
        link._writer.transport.abort()
        await until(lambda: node.process.counts["orphaned"] == 4)
        node.gate.open.set()
        kept = await asyncio.wait_for(asyncio.gather(held, after), T(30))
        lost = await asyncio.gather(*orphans, return_exceptions=True)
        assert node.process.status()["ready"] and len(node.process.workers) == 1
    assert [r.frame.id for r in kept] == [0, 1]
    assert all(type(e).__name__ == "EngineUnavailable" for e in lost)  # reported, not lost
    assert node.gate.decoded == 2  # the orphans were never decoded
    assert not await asyncio.to_thread(shm_names)


async def test_cpu_stand_in_a_closed_session_cancels_its_waiting_frame(
    tmp_path: Path, spec: ModelSpec
) -> None:
    async with gpu_node(tmp_path, spec) as node:
        node.process.capacity = 1
        service, pipeline = await node.worker()
        node.gate.open.clear()
        first = asyncio.create_task(hand_over(pipeline, 0, "a"))
        await until(lambda: node.process.decoding == 1)
        waiting = asyncio.create_task(hand_over(pipeline, 1, "b"))
        await until(lambda: len(node.process.queue) == 1)
        waiting.cancel()  # its session closed
        await until(lambda: node.process.counts["cancelled"] == 1)
        await until(lambda: service.in_flight == 1)  # its record is free again
        node.gate.open.set()
        await asyncio.wait_for(first, T(30))
    assert node.gate.decoded == 1
    assert service.in_flight == 0


async def test_cpu_stand_in_full_ring_tells_a_latest_sender_at_once_and_holds_every_frames(
    tmp_path: Path, spec: ModelSpec
) -> None:
    # A 64 KiB ring (4 x a 16 KiB message limit): five frames of ~11 KB fill it.
    server = {"max_message_bytes": 16384, "memory_wait_s": T(10)}
    async with gpu_node(tmp_path, spec, overrides={"server": server}) as node:
        node.process.capacity = 1
        service, pipeline = await node.worker()
        node.gate.open.clear()  # nothing is answered: the ring fills up
        waiting = []
        while True:
            waiting.append(asyncio.create_task(hand_over(pipeline, len(waiting), len(waiting))))
            await asyncio.sleep(0.02)
            if service.ring.put(JPEG, -1) is None:  # one more would not fit either
                break
            service.ring.free(service.ring._live[-1].record)
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(ClientError) as refused:  # latest: the sender is told at once
            await hand_over(pipeline, 99, "cam-latest", key="cam-latest")
        assert refused.value.code == "over_memory_budget" and "hand-off" in refused.value.message
        assert asyncio.get_running_loop().time() - t0 < T(0.5)
        held = asyncio.create_task(hand_over(pipeline, 100, "cam-every"))  # every: waits
        await asyncio.sleep(0.3)
        assert not held.done()
        node.gate.open.set()  # answers come, records free, the every frame goes in
        done = await asyncio.wait_for(asyncio.gather(held, *waiting), T(30))
    assert [r.frame.id for r in done] == [100, *range(len(waiting))]


def test_worker_rings_leave_nothing_in_dev_shm() -> None:
    # Guard for the tests above: the names are unlinked the moment a ring is made.
    assert os.path.isdir(SHM_DIR) and not shm_names()
