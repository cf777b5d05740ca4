"""edge_vision.client against real servers over TCP (docs/client.md).

Retry while the engine warms up (in-process, and a real server process), resume after a
node is stopped with SIGTERM behind the shipped nginx with a real redis-server, and every
close reason a server can be made to send here surfacing as its own exception; the rest
of the close-code table is checked on the classifier itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from edge_vision import errors
from edge_vision.client import EdgeVisionClient, FrameError, Result
from edge_vision.client.handshake import classify_close, handshake, refusal_error
from edge_vision.common.threads import opencv_threads
from edge_vision.model.spec import ModelSpec
from edge_vision.serve.server import SERVICE, STARTUP, create_app

from ..support.assertions import assert_box_overlaps
from ..support.clients import camera_client
from ..support.cluster import LIGHT_NODE, Nginx, node_process
from ..support.images import text_scene
from ..support.redis_server import RedisServer
from ..support.server import RunningServer, ServerProcess, free_port, make_config
from ..support.timing import T

pytestmark = pytest.mark.timeout(120)

SCENE = text_scene(640, 360, texts=[("LOT 0042", (200, 150))])
JPG = SCENE.jpeg()
# For the light nodes of tests/support/cluster.py (320-pixel engine input), as test_cluster.
LIGHT_SCENE = text_scene(320, 240, texts=[("LOT 42", (40, 100))], font_size=40)
LIGHT_JPG = LIGHT_SCENE.jpeg()


def assert_text_found(res: Result, scene: Any = SCENE) -> None:
    assert_box_overlaps(res.raw, scene.text_boxes[0], iou_min=0.5)


# -- streaming --------------------------------------------------------------------------


async def test_hello_settings_and_frames_as_bytes_json_and_numpy(server: RunningServer) -> None:
    async with camera_client(server.ws_url, mode="every") as client:
        hello = client.hello
        assert hello.protocol == 3 and hello.protocols == (1, 2, 3)
        assert {"binary_frames", "resume"} <= hello.features
        assert hello.model == "PP-OCRv6_det_small" and hello.labels == ("text",)
        assert hello.settings.mode == "every" and hello.counters.received == 0
        settings = await client.settings(confidence=0.4, classes=[0])
        assert (settings.confidence, settings.classes) == (0.4, (0,))
        assert (await client.settings(classes=None)).classes is None
        assert settings.track is True and settings.read is False  # protocol 2 extras
        tracked = await client.detect(JPG)
        assert tracked.detections[0].track is not None
        assert (await client.settings(track=False, read=True)).read is True
        read = await client.detect(JPG)
        assert read.detections[0].track is None and isinstance(read.detections[0].text, str)
        await client.settings(read=False)
        assert await client.ping({"n": [1, 2]}) == {"n": [1, 2]}
        binary = await client.detect(JPG, frame_id="cam/1", ts=12.5)
        as_json = await client.detect(JPG, wire="json")
        from_array = await client.detect(SCENE.rgb)
    assert (binary.id, binary.ts, binary.width, binary.height) == ("cam/1", 12.5, 640, 360)
    for res in (binary, as_json, from_array):
        assert_text_found(res)
        assert res.detections[0].label == "text" and res.timing["server_ms"] > 0


async def test_results_match_by_id_in_order_and_drops_are_typed(server: RunningServer) -> None:
    """Latest-wins: 12 frames at once; the last is answered, each other one is answered or
    its future raises FrameDropped; results() yields the answers in order."""
    heard: list[tuple[object, str]] = []

    def on_drop(fid: object, cause: str) -> None:
        heard.append((fid, cause))

    async with camera_client(server.ws_url, mode="latest", on_drop=on_drop) as client:
        futures = [await client.send(JPG, frame_id=i) for i in range(12)]
        outcomes: list[str] = []
        for i, fut in enumerate(futures):
            try:
                res = await asyncio.wait_for(fut, T(30))
                assert res.id == i
                outcomes.append("answered")
            except errors.FrameDropped as e:
                assert e.frame_id == i
                outcomes.append("dropped")
        answers: list[Result | FrameError] = []
        async for answer in client.results():
            answers.append(answer)
            if answer.id == 11:
                break
        last = answers[-1]
        assert isinstance(last, Result)
    assert outcomes[-1] == "answered" and "dropped" in outcomes
    answered_ids = [i for i, o in enumerate(outcomes) if o == "answered"]
    assert [a.id for a in answers] == answered_ids  # in send order, nothing else
    assert last.dropped == outcomes.count("dropped")  # the server's books agree with ours
    dropped_ids = [i for i, o in enumerate(outcomes) if o == "dropped"]
    assert heard == [(i, "latest") for i in dropped_ids]  # told before the futures raised
    books = client.books
    assert (books.sent, books.answered, books.dropped) == (12, len(answered_ids), len(dropped_ids))
    assert books.rejected == books.lost == books.unmatched == books.pending == 0


async def test_a_bad_frame_is_a_typed_rejection_and_the_session_lives_on(
    server: RunningServer,
) -> None:
    async with camera_client(server.ws_url, mode="every") as client:
        bad = await client.send(b"not an image at all", frame_id=1)
        good = await client.send(JPG, frame_id=2)
        with pytest.raises(errors.FrameRejected) as info:
            await bad
        assert info.value.code == "unsupported_image" and info.value.frame_id == 1
        assert_text_found(await good)
        with pytest.raises(errors.FrameRejected) as bad_settings:
            await client.settings(confidence=2.0)
        assert bad_settings.value.code == "bad_settings"
        assert (client.books.sent, client.books.answered, client.books.rejected) == (2, 1, 1)


async def test_a_protocol_1_client_still_streams(server: RunningServer) -> None:
    async with camera_client(server.ws_url, protocol=1, mode="every") as client:
        assert client.hello.protocol == 1
        results = [await client.detect(JPG, frame_id=i) for i in range(3)]
    assert [r.id for r in results] == [0, 1, 2]
    for res in results:
        assert_text_found(res)


# -- connecting: retry while warming up, refusals ----------------------------------------


@asynccontextmanager
async def gated_server(spec: ModelSpec, gate: asyncio.Event) -> AsyncIterator[RunningServer]:
    """A real server whose engine start waits for ``gate``: /ws answers 503 until then."""
    app = await asyncio.to_thread(create_app, make_config(), spec)
    service = app[SERVICE]
    start = service.start

    async def start_after_gate() -> None:
        await gate.wait()
        await start()

    service.start = start_after_gate  # type: ignore[method-assign]
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield RunningServer(app, port)
    finally:
        gate.set()
        await asyncio.wait_for(asyncio.shield(app[STARTUP]), T(60))
        await runner.cleanup()


async def test_connect_retries_while_the_engine_warms_up(spec: ModelSpec) -> None:
    gate = asyncio.Event()
    async with gated_server(spec, gate) as srv:
        async with aiohttp.ClientSession() as http, http.get(srv.ws_url) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1"
        client = EdgeVisionClient(srv.ws_url, retry_s=T(30), max_retry_wait_s=0.2)
        connecting = asyncio.create_task(client.connect())
        while client.retries < 2:  # refused with 503 twice, and retried
            assert not connecting.done()
            await asyncio.sleep(0.05)
        gate.set()
        hello = await asyncio.wait_for(connecting, T(30))
        assert hello.session_id
        assert_text_found(await client.detect(JPG))
        await client.close()


async def test_the_retry_budget_is_bounded_and_ends_in_server_unavailable(
    spec: ModelSpec,
) -> None:
    gate = asyncio.Event()
    async with gated_server(spec, gate) as srv:
        client = EdgeVisionClient(srv.ws_url, retry_s=0.6, max_retry_wait_s=0.2)
        started = time.monotonic()
        with pytest.raises(errors.ServerUnavailable) as info:
            await client.connect()
        assert info.value.status == 503
        assert time.monotonic() - started < T(5) and client.retries >= 2
        await client.close()


async def test_nothing_listening_is_server_unreachable_after_the_budget() -> None:
    client = EdgeVisionClient(f"ws://127.0.0.1:{free_port()}/ws", retry_s=0.3)
    with pytest.raises(errors.ServerUnreachable):
        await client.connect()
    assert client.retries >= 1
    await client.close()


def retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "edge_vision.client.connection" and r.levelno == logging.WARNING
    ]


async def test_while_it_retries_a_dead_port_it_says_so_and_the_end_says_what_to_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"ws://127.0.0.1:{free_port()}/ws"
    client = EdgeVisionClient(url, retry_s=1.5, max_retry_wait_s=0.2)
    started = time.monotonic()
    with caplog.at_level(logging.INFO), pytest.raises(errors.ServerUnreachable) as info:
        await client.connect()
    took = time.monotonic() - started
    # Said once at WARNING (seen without any logging set up), with the retry budget left.
    [warning] = retry_warnings(caplog)
    assert re.fullmatch(
        rf"cannot reach the server at {url}: connection refused; retrying for up to "
        r"1\.[0-5] s more \(retry_s=1\.5\)",
        warning,
        flags=re.IGNORECASE,
    ), warning
    assert client.retries >= 3
    message = str(info.value)
    assert message.startswith(f"cannot reach the server at {url}: ")
    said = re.search(r"tried for ([\d.]+) s \(retry_s=1\.5\)", message)
    assert said is not None, message
    assert 1.0 <= float(said[1]) <= took
    assert message.endswith(
        ": check the host and port, and that 'edge-vision serve' runs there (its log names "
        "the URL to use)"
    )
    await client.close()


async def test_while_the_engine_warms_up_it_says_why_it_retries_and_for_how_long(
    spec: ModelSpec, caplog: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()
    async with gated_server(spec, gate) as srv:
        client = EdgeVisionClient(srv.ws_url, retry_s=1.2, max_retry_wait_s=0.2)
        with caplog.at_level(logging.INFO), pytest.raises(errors.ServerUnavailable) as info:
            await client.connect()
        [warning] = retry_warnings(caplog)
        assert warning.startswith(
            f"the server at {srv.ws_url} refused the WebSocket: HTTP 503: engine is warming "
            "up; retry shortly; retrying for up to 1."
        ), warning
        assert info.value.body == "engine is warming up; retry shortly"
        assert str(info.value).startswith(
            f"the server at {srv.ws_url} still refuses the WebSocket (HTTP 503: engine is "
            "warming up; retry shortly); tried for "
        )
        assert "(retry_s=1.2): it is warming up" in str(info.value)
        await client.close()


async def test_the_page_s_url_is_no_websocket_and_the_error_names_ws(
    server: RunningServer,
) -> None:
    page = f"ws://127.0.0.1:{server.port}/"
    client = EdgeVisionClient(page, retry_s=5)
    with pytest.raises(errors.WrongPath) as info:
        await client.connect()
    assert str(info.value) == f"{page} is the overlay page; the WebSocket is at {server.ws_url}"
    assert info.value.status == 200 and info.value.body == ""  # no HTML, in any field
    assert client.retries == 0
    await client.close()
    # What it names is the WebSocket.
    async with camera_client(info.value.ws_url) as right:
        assert right.hello.session_id


async def test_a_path_that_is_not_there_is_a_404_that_names_ws(server: RunningServer) -> None:
    url = f"ws://127.0.0.1:{server.port}/camera?protocol=2"
    client = EdgeVisionClient(url, retry_s=5)
    with pytest.raises(errors.WrongPath) as info:
        await client.connect()
    assert str(info.value) == (
        f"nothing serves a WebSocket at {url} (HTTP 404); it is at {server.ws_url}"
    )
    assert info.value.status == 404 and client.retries == 0
    await client.close()


@pytest.mark.parametrize(
    ("url", "status", "said"),
    [
        (
            "wss://vision.example/edge/ws",
            404,
            "nothing serves a WebSocket at wss://vision.example/edge/ws (HTTP 404): is an "
            "edge_vision node there, or does a proxy in front serve its /ws under another path?",
        ),
        (
            "wss://vision.example/ws",
            200,
            "wss://vision.example/ws answered with a page (HTTP 200), not the WebSocket "
            "upgrade: is an edge_vision node there, or does a proxy in front drop the Upgrade "
            "header?",
        ),
    ],
)
def test_behind_a_proxy_a_wrong_path_says_what_to_check(url: str, status: int, said: str) -> None:
    """The refusals no server here answers with: a proxy's own 404 or page at a /ws path."""
    err = refusal_error(url, status, "<!doctype html><html><body>Not here</body></html>")
    assert isinstance(err, errors.WrongPath)
    assert str(err) == said and err.body == ""


