"""Connection state as a user of the service sees it: real servers, real redis-server,
real WebSocket clients, real frames (docs/state.md, docs/protocol.md "Connecting").

* what lands in Redis, under the documented keys and TTLs, matches what the client saw;
* a clean close (1000) deletes the session, any other disconnect keeps it resumable;
* resume with the token, on the same node or another: same id, settings and counters;
* the admin API shows every node's sessions; the admin token guards it;
* Redis killed mid-stream: frames keep flowing, nothing is lost from the accounting,
  /readyz stays ready, and state is rewritten once Redis is back;
* SIGTERM hands sessions over (1001 + resume token) and removes the node's keys;
  SIGKILL leaves keys that vanish by TTL.

Convergence times after each fault are printed (run with ``-s``) and recorded as test
properties; docs/state.md quotes them.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from edge_vision.config import ModelConfig, StateConfig
from edge_vision.model.spec import ModelSpec, load_model_spec
from edge_vision.session.record import new_session
from edge_vision.state import StateKeeper, create_store
from edge_vision.state import keeper as keeper_module

from ..support.clients import connect, frame_binary, recv, recv_type
from ..support.cluster import get_json, node_process, wait_until
from ..support.images import text_scene
from ..support.redis_server import RedisServer, key_gone, raw_client
from ..support.scrape import metric, metrics_text
from ..support.server import RunningServer
from ..support.timing import T

JPG = text_scene(320, 240, texts=[("LOT 42", (40, 100))], font_size=40).jpeg()
AGENT = "state-test/1.0"
HEARTBEAT_S = 0.3
NODE_TTL_S = 2.0
SESSION_TTL_S = 30.0

Factory = Callable[..., Awaitable[RunningServer]]


@pytest.fixture(scope="module")
def small_spec() -> ModelSpec:
    """The default model at a 320-pixel input: quick on two shared CPU cores."""
    return load_model_spec(ModelConfig(input_size=320))


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[Any]:
    async with raw_client(redis_server.url) as client:
        yield client


def overrides(
    redis_url: str | None, node_id: str, admin_token: str | None = None, **state: Any
) -> dict[str, Any]:
    st: dict[str, Any] = {
        "node_id": node_id,
        "heartbeat_s": HEARTBEAT_S,
        "node_ttl_s": NODE_TTL_S,
        "session_ttl_s": SESSION_TTL_S,
        "op_timeout_s": 0.5,
        **state,
    }
    if redis_url:
        st["redis_url"] = redis_url
    return {
        "state": st,
        "server": {"admin_token": admin_token},
        "engine": {
            "onnxruntime": {"threads": 1},
            "warmup_shapes": [(256, 320)],
            "batch_window_ms": 0,
            "keep_warm_idle_s": 0,
        },
        "model": {"input_size": 320},
    }


async def start(
    factory: Factory, spec: ModelSpec, redis_url: str | None, node_id: str, **kw: Any
) -> RunningServer:
    srv: RunningServer = await factory(overrides(redis_url, node_id, **kw), spec)
    return srv


class Client:
    """One camera: what it sent and what it was told."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, hello: dict[str, Any]) -> None:
        self.ws = ws
        self.hello = hello
        self.sent = 0
        self.results: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []

    @property
    def token(self) -> str:
        return str(self.hello["resume_token"])

    @property
    def dropped(self) -> int:
        return int(self.results[-1]["dropped"]) if self.results else 0

    async def frame(self, image: bytes = JPG) -> None:
        self.sent += 1
        await self.ws.send_bytes(frame_binary(self.sent, time.time() * 1000, image))

    async def answer(self) -> dict[str, Any]:
        msg = await recv(self.ws)
        if msg["type"] == "result":
            self.results.append(msg)
        elif msg["type"] == "error":
            self.errors.append(msg)
        return msg

    async def frames(self, n: int) -> None:
        """Send ``n`` frames one after another, each after the previous one's answer."""
        for _ in range(n):
            await self.frame()
            assert (await self.answer())["type"] == "result"

    async def settings(self, **values: Any) -> dict[str, Any]:
        await self.ws.send_str(orjson.dumps({"type": "settings", **values}).decode())
        return await recv_type(self.ws, "settings")


