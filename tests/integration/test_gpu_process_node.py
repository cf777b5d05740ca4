"""A node with ``server.gpu_process: on`` as a user runs it (``edge-vision serve``, two
workers, the GPU process as its CPU stand-in: ONNX Runtime and host decode in the same
process shell) and real WebSocket clients over TCP: the same detections as the per-worker
path, and the faults. The GPU process killed (SIGKILL) mid-stream: connections stay open,
every frame sent is answered or reported (an ``engine_unavailable`` error, or counted
dropped in latest mode), /readyz, the metrics and the systemd status say so, and the node
serves again within its warm start; hung (SIGSTOP), it is killed and restarted; a worker
killed stops the node as before, and no process or /dev/shm name outlives it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from edge_vision.common.aio import with_timeout
from edge_vision.common.messages import FrameMessage
from edge_vision.common.settings import FrameSettings
from edge_vision.gpu_process.handoff import worker_side
from edge_vision.gpu_process.ring import PREFIX, SHM_DIR
from edge_vision.gpu_process.supervisor import HANG_AFTER_S, GpuProcessSupervisor
from edge_vision.model.spec import load_model_spec

from ..support.clients import connect, frame_binary
from ..support.images import text_scene
from ..support.scrape import metric, metrics_text
from ..support.server import ServerProcess, free_port, make_config, running_server
from ..support.timing import T
from .test_systemd import NotifySocket, worker_pids

pytestmark = pytest.mark.timeout(300)

JPEG = text_scene(320, 192).jpeg()
#: The node is back within its warm start (issue 34: 20 s on the GPU).
WARM_START_S = 20.0
SETS = ("server.gpu_process=on", "model.input_size=320", "engine.max_batch=4")


def shm_names() -> list[str]:
    return [p.name for p in SHM_DIR.iterdir() if p.name.startswith(PREFIX)]


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    folder = Path(f"/tmp/ev-gp-{os.getpid()}")
    folder.mkdir(exist_ok=True)
    sock = NotifySocket(str(folder))
    try:
        yield sock
    finally:
        sock.close()
        Path(sock.path).unlink(missing_ok=True)
        folder.rmdir()


def start_node(tmp_path: Path, *settings: str, env: dict[str, str] | None = None) -> ServerProcess:
    server = ServerProcess(
        "server.workers=2",
        *SETS,
        *settings,
        port=free_port(),
        env=env,
        log_path=tmp_path / "serve.log",
    )
    return server.start()


async def readyz(http: aiohttp.ClientSession, server: ServerProcess) -> tuple[int, Any]:
    async with http.get(server.url + "/readyz") as r:
        return r.status, await r.json()


@dataclass
class Camera:
    """One client over TCP: what it sent and every reply, by frame id."""

    mode: str
    sent: list[int] = field(default_factory=list)
    replies: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    closed: int | None = None  # a close code the server sent, if any
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def results(self) -> list[dict[str, Any]]:
        return [r for rs in self.replies.values() for r in rs if r["type"] == "result"]

    def errors(self) -> list[dict[str, Any]]:
        return [r for rs in self.replies.values() for r in rs if r["type"] == "error"]


async def until(changed: asyncio.Event, done: Callable[[], bool]) -> None:
    while not done():
        changed.clear()
        await changed.wait()


async def stream(
    http: aiohttp.ClientSession, url: str, cam: Camera, fps: float, stop: asyncio.Event
) -> None:
    ws, _hello = await connect(http, f"{url}?mode={cam.mode}")

    async def read() -> None:
        async for msg in ws:
            if msg.type is aiohttp.WSMsgType.TEXT:
                reply = json.loads(msg.data)
                if reply["type"] in ("result", "error"):
                    cam.replies.setdefault(reply["id"], []).append(reply)
                    cam.changed.set()

    reader = asyncio.create_task(read())
    i = 0
    while not stop.is_set():
        await ws.send_bytes(frame_binary(i, None, JPEG))
        cam.sent.append(i)
        i += 1
        await asyncio.sleep(1 / fps)

    # The last frame is always answered: wait for it (every mode: for all of them).
    def answered() -> bool:
        every = cam.mode != "every" or len(cam.replies) >= len(cam.sent)
        return cam.sent[-1] in cam.replies and every

    with contextlib.suppress(TimeoutError):  # the assertions say what is missing
        await with_timeout(until(cam.changed, answered), T(60))
    cam.closed = ws.close_code
    reader.cancel()
    await ws.close()


async def test_cpu_stand_in_answers_as_the_per_worker_path_does(tmp_path: Path) -> None:
    frames = [text_scene(320, 192, seed=s).jpeg() for s in range(3)]
    answers: dict[str, list[Any]] = {}
    node = await asyncio.to_thread(start_node, tmp_path)
    try:
        await node.wait_ready(120)
        per_worker = make_config({"model": {"input_size": 320}, "engine": {"max_batch": 4}})
        spec = await asyncio.to_thread(load_model_spec, per_worker.model)
        async with running_server(per_worker, spec) as alone, aiohttp.ClientSession() as http:
            for name, url in (("gpu_process", node.ws_url), ("per_worker", alone.ws_url)):
                ws, hello = await connect(http, url + "?mode=every")
                if name == "gpu_process":
                    assert hello["engine"]["gpu_process"][0]["stand_in"] is True
                for i, jpeg in enumerate(frames):
                    await ws.send_bytes(frame_binary(i, None, jpeg))
                got: list[dict[str, Any]] = []
                while len(got) < len(frames):
                    reply = json.loads((await ws.receive(timeout=T(60))).data)
                    assert reply["type"] == "result", reply
                    got.append(reply)
                answers[name] = [(r["id"], r["width"], r["detections"]) for r in got]
                await ws.close()
    finally:
        await asyncio.to_thread(node.stop)
    assert answers["gpu_process"] == answers["per_worker"]
    assert sum(len(d) for _, _, d in answers["per_worker"]) >= 3  # frames with text in them


async def test_cpu_stand_in_killed_mid_stream_every_frame_answered_or_reported_node_back(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    env = {"NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": "1000000"}
    node = await asyncio.to_thread(start_node, tmp_path, env=env)
    cams = [Camera(m) for m in ("every", "latest", "every", "latest")]
    stop = asyncio.Event()
    try:
        await node.wait_ready(120)
        async with aiohttp.ClientSession() as http:
            _, before = await readyz(http, node)
            victim = before["engine"]["gpu_process"][0]["pid"]
            streams = [asyncio.create_task(stream(http, node.ws_url, c, 6, stop)) for c in cams]
            await asyncio.sleep(T(4))
            assert not await asyncio.to_thread(shm_names)  # held, never named
            sent_before_kill = sum(len(c.sent) for c in cams)
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            seen_down: list[Any] = []
            while True:  # /readyz says why meanwhile, then ready again
                status, body = await readyz(http, node)
                if status != 200:
                    seen_down.append(body)
                elif seen_down:
                    break
                assert time.monotonic() - killed < T(WARM_START_S), node.log()
                await asyncio.sleep(0.05)
            back_after = time.monotonic() - killed
            await asyncio.sleep(T(4))  # serving again, on the same connections
            stop.set()
            await asyncio.gather(*streams)
            _, after = await readyz(http, node)
            text = await metrics_text(http, node.url)
    finally:
        stop.set()
        await asyncio.to_thread(node.stop)
    assert back_after < T(WARM_START_S)
    assert any("GPU process" in (b.get("engine_problem") or "") for b in seen_down), seen_down
    gpu = after["engine"]["gpu_process"][0]
    assert gpu["pid"] != victim and gpu["state"] == "ready"
    assert metric(text, "edge_vision_gpu_process_losses_total") >= 1
    assert metric(text, "edge_vision_gpu_process_up") == 1
    assert any("GPU process" in s for s in notify_socket.statuses()), notify_socket.statuses()
    assert sum(len(c.sent) for c in cams) > sent_before_kill
    for cam in cams:
        assert cam.closed is None  # the connection stayed open throughout
        assert all(len(r) == 1 for r in cam.replies.values())  # never answered twice
        codes = {e["code"] for e in cam.errors()}
        assert codes <= {"engine_unavailable"}, codes
        late = [r for r in cam.results() if r["id"] > cam.sent[-1] - 6]
        assert late, "no result after the restart"
        if cam.mode == "every":  # every frame answered or reported, none lost
            assert sorted(cam.replies) == cam.sent
        else:  # answered, reported, or counted dropped: the books hold
            last = cam.replies[cam.sent[-1]][0]
            assert last["type"] == "result"
            assert len(cam.replies) + last["dropped"] == len(cam.sent)
    assert not await asyncio.to_thread(shm_names)


def test_cpu_stand_in_hung_is_killed_and_restarted(tmp_path: Path) -> None:
    node = start_node(tmp_path, "server.workers=1")
    try:
        asyncio.run(node.wait_ready(120))
        pid = _gpu_pid(node)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # its event loop stops: no more heartbeats
        deadline = time.monotonic() + T(HANG_AFTER_S + WARM_START_S)
        while time.monotonic() < deadline:
            new = _gpu_pid(node, ready_only=True)
            if new not in (None, pid):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"not restarted: {node.log()}")
        assert not _alive(pid)  # the hung one was killed, not left stopped
        assert "sent no heartbeat" in node.log()
    finally:
        node.stop()


def test_a_killed_worker_stops_the_node_and_nothing_outlives_it(tmp_path: Path) -> None:
    node = start_node(tmp_path)
    try:
        asyncio.run(node.wait_ready(120))
        assert node.proc is not None
        gpu = _gpu_pid(node)
        workers = [p for p in worker_pids(node.proc.pid) if p != gpu]
        assert len(workers) == 2 and gpu is not None
        os.kill(workers[0], signal.SIGKILL)
        node.proc.wait(T(60))  # as ever, a dead worker stops the node for systemd to restart
        deadline = time.monotonic() + T(30)
        while _alive(gpu) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(gpu), "the GPU process outlived its node"
        assert not shm_names()
    finally:
        node.stop()


async def test_cpu_stand_in_two_gpu_processes_share_the_cameras_and_one_lost_spares_the_other(
    tmp_path: Path,
) -> None:
    """A host with two GPUs, stood in for: two GPU processes under the supervisor, one
    worker's sessions spread over them, and one of them killed mid-stream: its session's
    frame in flight is reported, the other's is answered, and it comes back."""
    config = make_config({"model": {"input_size": 320}, "engine": {"max_batch": 4}})
    supervisor = await asyncio.to_thread(
        GpuProcessSupervisor, config, "two-gpus", count=2, stand_in=True
    )
    await asyncio.to_thread(supervisor.start)
    service, pipeline = await asyncio.to_thread(
        worker_side,
        config,
        await asyncio.to_thread(load_model_spec, config.model),
        supervisor.paths,
        "two-gpus",
    )
    settings = FrameSettings(0.3)

    async def one(i: int, owner: object) -> Any:
        frame = FrameMessage(i, None, JPEG, False, time.perf_counter())
        prepared = await pipeline.prepare(frame, settings, owner=owner)
        return await pipeline.finish(frame, prepared, settings, time.perf_counter(), owner=owner)

    try:
        await with_timeout(service.start(), T(120))
        await with_timeout(
            until(service.changed, lambda: all(ln.ready for ln in service.links)), T(60)
        )
        owners = [object() for _ in range(4)]
        first = await asyncio.gather(*(one(i, o) for i, o in enumerate(owners)))
        assert all(r.width == 320 for r in first)
        pids = [ln.status["pid"] for ln in service.links]
        assert len(set(pids)) == 2
        assert all(ln.connections == 1 for ln in service.links)
        a, b = object(), object()
        frames = [asyncio.create_task(one(10, a)), asyncio.create_task(one(11, b))]
        await asyncio.sleep(0)  # both submitted, one to each (pick_link: the fewest in flight)
        assert [ln.in_flight for ln in service.links] == [1, 1]
        os.kill(pids[0], signal.SIGKILL)
        got = await asyncio.gather(*frames, return_exceptions=True)
        assert type(got[0]).__name__ == "EngineUnavailable" and got[1].width == 320
        await with_timeout(until(service.changed, lambda: service.links[0].ready), T(WARM_START_S))
        assert service.links[0].status["pid"] != pids[0] and service.links[0].losses == 1
        assert (await one(12, object())).width == 320
    finally:
        await pipeline.close()
        await service.close()
        await asyncio.to_thread(supervisor.stop)
    assert not await asyncio.to_thread(shm_names)


def _gpu_pid(node: ServerProcess, ready_only: bool = False) -> int | None:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(node.url + "/readyz", timeout=T(10)) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
    except OSError:
        return None
    if ready_only and not body.get("ready"):
        return None
    found = (body.get("engine") or {}).get("gpu_process") or [{}]
    pid = found[0].get("pid")
    return int(pid) if pid else None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
