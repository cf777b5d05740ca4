"""Fair shares of connections, as clients see them: real servers, real sockets on loopback.

* one address opening 300 WebSockets gets its share and a 503 naming the limit for the
  rest, while another address (127.0.0.2) still connects;
* /readyz says "full" (503) exactly while no slot is left, and ready again after;
* one token's connections are capped however many addresses it uses;
* behind the shipped nginx, with the nginx peer trusted, the client address comes from
  X-Forwarded-For (a header the client forges is not believed);
* a TCP connection that never sends a request is closed after the handshake timeout;
* the pure parts: client address selection and per-worker shares.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from edge_vision.config import ModelConfig
from edge_vision.model.spec import ModelSpec, load_model_spec
from edge_vision.serve import auth
from edge_vision.serve.limits import ConnectionLimits, LimitsPolicy, client_address, parse_networks
from edge_vision.serve.server import CONNECTIONS

from ..support.cluster import Nginx
from ..support.scrape import metric, metrics_text
from ..support.server import RunningServer, make_config, running_server
from ..support.timing import T

PER_ADDRESS = 40
TOTAL = 60
SECRET = b"s" * 40


@pytest.fixture(scope="module")
def small_spec() -> ModelSpec:
    return load_model_spec(ModelConfig(input_size=320))


def overrides(**limits: Any) -> dict[str, Any]:
    return {
        "engine": {"warmup_shapes": [(192, 320)]},
        "server": {"max_connections": TOTAL, "ping_interval_s": 60, "idle_timeout_s": 120},
        "limits": {"max_connections_per_address": PER_ADDRESS, **limits},
    }


@pytest.fixture
async def srv(small_spec: ModelSpec) -> AsyncIterator[RunningServer]:
    async with running_server(make_config(overrides()), small_spec) as s:
        yield s


async def open_many(
    url: str, n: int, local: str, headers: dict[str, str] | None = None
) -> tuple[list[aiohttp.ClientWebSocketResponse], list[int], aiohttp.ClientSession]:
    """``n`` WebSockets at once from ``local``: (open sockets, refusal statuses, session)."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, local_addr=(local, 0), force_close=True)
    )

    async def one() -> aiohttp.ClientWebSocketResponse | int:
        try:
            ws = await session.ws_connect(url, headers=headers, max_msg_size=0)
        except aiohttp.WSServerHandshakeError as e:
            return e.status
        msg = await ws.receive(timeout=T(30))
        assert msg.type is aiohttp.WSMsgType.TEXT and '"hello"' in msg.data, msg
        return ws

    got = await asyncio.gather(*(one() for _ in range(n)))
    return (
        [g for g in got if not isinstance(g, int)],
        [g for g in got if isinstance(g, int)],
        session,
    )


async def get(url: str, local: str = "127.0.0.1") -> tuple[int, str]:
    conn = aiohttp.TCPConnector(local_addr=(local, 0))
    async with aiohttp.ClientSession(connector=conn) as s, s.get(url) as r:
        return r.status, await r.text()


async def close_all(sockets: list[aiohttp.ClientWebSocketResponse]) -> None:
    await asyncio.gather(*(ws.close() for ws in sockets))


async def test_300_from_one_address_take_only_their_share(srv: RunningServer) -> None:
    started = time.monotonic()
    mine, refused, s1 = await open_many(srv.ws_url, 300, "127.0.0.1")
    others: list[aiohttp.ClientWebSocketResponse] = []
    s2 = s3 = None
    try:
        assert len(mine) == PER_ADDRESS and refused == [503] * (300 - PER_ADDRESS)
        elapsed = time.monotonic() - started
        status, body = await get(srv.url + "/ws")  # what the refusal says, in words
        assert status == 503
        assert body.strip() == (
            f"connection limit reached: limits.max_connections_per_address ({PER_ADDRESS})"
        )
        status, body = await get(srv.url + "/readyz")
        assert status == 200, body  # slots are left for everyone else

        # Another address still gets in, up to the total; then the node is full.
        others, refused2, s2 = await open_many(srv.ws_url, TOTAL - PER_ADDRESS + 5, "127.0.0.2")
        assert len(others) == TOTAL - PER_ADDRESS and refused2 == [503] * 5
        status, body = await get(srv.url + "/readyz", "127.0.0.3")
        assert status == 503 and '"full":true' in body.replace(" ", ""), body
        _, refused3, s3 = await open_many(srv.ws_url, 1, "127.0.0.3")
        assert refused3 == [503]
        status, body = await get(srv.url + "/ws", "127.0.0.3")
        assert "server.max_connections (60)" in body

        async with aiohttp.ClientSession() as http:
            text = await metrics_text(http, srv.url)
        refused_total = "edge_vision_connections_refused_total"
        # Every refusal counted, the plain GETs asking why included (1 and 1).
        assert metric(text, refused_total + '{limit="per_address"}') == 300 - PER_ADDRESS + 1
        assert metric(text, refused_total + '{limit="total"}') == 5 + 1 + 1

        await close_all(others[:3])
        status, _ = await wait_readyz(srv.url, 200)
        assert status == 200
        print(f"\n300 handshakes from one address answered in {elapsed:.2f} s")
    finally:
        await close_all(mine + others)
        for s in (s1, s2, s3):
            if s is not None:
                await s.close()


async def wait_readyz(url: str, want: int) -> tuple[int, str]:
    deadline = time.monotonic() + T(10)
    while True:
        status, body = await get(url + "/readyz")
        if status == want or time.monotonic() > deadline:
            return status, body
        await asyncio.sleep(0.05)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    return path


