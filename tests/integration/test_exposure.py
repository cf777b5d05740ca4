"""A safe demo (issue 36): with authentication off a node listens on this machine only
unless told otherwise, and says how to open it up; a web page on another site reaches
neither /ws nor /metrics nor /api/*, by its own Origin or by DNS rebinding (its own name
resolving to the node: ``Host: evil.example`` with ``Origin: http://evil.example``); a
request with two Origin headers is refused; every shipped deployment turns auth on.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from edge_vision.tools.bench.servers import free_port, stop_process

from ..support.raw_ws import handshake
from ..support.server import RunningServer
from ..support.timing import T

REPO = Path(__file__).resolve().parents[2]
REBINDING = {"Host": "evil.example", "Origin": "http://evil.example"}


def _listening(port: int) -> list[str]:
    """The local addresses the kernel lists as LISTEN on ``port`` (IPv4 and IPv6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":
                found.append(address)
    return found


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(argv, stdout=out, stderr=out, env=env)


async def _serve_without_host(tmp_path: Path, env: dict[str, str]) -> tuple[list[str], str]:
    """``edge-vision serve --port P`` as a user types it, no --host: where it listens, and
    what its log said, once it is ready."""
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    argv = ["python", "-m", "edge_vision", "serve", "--port", str(port)]
    proc = await asyncio.to_thread(_start, argv, log, {**os.environ, **env})
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(int(T(60) / 0.2)):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        listening = await asyncio.to_thread(_listening, port)
    finally:
        await asyncio.to_thread(stop_process, proc, signal.SIGTERM, T(15))
    return listening, await asyncio.to_thread(log.read_text)


async def test_without_auth_the_node_listens_on_loopback_and_says_how_to_open_it(
    tmp_path: Path,
) -> None:
    listening, log = await _serve_without_host(tmp_path, {})
    assert listening == ["0100007F"], listening  # 127.0.0.1 only
    assert "server.host" in log and "0.0.0.0" in log and "auth" in log, log[-2000:]


async def test_with_auth_on_an_unset_host_is_every_interface(tmp_path: Path) -> None:
    env = {"EDGE_VISION_AUTH__ENABLED": "true", "EDGE_VISION_TOKEN_SECRET": secrets.token_hex(32)}
    listening, _ = await _serve_without_host(tmp_path, env)
    assert "00000000" in listening, listening  # 0.0.0.0


async def _status(http: aiohttp.ClientSession, method: str, url: str, headers: Any) -> int:
    async with http.request(method, url, headers=headers) as r:
        return r.status


async def test_dns_rebinding_reaches_neither_metrics_nor_the_api_nor_the_socket(
    server: RunningServer,
) -> None:
    async with aiohttp.ClientSession() as http:
        for path in ("/metrics", "/api/sessions", "/api/nodes"):
            assert await _status(http, "GET", server.url + path, REBINDING) == 403, path
            # A same-origin fetch sends no Origin: the Host alone must be refused.
            assert await _status(http, "GET", server.url + path, {"Host": "evil.example"}) == 403
            assert await _status(http, "GET", server.url + path, {}) == 200, path
        # A page on another site POSTing to the API (no preflight for a simple POST).
        foreign = {"Origin": "http://evil.example"}
        assert await _status(http, "POST", server.url + "/api/engine/retry", foreign) == 403
        for host in ("localhost", f"localhost:{server.port}", "[::1]", "10.1.2.3:8080"):
            status = await _status(http, "GET", server.url + "/metrics", {"Host": host})
            assert status == 200, host
        async with http.get(server.url + "/metrics", headers=REBINDING) as r:
            body = await r.text()
        assert "server.allowed_hosts" in body  # the refusal says what to set
    raw = await handshake(server.port, "/ws", list(REBINDING.items()))
    raw.close_with_reset()
    assert raw.status == 403


async def test_with_auth_on_a_rebinding_page_without_credentials_reaches_nothing(
    server_factory: Any, tmp_path: Path
) -> None:
    """With auth on the Host is not checked (the credential is the check): a rebinding page
    has no credential, so /metrics, /api/* and /ws answer 401, and a stream-only
    credential does not open the admin paths (403)."""
    from edge_vision.serve import auth

    secret = tmp_path / "token.secret"
    await asyncio.to_thread(secret.write_bytes, secrets.token_bytes(32).hex().encode() + b"\n")
    key = "evk_" + secrets.token_hex(20)
    srv = await server_factory(
        {
            "auth": {
                "enabled": True,
                "token_secret_file": str(secret),
                "api_keys": [
                    {"name": "cam", "sha256": auth.hash_api_key(key), "scopes": ["stream"]}
                ],
            }
        }
    )
    stream = {**REBINDING, "Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        for path in ("/metrics", "/api/sessions", "/api/nodes"):
            assert await _status(http, "GET", srv.url + path, REBINDING) == 401, path
            assert await _status(http, "GET", srv.url + path, {"Host": "evil.example"}) == 401
            assert await _status(http, "GET", srv.url + path, stream) == 403, path
        assert await _status(http, "POST", srv.url + "/api/engine/retry", REBINDING) == 401
    raw = await handshake(srv.port, "/ws", list(REBINDING.items()))
    raw.close_with_reset()
    assert raw.status == 401


async def test_a_name_in_allowed_hosts_is_served(server_factory: Any) -> None:
    srv = await server_factory({"server": {"allowed_hosts": ["vision.plant.example"]}})
    async with aiohttp.ClientSession() as http:
        named = {"Host": "vision.plant.example:8080", "Origin": "http://vision.plant.example:8080"}
        assert await _status(http, "GET", srv.url + "/metrics", named) == 200
        assert await _status(http, "GET", srv.url + "/metrics", REBINDING) == 403


async def test_a_request_with_two_origin_headers_is_refused(server: RunningServer) -> None:
    two = [("Origin", f"http://127.0.0.1:{server.port}"), ("Origin", "http://evil.example")]
    raw = await handshake(server.port, "/ws", two)
    raw.close_with_reset()
    assert raw.status == 400
    async with aiohttp.ClientSession() as http:
        status = await _status(http, "GET", server.url + "/metrics", two)
    assert status == 400


@pytest.mark.parametrize(
    "compose", ["deploy/compose/docker-compose.yml", "deploy/triton/docker-compose.yml"]
)
def test_every_shipped_compose_file_turns_auth_on_where_it_listens_on_every_interface(
    compose: str,
) -> None:
    doc = yaml.safe_load((REPO / compose).read_text())
    nodes = [
        s
        for s in doc["services"].values()
        if "edge-vision" in str(s.get("image", "")) and "nginx" not in str(s.get("image", ""))
    ]
    assert nodes
    for node in nodes:
        env = {k: str(v) for k, v in (node.get("environment") or {}).items()}
        assert env.get("EDGE_VISION_AUTH__ENABLED") == "true", (compose, env)
        assert "EDGE_VISION_TOKEN_SECRET" in env, (compose, env)
