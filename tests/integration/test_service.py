"""Service behaviour around the frames: readiness, metrics, a free event loop, slow clients,
degrading to the CPU engine, and the real command line."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import struct
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from edge_vision.common.aio import with_timeout
from edge_vision.model.spec import ModelSpec
from edge_vision.serve.app_keys import STARTUP

from ..support.clients import connect, frame_binary, recv, recv_type
from ..support.images import text_scene
from ..support.scrape import metric, metrics_text
from ..support.server import RunningServer, ServerProcess, make_config, running_server
from ..support.timing import T

JPG = text_scene(1280, 720).jpeg()


async def test_health_and_readiness_before_and_after_warm_up(spec: ModelSpec) -> None:
    # Many large warm-up shapes make warm-up take a while, so "before" is observable.
    shapes = [[1280, 1280 - 32 * i] for i in range(12)]
    cfg = make_config({"engine": {"warmup_shapes": shapes}, "model": {"input_size": 1280}})
    from aiohttp import web

    from edge_vision.serve.server import create_app

    app = await asyncio.to_thread(create_app, cfg, spec)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/healthz") as r:
                assert r.status == 200
            async with s.get(url + "/readyz") as r:
                assert r.status == 503
            async with s.get(url + "/ws") as r:
                assert r.status == 503 and "warming up" in await r.text()
            await with_timeout(asyncio.shield(app[STARTUP]), T(120))
            async with s.get(url + "/readyz") as r:
                body = await r.json()
                assert r.status == 200 and body["ready"] is True
                assert body["engine"]["active"] == "onnxruntime"
                assert body["engine"]["head"] == "dbnet"
    finally:
        await runner.cleanup()


async def test_metrics_count_what_clients_saw(server: RunningServer) -> None:
    async with aiohttp.ClientSession() as s:
        ws, _ = await connect(s, server.ws_url + "?mode=every")
        for i in range(3):
            await ws.send_bytes(frame_binary(i, 0.0, JPG))
        await ws.send_str("{oops")
        results = [await recv(ws) for _ in range(4)]
        async with s.get(server.url + "/metrics") as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
        await ws.close()
    assert sorted(m["type"] for m in results) == ["error", "result", "result", "result"]
    assert "edge_vision_frames_received_total 4.0" in text  # the broken message counts too
    assert "edge_vision_frames_answered_total 3.0" in text
    assert 'edge_vision_frames_rejected_total{code="bad_json"} 1.0' in text
    assert "edge_vision_connections 1.0" in text
    for stage in ("decode", "queue", "infer", "post", "server"):
        assert f'edge_vision_stage_seconds_count{{stage="{stage}"}} 3.0' in text
    assert "edge_vision_batch_size_count" in text
    assert 'edge_vision_engine_active{kind="onnxruntime"} 1.0' in text


async def test_hello_arrives_within_100_ms_while_the_engine_is_busy(
    server: RunningServer,
) -> None:
    big = text_scene(1920, 1080).jpeg()
    async with aiohttp.ClientSession() as s:
        busy, _ = await connect(s, server.ws_url + "?mode=every")
        for i in range(12):  # seconds of engine work queued up
            await busy.send_bytes(frame_binary(i, 0.0, big))
        await recv_type(busy, "result")  # the engine is certainly busy now
        delays = []
        for _ in range(3):
            t0 = time.perf_counter()
            ws = await s.ws_connect(server.ws_url)
            hello = orjson.loads((await ws.receive(timeout=T(5))).data)
            delays.append(time.perf_counter() - t0)
            assert hello["type"] == "hello"
            await ws.send_str('{"type":"ping","payload":1}')
            assert (await recv_type(ws, "pong"))["payload"] == 1
            await ws.close()
        await busy.close()
    assert max(delays) < 0.1 * max(1.0, T(1)), f"hello took {delays}"


def _raw_ws_handshake(port: int) -> socket.socket:
    """A client that performs the WebSocket handshake and then never reads again."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    return sock


def _masked_text_frame(payload: bytes) -> bytes:
    """RFC 6455 section 5.2: client frames are masked (all-zero mask keeps it simple)."""
    n = len(payload)
    if n < 126:
        head = struct.pack(">BB", 0x81, 0x80 | n)
    elif n < 65536:
        head = struct.pack(">BBH", 0x81, 0x80 | 126, n)
    else:
        head = struct.pack(">BBQ", 0x81, 0x80 | 127, n)
    return head + b"\x00\x00\x00\x00" + payload