async def test_a_version_the_node_does_not_serve_is_protocol_not_served(
    server: RunningServer,
) -> None:
    client = EdgeVisionClient(server.ws_url)
    client.protocol = 4  # a client of a future release
    with pytest.raises(errors.ProtocolNotServed) as info:
        await client.connect()
    assert info.value.status == 400 and client.retries == 0
    assert info.value.protocols == (1, 2, 3) and "serves 1, 2, 3" in info.value.body
    await client.close()


async def test_a_real_server_process_warming_up_then_killed(tmp_path: Path) -> None:
    """Connect at once to a starting `edge-vision serve` (refused, then 503, then hello);
    SIGKILL it: the session ends in ConnectionLost once resuming finds nobody."""
    node = ServerProcess(*LIGHT_NODE, log_path=tmp_path / "node.log")
    await asyncio.to_thread(node.start)
    try:
        client = EdgeVisionClient(node.ws_url, retry_s=T(60), max_retry_wait_s=0.25)
        try:
            await client.connect()
            assert client.retries >= 1, "the client connected before the node was ready?"
            assert_text_found(await client.detect(LIGHT_JPG), LIGHT_SCENE)
            client.retry_s = 0.5  # the resume after the kill finds nothing listening
            node.signal(signal.SIGKILL)
            with pytest.raises(errors.ConnectionLost):
                async for _ in client.results():
                    pass
            with pytest.raises(errors.ConnectionLost):
                await client.send(LIGHT_JPG)
        finally:
            await client.close()
    finally:
        await asyncio.to_thread(node.stop)