async def test_one_token_is_capped_across_addresses(
    small_spec: ModelSpec, secret_file: Path
) -> None:
    cfg = make_config(
        {
            **overrides(max_connections_per_token=5),
            "auth": {"enabled": True, "token_secret_file": str(secret_file)},
        }
    )
    tok = auth.mint_token(SECRET, "cam-7", 600, ["stream"])
    other = auth.mint_token(SECRET, "cam-8", 600, ["stream"])
    bearer = {"Authorization": f"Bearer {tok}"}
    async with running_server(cfg, small_spec) as srv:
        a, ra, sa = await open_many(srv.ws_url, 4, "127.0.0.1", bearer)
        b, rb, sb = await open_many(srv.ws_url, 4, "127.0.0.2", bearer)
        c, rc, sc = await open_many(
            srv.ws_url, 2, "127.0.0.2", {"Authorization": f"Bearer {other}"}
        )
        try:
            assert len(a) + len(b) == 5 and ra + rb == [503] * 3
            assert len(c) == 2 and rc == []
        finally:
            await close_all(a + b + c)
            for s in (sa, sb, sc):
                await s.close()


async def test_behind_nginx_the_forwarded_address_counts(
    small_spec: ModelSpec, tmp_path: Path
) -> None:
    """nginx connects to the node from 127.0.0.1, trusted; clients come from .2 and .3."""
    cfg = make_config(overrides(trusted_proxies=["127.0.0.1"]))
    async with running_server(cfg, small_spec) as srv:
        proxy = await asyncio.to_thread(Nginx, tmp_path / "nginx", [srv.port])
        await asyncio.to_thread(proxy.start)
        try:
            url = proxy.ws_url
            # A client that forges X-Forwarded-For still counts as itself (nginx appends
            # the address it saw; the node reads from the right).
            forged = {"X-Forwarded-For": "10.9.9.9"}
            two, r2, s2 = await open_many(url, PER_ADDRESS + 10, "127.0.0.2", forged)
            three, r3, s3 = await open_many(url, 5, "127.0.0.3")
            try:
                assert len(two) == PER_ADDRESS and r2 == [503] * 10
                assert len(three) == 5 and r3 == []
                sessions = list(srv.app[CONNECTIONS].values())
                seen = {c.session.forwarded_for for c in sessions}
                assert "10.9.9.9, 127.0.0.2" in seen and "127.0.0.3" in seen
                status, body = await get(proxy.url + "/ws", "127.0.0.2")
                assert status == 503 and "max_connections_per_address" in body
            finally:
                await close_all(two + three)
                await s2.close()
                await s3.close()
        finally:
            await asyncio.to_thread(proxy.stop)


async def test_a_silent_connection_is_closed_after_the_handshake_timeout(
    small_spec: ModelSpec,
) -> None:
    cfg = make_config(overrides(handshake_timeout_s=1))
    async with running_server(cfg, small_spec) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"GET /ws HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        started = time.monotonic()
        got = await asyncio.wait_for(reader.read(), T(10))
        waited = time.monotonic() - started
        writer.close()
        assert got == b"" and 0.5 < waited < T(4), (got, waited)
        # An open WebSocket is not a handshake: it outlives the timeout.
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(srv.ws_url)
            await asyncio.sleep(2)
            await ws.send_str('{"type": "ping", "payload": 1}')
            msgs = [await ws.receive(timeout=T(5)) for _ in range(2)]
            assert any('"pong"' in str(m.data) for m in msgs), msgs
            await ws.close()


# -- the pure parts ---------------------------------------------------------------------------


def test_client_address_believes_forwarded_for_only_from_trusted_proxies() -> None:
    trusted = parse_networks(["127.0.0.1", "10.0.0.0/8"])
    assert client_address("203.0.113.5", "1.2.3.4", trusted) == "203.0.113.5"
    assert client_address("127.0.0.1", "198.51.100.7", trusted) == "198.51.100.7"
    # nginx appends; the client wrote the left part: the rightmost untrusted hop wins.
    assert client_address("127.0.0.1", "6.6.6.6, 198.51.100.7", trusted) == "198.51.100.7"
    assert client_address("127.0.0.1", "198.51.100.7, 10.1.2.3", trusted) == "198.51.100.7"
    assert client_address("127.0.0.1", "", trusted) == "127.0.0.1"
    assert client_address("127.0.0.1", "garbage", trusted) == "127.0.0.1"
    assert client_address("::ffff:127.0.0.1", "[2001:db8::1]:443", trusted) == "2001:db8::1"
    assert client_address("127.0.0.1", "1.2.3.4", []) == "127.0.0.1"


def test_limits_count_and_give_back() -> None:
    limits = ConnectionLimits(LimitsPolicy(total=3, per_address=2, per_token=2))
    a = limits.acquire("a", "t1")
    b = limits.acquire("a", "t2")
    refused = limits.acquire("a", None)
    assert not isinstance(a, type(refused)) and getattr(refused, "limit", None) == "per_address"
    c = limits.acquire("b", "t1")
    assert limits.full and getattr(limits.acquire("c", None), "limit", None) == "total"
    for slot in (a, b, c):
        slot.release()  # type: ignore[union-attr]
        slot.release()  # type: ignore[union-attr]  # twice is once
    assert limits.total == 0 and not limits.by_address and not limits.by_token
    d = [limits.acquire(f"x{i}", "t") for i in range(3)]
    assert getattr(d[2], "limit", None) == "per_token"


def test_per_worker_shares() -> None:
    p = LimitsPolicy(total=256, per_address=64, per_token=128).for_workers(3)
    assert (p.total, p.per_address, p.per_token) == (86, 22, 43)
    assert LimitsPolicy(2, 1, 1).for_workers(4) == LimitsPolicy(1, 1, 1)