async def test_a_client_that_never_reads_is_closed_and_costs_nobody_frames(
    server_factory: Any,
) -> None:
    srv = await server_factory({"server": {"send_timeout_s": 1.0}})
    sock = await asyncio.to_thread(_raw_ws_handshake, srv.port)
    # Pings echo their payload: a few big ones fill every buffer between us and it.
    ping = _masked_text_frame(orjson.dumps({"type": "ping", "payload": "x" * 1_000_000}))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    for _ in range(8):
        await loop.sock_sendall(sock, ping)
    async with aiohttp.ClientSession() as s:
        ws, _ = await connect(s, srv.ws_url + "?mode=every")
        for i in range(5):
            await ws.send_bytes(frame_binary(i, 0.0, JPG))
        ids = [(await recv_type(ws, "result"))["id"] for _ in range(5)]
        deadline = time.monotonic() + T(20)
        text = ""
        while time.monotonic() < deadline:
            text = await metrics_text(s, srv.url)
            if 'reason="slow_client"' in text:
                break
            await asyncio.sleep(0.2)
        await ws.close()
    sock.close()
    assert ids == list(range(5))
    assert 'edge_vision_connections_closed_total{reason="slow_client"} 1.0' in text


async def test_a_missing_gpu_engine_degrades_to_the_cpu_engine_and_says_so(
    spec: ModelSpec,
) -> None:
    # TensorRT cannot exist on this machine, so asking for it is a real start-up failure.
    cfg = make_config({"engine": {"kind": "tensorrt", "retry_primary_s": 0}})
    async with running_server(cfg, spec) as srv, aiohttp.ClientSession() as s:
        async with s.get(srv.url + "/readyz") as r:
            body = await r.json()
        ws, hello = await connect(s, srv.ws_url)
        await ws.send_bytes(frame_binary(1, 1.0, JPG))
        res = await recv_type(ws, "result")
        await ws.close()
        async with s.get(srv.url + "/metrics") as r:
            metrics = await r.text()
    assert r.status == 200 and body["ready"] is True
    assert body["engine"]["configured"] == "tensorrt"
    assert body["engine"]["active"] == "onnxruntime" and body["engine"]["degraded"] is True
    assert "tensorrt" in body["engine"]["reason"]
    assert hello["engine"]["degraded"] is True
    assert res["detections"]
    assert "edge_vision_engine_degraded 1.0" in metrics


async def test_the_real_command_serves_and_shuts_down_cleanly_on_sigterm(tmp_path: Path) -> None:
    proc = await asyncio.to_thread(ServerProcess(log_path=tmp_path / "serve.log").start)
    try:
        await proc.wait_ready()
        async with aiohttp.ClientSession() as s:
            ws, hello = await connect(s, proc.ws_url)
            await ws.send_bytes(frame_binary(1, 1.0, JPG))
            assert (await recv_type(ws, "result"))["detections"]
            proc.signal(signal.SIGTERM)
            closing = await recv_type(ws, "closing")
            msg = await ws.receive(timeout=T(10))
        assert closing["resume_token"] == hello["resume_token"]
        assert msg.type is aiohttp.WSMsgType.CLOSE and ws.close_code == 1001
        code = await asyncio.to_thread(proc.proc.wait, T(15))  # type: ignore[union-attr]
        assert code == 0
    finally:
        await asyncio.to_thread(proc.stop)


async def test_several_worker_processes_share_the_port_and_stop_together(tmp_path: Path) -> None:
    proc = ServerProcess("server.workers=2", log_path=tmp_path / "serve.log")
    await asyncio.to_thread(proc.start)
    try:
        # The first 200 from /readyz, whichever worker answers it, means the whole node is
        # ready: from then on no worker may turn a probe or a camera away as warming up.
        await proc.wait_ready()
        nodes = set()
        # A new TCP connection per request: the node picks a worker per connection.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            ready: set[str] = set()
            for _ in range(40):
                async with s.get(proc.url + "/readyz") as r:
                    body = await r.json()
                    assert r.status == 200, body
                    ready.add(body["node"])
            assert len(ready) == 2, f"40 probes reached only {ready}"
            for i in range(12):  # new connections are spread over both workers
                ws, hello = await connect(s, proc.ws_url)
                nodes.add(hello["node"])
                await ws.send_bytes(frame_binary(i, 0.0, JPG))
                assert (await recv_type(ws, "result"))["detections"]
                await ws.close()
                if len(nodes) == 2:
                    break
        assert len(nodes) == 2, f"all connections landed on {nodes}"
        proc.signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.proc.wait, T(20)) == 0  # type: ignore[union-attr]
    finally:
        await asyncio.to_thread(proc.stop)