async def _one_frame_from_a_node(tmp_path: Path, *settings: str) -> str:
    """Start `edge-vision serve` with ``settings``, have it find the light scene's text
    once, stop it; its log."""
    node = ServerProcess(*LIGHT_NODE, *settings, log_path=tmp_path / "node.log")
    await asyncio.to_thread(node.start)
    try:
        await node.wait_ready()
        client = EdgeVisionClient(node.ws_url)
        try:
            await client.connect()
            assert_text_found(await client.detect(LIGHT_JPG), LIGHT_SCENE)
        finally:
            await client.close()
    finally:
        await asyncio.to_thread(node.stop)
    return await asyncio.to_thread(node.log)


async def test_a_real_server_process_on_uvloop_serves_frames(tmp_path: Path) -> None:
    """server.event_loop uvloop: `edge-vision serve` runs its loop on libuv and serves as
    on asyncio's (python -m benchmarks.loop measures the difference)."""
    assert "event loop: uvloop" in await _one_frame_from_a_node(
        tmp_path, "server.event_loop=uvloop"
    )


async def test_a_node_without_a_gpu_keeps_opencv_s_threads_for_its_host_letterbox(
    tmp_path: Path,
) -> None:
    """decode.device cuda on a machine with no GPU: frames are letterboxed on the host, so
    OpenCV keeps its pool (1 thread there answered 15-28 % fewer frames on this machine)
    and frames are served; the single thread is only for a node a CUDA engine serves."""
    log = await _one_frame_from_a_node(tmp_path, "decode.device=cuda")
    assert "OpenCV threads a call: OpenCV's default (frames letterboxed on the host)" in log
    assert opencv_threads(None, cuda_engine=True) == 1
    assert opencv_threads(None, cuda_engine=False) == -1
    assert opencv_threads(4, cuda_engine=True) == 4