async def open_client(
    http: aiohttp.ClientSession, url: str, token: str | None = None, **params: str
) -> Client:
    if token:
        params["resume"] = token
    ws, hello = await connect(http, url, params=params, headers={"User-Agent": AGENT})
    return Client(ws, hello)


async def session_in_redis(raw: Any, sid: str, **expected: str) -> dict[str, str] | None:
    rec: dict[str, str] = await raw.hgetall(f"ev:session:{sid}")
    if rec and all(rec.get(k) == v for k, v in expected.items()):
        return rec
    return None


def counters_of(c: Client) -> dict[str, str]:
    """What the client saw, in the shape Redis holds it."""
    return {
        "received": str(c.sent),
        "answered": str(len(c.results)),
        "dropped": str(c.dropped),
        "rejected": str(len(c.errors)),
    }


def report(record_property: Callable[[str, object], None], name: str, seconds: float) -> None:
    record_property(name, round(seconds, 3))
    print(f"\nCONVERGENCE {name} = {seconds:.2f} s")


# -- what Redis holds ------------------------------------------------------------------


@pytest.mark.redis
async def test_redis_holds_node_and_session_with_documented_keys_ttls_and_counters(
    redis_server: RedisServer, raw: Any, server_factory: Factory, small_spec: ModelSpec
) -> None:
    srv = await start(server_factory, small_spec, redis_server.url, "node-a")
    async with aiohttp.ClientSession() as http:
        c = await open_client(http, srv.ws_url)
        sid = c.hello["session_id"]
        await c.settings(confidence=0.3, classes=[0])
        await c.frames(4)
        await c.ws.send_str('{"type":"frame","id":"bad","image":"%%% not base64 %%%"}')
        c.sent += 1
        assert (await c.answer())["code"] == "bad_base64"

        rec, _ = await wait_until(
            lambda: session_in_redis(raw, sid, **counters_of(c)), 10, "counters in Redis"
        )
        assert counters_of(c) == {"received": "5", "answered": "4", "dropped": "0", "rejected": "1"}
        assert rec["node"] == "node-a" and rec["connected"] == "1" and rec["epoch"] == "1"
        assert (rec["mode"], float(rec["confidence"]), rec["classes"]) == ("latest", 0.3, "[0]")
        assert rec["client"] == "127.0.0.1" and rec["user_agent"] == AGENT
        assert float(rec["connected_at"]) <= float(rec["last_seen"])
        # Only the resume secret's hash is stored (schema 2): reading Redis resumes nothing.
        secret = c.token.split(".", 1)[1]
        assert "secret" not in rec and rec["schema"] == "2"
        assert rec["secret_sha256"] == hashlib.sha256(secret.encode()).hexdigest()
        assert all(secret not in v for v in rec.values())

        node = await raw.hgetall("ev:node:node-a")
        assert node["id"] == "node-a" and node["model"] == "PP-OCRv6_det_small"
        assert node["engine"] == "onnxruntime" and node["connections"] == "1"
        assert float(node["started"]) <= float(node["heartbeat"]) <= time.time()
        assert await raw.smembers("ev:node:node-a:sessions") == {sid}
        assert 0 < await raw.pttl("ev:node:node-a") <= NODE_TTL_S * 1000
        assert 0 < await raw.pttl("ev:node:node-a:sessions") <= NODE_TTL_S * 1000
        assert (
            (SESSION_TTL_S - 5) * 1000
            < await raw.pttl(f"ev:session:{sid}")
            <= (SESSION_TTL_S * 1000)
        )

        await c.ws.close()  # 1000: the session ends
        await wait_until(
            lambda: key_gone(raw, f"ev:session:{sid}"), 5, "session key deleted after close 1000"
        )
        assert await raw.smembers("ev:node:node-a:sessions") == set()
        assert await raw.exists("ev:node:node-a") == 1


# -- resume ----------------------------------------------------------------------------