async def test_worker_processes_get_the_same_number_of_cameras(tmp_path: Path) -> None:
    """server.worker_balance least-clients (the default): the main process hands each new
    connection to the worker with the fewest clients, so 8 cameras on 2 workers are 4 and
    4 (the kernel's SO_REUSEPORT hash put 2 on one worker and 8 on another of 12 on the
    H200), and when a worker's cameras leave, the next cameras go to it."""
    proc = ServerProcess("server.workers=2", log_path=tmp_path / "serve.log")
    await asyncio.to_thread(proc.start)
    try:
        await proc.wait_ready()
        async with aiohttp.ClientSession() as s:
            cams = [await connect(s, proc.ws_url) for _ in range(8)]
            by_node: dict[str, list[Any]] = {}
            for i, (ws, hello) in enumerate(cams):
                by_node.setdefault(hello["node"], []).append(ws)
                await ws.send_bytes(frame_binary(i, 0.0, JPG))
                assert (await recv_type(ws, "result"))["detections"]
            assert sorted(len(v) for v in by_node.values()) == [4, 4], by_node.keys()
            # Three cameras of one worker leave: after its next beat the next three new
            # cameras go to it, not to the worker that still has four.
            emptied, kept = sorted(by_node)
            for ws in by_node[emptied][:3]:
                await ws.close()
            await asyncio.sleep(T(2.5))  # a beat a second reports the clients left
            later = [await connect(s, proc.ws_url) for _ in range(3)]
            assert [hello["node"] for _, hello in later] == [emptied] * 3
            for ws, _ in later:
                await ws.close()
            for ws in by_node[emptied][3:] + by_node[kept]:
                await ws.close()
        log = await asyncio.to_thread((tmp_path / "serve.log").read_text, errors="replace")
        assert "connections go to the worker with the fewest clients" in log
    finally:
        await asyncio.to_thread(proc.stop)


@pytest.mark.parametrize("balance", ["least-clients", "reuse-port"])
async def test_workers_close_their_sessions_gracefully_when_every_process_gets_sigterm(
    tmp_path: Path, balance: str
) -> None:
    """A supervisor that signals every process of the node (systemd's default KillMode,
    `kill -TERM` to the group) gives each worker SIGTERM twice: its own and the one the
    main process forwards. The second must not cut the first's graceful close short:
    each camera still gets 'closing' and close code 1001, and the node exits 0."""
    proc = ServerProcess(
        "server.workers=2", f"server.worker_balance={balance}", log_path=tmp_path / "serve.log"
    )
    await asyncio.to_thread(proc.start)
    try:
        await proc.wait_ready()
        log = await asyncio.to_thread((tmp_path / "serve.log").read_text, errors="replace")
        pids = [int(p) for p in re.findall(r"w\d+ pid (\d+)", log)]
        assert len(pids) == 2, log
        async with aiohttp.ClientSession() as s:
            cams = [await connect(s, proc.ws_url) for _ in range(2)]
            if balance == "least-clients":  # one on each worker (the hash may differ)
                assert len({hello["node"] for _, hello in cams}) == 2
            for i, (ws, _) in enumerate(cams):
                await ws.send_bytes(frame_binary(i, 0.0, JPG))
                assert (await recv_type(ws, "result"))["detections"]
            for pid in pids:  # the group's signal and the forwarded one, back to back
                os.kill(pid, signal.SIGTERM)
                os.kill(pid, signal.SIGTERM)
            proc.signal(signal.SIGTERM)

            async def closed(ws: Any, hello: dict[str, Any]) -> None:  # each camera at once
                closing = await recv_type(ws, "closing")
                msg = await ws.receive(timeout=T(10))
                assert closing["resume_token"] == hello["resume_token"]
                assert msg.type is aiohttp.WSMsgType.CLOSE and ws.close_code == 1001

            await asyncio.gather(*(closed(ws, hello) for ws, hello in cams))
        code = await asyncio.to_thread(proc.proc.wait, T(20))  # type: ignore[union-attr]
        assert code == 0, proc.log()
    finally:
        await asyncio.to_thread(proc.stop)


async def test_an_idle_engine_is_kept_warm_without_client_frames(server_factory: Any) -> None:
    srv = await server_factory({"engine": {"keep_warm_idle_s": 0.5}})
    await asyncio.sleep(T(3))  # idle: no client sends anything
    async with aiohttp.ClientSession() as s:
        text = await metrics_text(s, srv.url)
    count = metric(text, "edge_vision_batch_size_count")
    assert count >= 1, "no keep-warm inference ran while the service sat idle"
    assert "edge_vision_frames_received_total 0.0" in text