# -- close reasons from a real server ----------------------------------------------------


async def results_until_closed(client: EdgeVisionClient) -> list[Any]:
    got = []
    async for answer in client.results():
        got.append(answer)
    return got


async def test_shutdown_is_server_shutting_down_with_the_resume_token(spec: ModelSpec) -> None:
    from ..support.server import running_server

    async with running_server(make_config(), spec) as srv:
        client = camera_client(srv.ws_url, resume=False)
        await client.connect()
        reading = asyncio.create_task(results_until_closed(client))
    with pytest.raises(errors.ServerShuttingDown) as info:
        await asyncio.wait_for(reading, T(30))
    assert info.value.code == 1001 and info.value.resumable
    assert info.value.resume_token == client.hello.resume_token
    await client.close()


@pytest.mark.parametrize("protocol", [1, 2])
async def test_idle_timeout_is_idle_timeout(server_factory: Any, protocol: int) -> None:
    srv = await server_factory({"server": {"idle_timeout_s": 0.5, "ping_interval_s": 30}})
    async with camera_client(srv.ws_url, protocol=protocol, resume=False) as client:
        with pytest.raises(errors.IdleTimeout) as info:
            await asyncio.wait_for(results_until_closed(client), T(20))
    assert info.value.resumable


@pytest.mark.parametrize("protocol", [1, 2])
async def test_a_newer_connection_resuming_the_session_is_session_superseded(
    server: RunningServer, protocol: int
) -> None:
    first = camera_client(server.ws_url, protocol=protocol)
    await first.connect()
    reading = asyncio.create_task(results_until_closed(first))
    # Protocol 2 sends the token as a subprotocol entry, protocol 1 as ?resume=.
    second = camera_client(server.ws_url, protocol=protocol, resume_token=first.hello.resume_token)
    await second.connect()
    assert second.hello.resumed and second.hello.session_id == first.hello.session_id
    with pytest.raises(errors.SessionSuperseded) as info:
        await asyncio.wait_for(reading, T(20))
    assert not info.value.resumable and first.resumes == 0  # it did not take the session back
    assert_text_found(await second.detect(JPG))
    await second.close()
    await first.close()