@pytest.mark.redis
async def test_resume_after_a_dropped_connection_restores_id_settings_and_counters(
    redis_server: RedisServer, raw: Any, server_factory: Factory, small_spec: ModelSpec
) -> None:
    srv = await start(server_factory, small_spec, redis_server.url, "node-a")
    async with aiohttp.ClientSession() as http:
        c = await open_client(http, srv.ws_url, mode="every")
        sid = c.hello["session_id"]
        await c.settings(confidence=0.25, classes=[0])
        await c.frames(3)
        seen = counters_of(c)
        await c.ws.close(code=4000)  # not 1000: a network drop, a reload, a crash
        rec, _ = await wait_until(
            lambda: session_in_redis(raw, sid, connected="0"), 5, "session released"
        )
        assert {k: rec[k] for k in seen} == seen
        assert await raw.smembers("ev:node:node-a:sessions") == set()

        again = await open_client(http, srv.ws_url, token=c.token)
        h = again.hello
        assert h["resumed"] is True and h["session_id"] == sid
        # Since protocol 3 a resume rotates the token (test_resume_rotation.py).
        assert h["resume_token"].startswith(f"{sid}.") and h["resume_token"] != c.token
        # (protocol 2 settings such as track and input_size come back too, at their defaults)
        restored = {k: h["settings"][k] for k in ("mode", "confidence", "classes")}
        assert restored == {"mode": "every", "confidence": 0.25, "classes": [0]}
        assert h["counters"] == {k: int(v) for k, v in seen.items()}
        await again.frame()
        res = await again.answer()
        assert res["type"] == "result" and res["id"] == 1
        await wait_until(
            lambda: session_in_redis(raw, sid, connected="1", answered="4", epoch="2"),
            5,
            "resumed session's counters carry on",
        )
        await again.ws.close()


@pytest.mark.redis
async def test_resume_on_another_node_moves_the_session_there(
    redis_server: RedisServer, raw: Any, server_factory: Factory, small_spec: ModelSpec
) -> None:
    a = await start(server_factory, small_spec, redis_server.url, "node-a")
    b = await start(server_factory, small_spec, redis_server.url, "node-b")
    async with aiohttp.ClientSession() as http:
        c = await open_client(http, a.ws_url)
        sid = c.hello["session_id"]
        await c.settings(confidence=0.4)
        await c.frames(2)
        await c.ws.close(code=4000)

        moved = await open_client(http, b.ws_url, token=c.token)
        assert moved.hello["resumed"] is True and moved.hello["node"] == "node-b"
        assert moved.hello["session_id"] == sid
        assert moved.hello["settings"]["confidence"] == 0.4
        assert moved.hello["counters"]["answered"] == 2
        await wait_until(
            lambda: session_in_redis(raw, sid, node="node-b", connected="1"), 5, "node-b holds it"
        )

        async def listed_by_node_b() -> bool:
            # The record and the node's session set are separate writes: wait for both.
            return await raw.smembers("ev:node:node-b:sessions") == {sid}

        await wait_until(listed_by_node_b, 5, "node-b's session set lists it")
        assert await raw.smembers("ev:node:node-b:sessions") == {sid}
        assert sid not in await raw.smembers("ev:node:node-a:sessions")
        await moved.ws.close()


@pytest.mark.redis
async def test_resuming_elsewhere_closes_the_stale_socket_on_the_old_node(
    redis_server: RedisServer, raw: Any, server_factory: Factory, small_spec: ModelSpec
) -> None:
    """The old socket looks alive to node A (half-open), but the client resumed on B:
    A learns it from the store at its next heartbeat and closes its copy with 4000
    (superseded; 1008 for a protocol-1 client)."""
    a = await start(server_factory, small_spec, redis_server.url, "node-a")
    b = await start(server_factory, small_spec, redis_server.url, "node-b")
    async with aiohttp.ClientSession() as http:
        old = await open_client(http, a.ws_url)
        await old.frames(1)
        await wait_until(
            lambda: session_in_redis(raw, old.hello["session_id"], answered="1"), 5, "flushed"
        )
        new = await open_client(http, b.ws_url, token=old.token)
        assert new.hello["resumed"] is True
        msg = await old.ws.receive(timeout=T(10))
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert old.ws.close_code == 4000
        await new.frames(1)  # the new holder serves on
        await wait_until(
            lambda: session_in_redis(raw, old.hello["session_id"], node="node-b", answered="2"),
            5,
            "the newer holder's record stays",
        )
        await new.ws.close()