async def test_a_frame_over_the_limit_is_message_too_big_before_it_is_sent(
    server_factory: Any,
) -> None:
    """The client checks hello's limit: the frame is refused with its size and the limit,
    nothing goes out, and the session streams on (the node would close it with 1009)."""
    srv = await server_factory({"server": {"max_message_bytes": 4096}})
    small = text_scene(96, 64, texts=[]).jpeg(quality=40)
    assert len(small) < 3000 < len(JPG)
    heard: list[tuple[object, str]] = []

    def on_drop(fid: object, cause: str) -> None:
        heard.append((fid, cause))

    async with camera_client(srv.ws_url, resume=False, on_drop=on_drop) as client:
        assert client.hello.limits.max_message_bytes == 4096
        with pytest.raises(errors.MessageTooBig) as info:
            await client.send(JPG)  # ~30 kB
        too_big = info.value
        assert (too_big.size, too_big.limit, too_big.code) == (len(JPG), 4096, None)
        assert str(too_big) == (
            f"a frame of {len(JPG):,} bytes is over this node's limit of 4,096 bytes a message "
            "(its server.max_message_bytes, announced in hello); nothing was sent and the "
            "connection stays open: send a smaller image (scale it down, or JPEG rather than "
            "PNG)"
        )
        # As JSON the same small image grows by a third (base64): the message is measured.
        padded = small + b"\0" * (3200 - len(small))  # a JPEG may carry trailing bytes
        with pytest.raises(errors.MessageTooBig) as info:
            await client.send(padded, wire="json")
        assert info.value.size is not None and 4096 < info.value.size < 4400
        assert client.books.sent == 0 and heard == []
        result = await asyncio.wait_for(await client.send(small), T(20))
        assert (result.width, result.height) == (96, 64)
        assert client.books.answered == 1