@pytest.mark.redis
async def test_tokens_that_must_not_resume_get_a_new_session(
    redis_server: RedisServer, server_factory: Factory, small_spec: ModelSpec
) -> None:
    srv = await start(server_factory, small_spec, redis_server.url, "node-a")
    async with aiohttp.ClientSession() as http:
        ended = await open_client(http, srv.ws_url)
        await ended.ws.close()  # 1000: ended for good
        dropped = await open_client(http, srv.ws_url)
        await dropped.ws.close(code=4000)
        sid, secret = dropped.token.split(".")
        for token in (ended.token, f"{sid}.{'x' * len(secret)}", "not-a-token", "*.*"):
            c = await open_client(http, srv.ws_url, token=token)
            assert c.hello["resumed"] is False
            assert c.hello["session_id"] not in (ended.hello["session_id"], sid)
            await c.ws.close()


# -- admin API -------------------------------------------------------------------------


@pytest.mark.redis
async def test_admin_api_on_any_node_lists_every_node_and_session(
    redis_server: RedisServer, server_factory: Factory, small_spec: ModelSpec
) -> None:
    token = "adm1n-t0ken"
    a = await start(server_factory, small_spec, redis_server.url, "node-a", admin_token=token)
    b = await start(server_factory, small_spec, redis_server.url, "node-b", admin_token=token)
    async with aiohttp.ClientSession() as http:
        for path in ("/api/sessions", "/api/nodes"):
            async with http.get(a.url + path) as r:
                assert r.status == 401
            async with http.get(a.url + path, headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
        ca = await open_client(http, a.ws_url)
        cb = await open_client(http, b.ws_url)
        await cb.settings(confidence=0.7)
        await cb.frames(1)
        want = {ca.hello["session_id"]: "node-a", cb.hello["session_id"]: "node-b"}

        async def all_sessions(url: str) -> list[dict[str, Any]] | None:
            body = await get_json(http, url + "/api/sessions", token)
            found = {s["id"]: s["node"] for s in body["sessions"] if s["connected"]}
            on_b = [s for s in body["sessions"] if s["node"] == "node-b"]
            fresh = on_b and on_b[0]["answered"] == 1 and on_b[0]["confidence"] == 0.7
            return body["sessions"] if body["complete"] and found == want and fresh else None

        for srv in (a, b):
            sessions, _ = await wait_until(partial(all_sessions, srv.url), 5, "both sessions")
            assert all("secret" not in s for s in sessions)
            nodes = (await get_json(http, srv.url + "/api/nodes", token))["nodes"]
            assert [n["id"] for n in nodes] == ["node-a", "node-b"]
            assert all(n["model"] == "PP-OCRv6_det_small" for n in nodes)
        await ca.ws.close()
        await cb.ws.close()


async def test_without_redis_the_in_process_store_serves_admin_api_and_resume(
    server_factory: Factory, small_spec: ModelSpec
) -> None:
    srv = await start(server_factory, small_spec, None, "solo")
    async with aiohttp.ClientSession() as http:
        ready = await get_json(http, srv.url + "/readyz")
        assert ready["state"]["store"] == "memory" and ready["state"]["degraded"] is False
        c = await open_client(http, srv.ws_url)
        await c.settings(classes=[0])
        await c.frames(2)

        async def listed() -> list[dict[str, Any]] | None:
            sessions = (await get_json(http, srv.url + "/api/sessions"))["sessions"]
            return sessions if [s["answered"] for s in sessions] == [2] else None

        sessions, _ = await wait_until(listed, 5, "the session in /api/sessions")
        assert sessions[0]["node"] == "solo" and sessions[0]["classes"] == [0]
        nodes = (await get_json(http, srv.url + "/api/nodes"))["nodes"]
        assert [n["id"] for n in nodes] == ["solo"] and nodes[0]["connections"] == 1
        await c.ws.close(code=4000)
        again = await open_client(http, srv.ws_url, token=c.token)
        assert again.hello["resumed"] is True
        assert again.hello["counters"]["answered"] == 2
        assert again.hello["settings"]["classes"] == [0]
        await again.ws.close()


# -- Redis trouble ---------------------------------------------------------------------


async def _stream(c: Client, stop: asyncio.Event, interval: float) -> None:
    """A camera at ~1/interval fps in latest mode until ``stop``; then its last frame
    must be answered (docs/protocol.md, Admission)."""

    async def reader() -> None:
        while True:
            await c.answer()

    task = asyncio.create_task(reader())
    try:
        while not stop.is_set():
            await c.frame()
            await asyncio.sleep(interval)

        async def last_answered() -> bool:
            return bool(c.results) and c.results[-1]["id"] == c.sent

        await wait_until(last_answered, 30, "the last frame's result")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.redis
async def test_redis_killed_mid_stream_frames_keep_flowing_and_state_catches_up(
    redis_server: RedisServer,
    raw: Any,
    server_factory: Factory,
    small_spec: ModelSpec,
    record_property: Callable[[str, object], None],
) -> None:
    srv = await start(server_factory, small_spec, redis_server.url, "node-a")
    async with aiohttp.ClientSession() as http:
        clients = [await open_client(http, srv.ws_url) for _ in range(3)]
        ids = {c.hello["session_id"] for c in clients}
        stop = asyncio.Event()
        streams = [asyncio.create_task(_stream(c, stop, 0.033)) for c in clients]
        try:
            await wait_until(lambda: _all_live(raw, ids), 10, "three live sessions in Redis")

            await asyncio.to_thread(redis_server.kill)
            at_kill = [len(c.results) for c in clients]
            ready, _ = await wait_until(
                lambda: _degraded_readyz(http, srv.url), 10, "/readyz to show state degraded"
            )
            assert ready["ready"] is True and ready["state"]["error"]
            await asyncio.sleep(2.0)  # frames keep going while Redis is away
            at_restart = [len(c.results) for c in clients]
            assert all(r > k + 3 for k, r in zip(at_kill, at_restart, strict=True)), (
                "frames must be answered while Redis is down"
            )
            failures = metric(
                await metrics_text(http, srv.url), "edge_vision_state_write_failures_total"
            )
            assert failures >= 1
            assert metric(await metrics_text(http, srv.url), "edge_vision_state_degraded") == 1

            await asyncio.to_thread(redis_server.start)  # same port, empty
            restarted = time.monotonic()
            await wait_until(lambda: _all_live(raw, ids), 10, "state rewritten after restart")
            report(
                record_property, "redis_restart_to_state_rewritten_s", time.monotonic() - restarted
            )
            assert await raw.exists("ev:node:node-a") == 1

            stop.set()
            await asyncio.gather(*streams)
        finally:
            for t in streams:
                t.cancel()
            await asyncio.gather(*streams, return_exceptions=True)

        for c in clients:
            assert c.errors == []
            # Every frame answered or counted as dropped, exactly as without Redis.
            assert len(c.results) + c.dropped == c.sent
        for c in clients:
            sid, seen = c.hello["session_id"], counters_of(c)
            await wait_until(partial(session_in_redis, raw, sid, **seen), 5, "final counters")
        ready = await get_json(http, srv.url + "/readyz")
        assert ready["state"]["degraded"] is False
        for c in clients:
            await c.ws.close()


@pytest.mark.redis
async def test_a_frozen_redis_holds_up_no_frame_and_no_new_connection(
    redis_server: RedisServer,
    raw: Any,
    server_factory: Factory,
    small_spec: ModelSpec,
    record_property: Callable[[str, object], None],
) -> None:
    """Redis stopped with SIGSTOP: its sockets stay open and every command hangs. Writes
    hit state.op_timeout_s; frames and new connections never wait for them."""
    srv = await start(server_factory, small_spec, redis_server.url, "node-a")
    async with aiohttp.ClientSession() as http:
        cam = await open_client(http, srv.ws_url)
        stop = asyncio.Event()
        stream = asyncio.create_task(_stream(cam, stop, 0.033))
        try:
            await wait_until(
                lambda: _all_live(raw, {cam.hello["session_id"]}), 10, "the session in Redis"
            )
            await asyncio.to_thread(redis_server.freeze)
            at_freeze = len(cam.results)
            await wait_until(lambda: _degraded_readyz(http, srv.url), 10, "state degraded")
            late = await open_client(http, srv.ws_url)  # a new camera while Redis hangs
            await late.frames(2)
            await asyncio.sleep(1.0)
            assert len(cam.results) > at_freeze + 3, "frames must flow while Redis hangs"

            await asyncio.to_thread(redis_server.thaw)
            thawed = time.monotonic()
            ids = {cam.hello["session_id"], late.hello["session_id"]}
            await wait_until(lambda: _all_live(raw, ids), 10, "state rewritten after the thaw")
            report(record_property, "redis_thaw_to_state_rewritten_s", time.monotonic() - thawed)
            stop.set()
            await stream
        finally:
            stream.cancel()
            await asyncio.gather(stream, return_exceptions=True)
            await asyncio.to_thread(redis_server.thaw)
        assert cam.errors == [] and len(cam.results) + cam.dropped == cam.sent
        await wait_until(lambda: _ready_and_healthy(http, srv.url), 10, "degraded to clear")
        await cam.ws.close()
        await late.ws.close()


async def _ready_and_healthy(http: aiohttp.ClientSession, url: str) -> bool:
    body = await get_json(http, url + "/readyz")
    return bool(body["ready"] and not body["state"]["degraded"])


async def _all_live(raw: Any, ids: set[str]) -> bool:
    held = await raw.smembers("ev:node:node-a:sessions")
    records = [await raw.hget(f"ev:session:{sid}", "connected") for sid in ids]
    return bool(held == ids and records == ["1"] * len(ids))


async def _degraded_readyz(http: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    async with http.get(url + "/readyz") as r:
        body: dict[str, Any] = await r.json()
        return body if r.status == 200 and body["state"]["degraded"] else None


@pytest.mark.redis
async def test_resume_on_the_same_node_works_while_redis_is_down(
    redis_server: RedisServer, raw: Any, server_factory: Factory, small_spec: ModelSpec
) -> None:
    srv = await start(server_factory, small_spec, redis_server.url, "node-a")
    async with aiohttp.ClientSession() as http:
        c = await open_client(http, srv.ws_url)
        sid = c.hello["session_id"]
        await c.frames(2)
        await asyncio.to_thread(redis_server.kill)
        await c.ws.close(code=4000)
        again = await open_client(http, srv.ws_url, token=c.token)
        assert again.hello["resumed"] is True and again.hello["session_id"] == sid
        assert again.hello["counters"]["answered"] == 2
        await again.frames(1)
        await asyncio.to_thread(redis_server.start)
        await wait_until(
            lambda: session_in_redis(raw, sid, connected="1", answered="3", epoch="2"),
            10,
            "the resumed session written once Redis is back",
        )
        await again.ws.close()


# -- node processes: SIGTERM and SIGKILL -----------------------------------------------


@pytest.mark.redis
async def test_sigterm_closes_with_1001_and_a_resume_token_and_removes_the_node_keys(
    redis_server: RedisServer,
    raw: Any,
    server_factory: Factory,
    small_spec: ModelSpec,
    tmp_path: Path,
) -> None:
    node = node_process("node-a", redis_server.url, tmp_path)
    await asyncio.to_thread(node.start)
    try:
        await node.wait_ready()
        b = await start(server_factory, small_spec, redis_server.url, "node-b")
        async with aiohttp.ClientSession() as http:
            c = await open_client(http, node.ws_url)
            sid = c.hello["session_id"]
            await c.settings(confidence=0.35)
            await c.frames(3)
            node.signal(signal.SIGTERM)
            closing = await recv_type(c.ws, "closing", timeout=15)
            assert closing["resume_token"] == c.token
            msg = await c.ws.receive(timeout=T(15))
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert c.ws.close_code == 1001
            assert await asyncio.to_thread(node.proc.wait, T(20)) == 0  # type: ignore[union-attr]
            # Removed by the node itself, not by TTL expiry.
            assert await raw.exists("ev:node:node-a", "ev:node:node-a:sessions") == 0
            rec = await session_in_redis(raw, sid, connected="0", **counters_of(c))
            assert rec is not None, await raw.hgetall(f"ev:session:{sid}")

            moved = await open_client(http, b.ws_url, token=closing["resume_token"])
            assert moved.hello["resumed"] is True and moved.hello["session_id"] == sid
            assert moved.hello["settings"]["confidence"] == 0.35
            assert moved.hello["counters"]["answered"] == 3
            await moved.ws.close()
    finally:
        await asyncio.to_thread(node.stop)


@pytest.mark.redis
async def test_sigkilled_node_vanishes_by_ttl_and_its_sessions_after_theirs(
    redis_server: RedisServer,
    raw: Any,
    server_factory: Factory,
    small_spec: ModelSpec,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    session_ttl = 6.0
    node = node_process("node-a", redis_server.url, tmp_path, f"state.session_ttl_s={session_ttl}")
    await asyncio.to_thread(node.start)
    try:
        await node.wait_ready()
        watcher = await start(server_factory, small_spec, redis_server.url, "node-b")
        async with aiohttp.ClientSession() as http:
            c = await open_client(http, node.ws_url)
            sid = c.hello["session_id"]
            await c.frames(2)
            await wait_until(lambda: session_in_redis(raw, sid, answered="2"), 5, "flushed")
            node.signal(signal.SIGKILL)
            killed = time.monotonic()
            await asyncio.to_thread(node.proc.wait)  # type: ignore[union-attr]

            await wait_until(lambda: key_gone(raw, "ev:node:node-a"), NODE_TTL_S + 5, "node TTL")
            report(record_property, "sigkill_to_node_key_gone_s", time.monotonic() - killed)
            assert await raw.exists("ev:node:node-a:sessions") == 0
            assert await raw.exists(f"ev:session:{sid}") == 1  # still resumable elsewhere

            async def shown_disconnected() -> bool:
                body = await get_json(http, watcher.url + "/api/sessions")
                return any(s["id"] == sid and not s["connected"] for s in body["sessions"])

            await wait_until(shown_disconnected, 5, "the dead node's session shown disconnected")
            report(record_property, "sigkill_to_sessions_released_s", time.monotonic() - killed)
            nodes = (await get_json(http, watcher.url + "/api/nodes"))["nodes"]
            assert [n["id"] for n in nodes] == ["node-b"]

            await wait_until(
                lambda: key_gone(raw, f"ev:session:{sid}"), session_ttl + 5, "session TTL"
            )
            report(record_property, "sigkill_to_session_key_gone_s", time.monotonic() - killed)
            await c.ws.close()
    finally:
        await asyncio.to_thread(node.stop)


@pytest.mark.redis
async def test_while_redis_is_down_only_a_bounded_set_of_final_records_waits(
    redis_server: RedisServer, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sessions that close during an outage leave one final record each, at most
    MAX_PENDING_FINALS of them (newest kept); they land when Redis is back."""
    monkeypatch.setattr(keeper_module, "MAX_PENDING_FINALS", 10)
    cfg = StateConfig(redis_url=redis_server.url, heartbeat_s=0.2, node_ttl_s=2, op_timeout_s=0.3)
    keeper = StateKeeper(create_store(cfg), cfg, "node-a", lambda: {"id": "node-a"})
    await keeper.start()
    try:
        await asyncio.to_thread(redis_server.kill)
        sessions = [new_session("node-a", "latest", 0.5, "127.0.0.1", AGENT) for _ in range(30)]
        for i, s in enumerate(sessions):
            keeper.open_session(s)
            s.answered = i
            keeper.close_session(s, ended=i % 3 == 0)
        await wait_until(lambda: _is(keeper.degraded), 5, "keeper to see Redis down")
        assert keeper.status()["pending_finals"] == 10

        await asyncio.to_thread(redis_server.start)
        await wait_until(lambda: _is(keeper.status()["pending_finals"] == 0), 10, "catch-up")
        stored = {r["id"]: r for r in await raw_records(raw)}
        newest = sessions[-10:]
        assert set(stored) == {s.id for s in newest if s.answered % 3 != 0}
        assert all(stored[s.id]["connected"] == "0" for s in newest if s.id in stored)
        assert all(stored[s.id]["answered"] == str(s.answered) for s in newest if s.id in stored)
    finally:
        await keeper.shutdown()


async def _is(value: bool) -> bool:
    return value


async def raw_records(raw: Any) -> list[dict[str, str]]:
    return [await raw.hgetall(k) for k in await raw.keys("ev:session:*")]