async def test_closing_the_client_ends_results_and_the_session(server: RunningServer) -> None:
    client = camera_client(server.ws_url)
    await client.connect()
    reading = asyncio.create_task(results_until_closed(client))
    await client.close()
    assert await asyncio.wait_for(reading, T(10)) == []
    with pytest.raises(errors.SessionEnded):
        await client.send(JPG)


@pytest.mark.parametrize(
    ("code", "reason", "closing", "expected"),
    [
        (1000, "", False, errors.SessionEnded),
        (1001, "server shutting down", True, errors.ServerShuttingDown),
        (1001, "idle timeout", False, errors.IdleTimeout),
        (1002, "", False, errors.ProtocolViolation),
        (1006, "", False, errors.ConnectionLost),
        (None, "", False, errors.ConnectionLost),
        (1007, "", False, errors.ProtocolViolation),
        (1008, "client is not reading results", False, errors.SlowClient),
        (1008, "session resumed elsewhere", False, errors.SessionSuperseded),
        (1008, "something else", False, errors.ProtocolViolation),
        (1009, "", False, errors.MessageTooBig),
        (1011, "", False, errors.ServerFailed),
        (1013, "", False, errors.ServerOverloaded),
        (4000, "", False, errors.SessionSuperseded),
        (4001, "", False, errors.TokenExpired),
        (4002, "", False, errors.SlowClient),
        (4003, "", False, errors.IdleTimeout),
        (4004, "", False, errors.ConnectionClosed),
    ],
)
def test_every_close_code_has_its_exception(
    code: int | None, reason: str, closing: bool, expected: type[errors.ConnectionClosed]
) -> None:
    """The classifier alone, for the codes no server here can be made to send on demand."""
    exc = classify_close(code, reason, "tok" if closing else None)
    assert type(exc) is expected and isinstance(exc, errors.ProtocolClientError)
    assert exc.code == code


# -- resume across nodes -----------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.timeout(180)
async def test_resume_on_the_other_node_after_sigterm(
    redis_server: RedisServer, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    nodes = {n: node_process(n, redis_server.url, tmp_path) for n in ("node-a", "node-b")}
    nginx: Nginx | None = None
    try:
        for node in nodes.values():
            await asyncio.to_thread(node.start)
        await asyncio.gather(*(node.wait_ready() for node in nodes.values()))
        nginx = await asyncio.to_thread(Nginx, tmp_path / "nginx", [n.port for n in nodes.values()])
        await asyncio.to_thread(nginx.start)
        async with camera_client(nginx.ws_url, mode="every") as client:
            first = client.hello
            await client.settings(confidence=0.35)
            for i in range(3):
                assert_text_found(await client.detect(LIGHT_JPG, frame_id=i), LIGHT_SCENE)
            nodes[first.node].signal(signal.SIGTERM)
            signalled = time.monotonic()
            answers: list[Result] = []  # answered by the other node, after the resume
            gap_s: float | None = None
            i = 3
            while len(answers) < 3:
                assert time.monotonic() < signalled + T(60), "no resume within a minute"
                try:
                    pending = await client.send(LIGHT_JPG, frame_id=i)
                    res = await asyncio.wait_for(pending, T(30))
                    if client.resumes:
                        answers.append(res)
                        gap_s = gap_s or time.monotonic() - signalled
                except errors.FrameDropped:
                    pass  # in flight on the stopping node: counted dropped by both sides
                i += 1
            after = client.hello
        print(f"\nRESUME sigterm_to_first_answer_on_the_other_node_s = {gap_s:.2f}")
        record_property("sigterm_to_first_answer_on_the_other_node_s", round(gap_s or 0, 3))
        assert after.resumed and after.session_id == first.session_id
        assert after.node != first.node
        assert after.settings.confidence == 0.35
        assert after.counters.answered >= 3
        assert client.resumes == 1
        for res in answers[-3:]:
            assert_text_found(res, LIGHT_SCENE)
    finally:
        if nginx is not None:
            await asyncio.to_thread(nginx.stop)
        for node in nodes.values():
            await asyncio.to_thread(node.stop)


def test_since_protocol_2_the_resume_token_stays_out_of_the_url() -> None:
    url, entries = handshake("ws://node:8080/ws?mode=every", 2, None, "sess.tok")
    assert "tok" not in url and entries == ("edge-vision", "edge-vision.resume.sess.tok")
    assert "protocol=2" in url and "mode=every" in url
    url, entries = handshake("ws://node:8080/ws", 1, None, "sess.tok")
    assert "resume=sess.tok" in url and "protocol=1" in url and entries == ()


def test_every_close_code_the_server_sends_has_its_own_exception() -> None:
    """edge_vision/common/close_codes.py is the server's table: each code maps to a subclass."""
    from edge_vision.common.close_codes import CLOSE_REASONS

    for code, reason in CLOSE_REASONS.items():
        closing = "tok" if code == 1001 else None  # the server's 1001 follows a closing
        exc = classify_close(int(code), "", closing)
        assert type(exc) is not errors.ConnectionClosed, code
        assert exc.resumable == reason.resumable, (code, exc, reason)


def python_blocks(path: Path) -> list[str]:
    text = path.read_text()
    return [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]


#: The two runnable examples of docs/client.md (read at import: not on the test's loop).
DOC_EXAMPLES = python_blocks(Path(__file__).parents[2] / "docs" / "client.md")[:2]


@pytest.mark.parametrize("example", ["camera", "stream"])
async def test_the_examples_in_docs_client_md_run(
    server: RunningServer, example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace: dict[str, Any] = {}
    for block in DOC_EXAMPLES:
        exec(compile(block, "docs/client.md", "exec"), namespace)

    async def frames() -> AsyncIterator[Any]:
        for i in range(6):
            yield JPG if i % 2 else SCENE.rgb

    await asyncio.wait_for(namespace[example](server.ws_url, frames()), T(60))
    out = capsys.readouterr().out.splitlines()
    if example == "camera":
        assert out[0].startswith("model PP-OCRv6_det_small engine onnxruntime")
        assert {line.split()[0] for line in out[1:]} == {str(i) for i in range(6)}
        assert all(" text " in line for line in out[1:])
    else:
        answered = [line for line in out if "answered" in line]
        assert answered and answered[-1].startswith("5 answered")


class DroppingProxy:
    """A TCP proxy in front of a server whose connections can be cut at once, as a network
    drop cuts them (no close frame, no FIN from the server)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> DroppingProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def drop_all(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.drop_all()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.mark.parametrize("protocol", [1, 2])
async def test_a_dropped_connection_resumes_the_same_session(
    server: RunningServer, protocol: int
) -> None:
    proxy = await DroppingProxy(server.port).start()
    try:
        url = f"ws://127.0.0.1:{proxy.port}/ws"
        async with camera_client(url, protocol=protocol, mode="every") as client:
            first = client.hello
            await client.settings(confidence=0.3)
            assert_text_found(await client.detect(JPG, frame_id=0))
            proxy.drop_all()
            deadline = time.monotonic() + T(30)
            while client.resumes == 0:
                assert time.monotonic() < deadline, "the client did not resume"
                await asyncio.sleep(0.02)
            res = await client.detect(JPG, frame_id=1)
            after = client.hello
    finally:
        await proxy.close()
    assert_text_found(res)
    assert after.resumed and after.session_id == first.session_id
    assert after.settings.confidence == 0.3 and after.counters.answered == 1


def test_hello_of_a_newer_node_with_fields_this_client_does_not_know_still_parses() -> None:
    from edge_vision.client import Hello

    hello = Hello.from_json(
        {
            "type": "hello",
            "protocol": 2,
            "session_id": "s",
            "resume_token": "s.t",
            "settings": {"mode": "latest", "confidence": 0.5, "classes": None, "zoom": 2},
            "limits": {"max_message_bytes": 10, "new_limit": 3},
            "counters": {"received": 1, "answered": 1, "dropped": 0, "rejected": 0, "late": 4},
            "brand_new": {"x": 1},
        }
    )
    assert hello.counters.received == 1 and hello.raw["counters"]["late"] == 4
    assert hello.limits.max_message_bytes == 10 and hello.raw["brand_new"] == {"x": 1}
