"""Logs safe by construction (issue 36): no credential reaches a log record whatever shape
the request that carried it had; malformed requests cost one rate-limited line, never a
traceback; odd token claims get 401; --print-config and doctor --json hold no secret.

Real servers on loopback; the requests are written byte by byte on bare sockets, since
no HTTP client sends a NUL inside a header.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from edge_vision.config import ModelConfig
from edge_vision.model.spec import ModelSpec, load_model_spec
from edge_vision.serve import auth

from ..support.server import RunningServer, ServerProcess, make_config, running_server
from ..support.timing import T

SECRET = secrets.token_hex(24).encode()
API_KEY = "evk_" + secrets.token_urlsafe(32)
ADMIN_TOKEN = "adm-" + secrets.token_urlsafe(24)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed(payload: str) -> str:
    """A token with this exact JSON payload, signed with the node's secret."""
    body = f"ev1.{_b64(payload.encode())}"
    return f"{body}.{_b64(hmac.new(SECRET, body.encode(), hashlib.sha256).digest())}"


TOKEN = auth.mint_token(SECRET, "alice", 600, ["stream"])


@pytest.fixture(scope="module")
def small_spec() -> ModelSpec:
    return load_model_spec(ModelConfig(input_size=320))


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "token.secret"
    path.write_bytes(SECRET)
    return path


@pytest.fixture
async def srv(small_spec: ModelSpec, secret_file: Path) -> AsyncIterator[RunningServer]:
    overrides = {
        "engine": {"warmup_shapes": [(192, 320)]},
        "server": {"admin_token": ADMIN_TOKEN},
        "auth": {
            "enabled": True,
            "token_secret_file": str(secret_file),
            "api_keys": [{"name": "cam-1", "sha256": auth.hash_api_key(API_KEY)}],
        },
    }
    async with running_server(make_config(overrides), small_spec) as s:
        yield s


async def raw_request(port: int, head: bytes) -> bytes:
    """Write ``head`` (request line and headers, without the final blank line) on a new
    connection; the status line of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + b"\r\n\r\n")
    try:
        return (await asyncio.wait_for(reader.readline(), T(10))).strip()
    finally:
        writer.close()


def shapes(credential: str) -> list[bytes]:
    """Every shape a credential came in during the probe, on a /ws request."""
    c = credential.encode()
    line = b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    return [
        line + b"Authorization: Bearer\x00" + c,  # NUL where the space goes
        line + b"Authorization: Bearer\t" + c + b"\x01",
        line + b"Authorization: Bearer" + c,  # no space at all
        line + b"Authorization: " + c + b"\x7f",  # no scheme
        line + c,  # a header line that is only the credential
        line + b"Sec-WebSocket-Protocol: edge-vision, edge-vision.token." + c + b"\x00",
        b"GET /ws?access_token=" + c + b"\x00 HTTP/1.1\r\nHost: 127.0.0.1",
    ]


async def test_no_credential_reaches_a_log_record_whatever_its_shape(
    srv: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # The secrets held in clear are redacted by their value, wherever they land.
    held = [SECRET.decode(), ADMIN_TOKEN]
    for credential in [TOKEN, API_KEY, *held]:
        for head in shapes(credential):
            status = await raw_request(srv.port, head)
            assert status.split()[1] in (b"400", b"401", b"426"), (head, status)
    assert caplog.records, "nothing was logged: the capture is not working"
    for record in caplog.records:
        text = record.getMessage() + (record.exc_text or "")
        for secret in (TOKEN, TOKEN.split(".")[2], API_KEY, *held):
            assert secret not in text, text


async def test_odd_token_claims_are_refused_with_401_not_a_server_error(
    srv: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    deep = "[" * 1400 + "]" * 1400
    odd = [
        '{"sub":"alice","iat":1,"exp":1' + "0" * 400 + ',"scp":["stream"]}',
        '{"sub":"alice","iat":1,"exp":4102444800,"scp":["stream"],"x":' + deep + "}",
        '{"sub":"alice","iat":1,"exp":1e400,"scp":["stream"]}',
        '{"sub":"alice","iat":1,"exp":-' + "9" * 40 + ',"scp":["stream"]}',
    ]
    for payload in odd:
        head = f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {signed(payload)}"
        status = await raw_request(srv.port, head.encode())
        assert status.split()[1] == b"401", (payload[:60], status)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_2000_malformed_requests_cost_a_few_log_lines_and_no_traceback(
    tmp_path: Path,
) -> None:
    log_path = tmp_path / "server.log"
    srv = ServerProcess(log_path=log_path)
    await asyncio.to_thread(srv.start)
    try:
        await srv.wait_ready()
        before = len((await asyncio.to_thread(log_path.read_text)).splitlines())
        bad = [b"GET / HTTP/1.1\r\nHost: x\r\nX-Broken: a\x00b", b"GET / HTTP/1.1\r\n\x01\x02"]
        sem = asyncio.Semaphore(50)

        async def one(i: int) -> bytes:
            async with sem:
                return await raw_request(srv.port, bad[i % 2])

        answers = await asyncio.gather(*(one(i) for i in range(2000)))
        assert all(a.split()[1] == b"400" for a in answers)
        await asyncio.sleep(T(1))
    finally:
        await asyncio.to_thread(srv.stop)
    lines = (await asyncio.to_thread(log_path.read_text)).splitlines()[before:]
    during = [ln for ln in lines if "shutting down" not in ln and "state store" not in ln]
    malformed = [ln for ln in during if "malformed" in ln.lower()]
    assert 1 <= len(malformed) <= 3, lines[:20]
    assert not any("Traceback" in ln for ln in lines), lines[:20]
    assert len(during) <= 10, during[:20]


def test_print_config_and_doctor_json_hold_no_secret(tmp_path: Path) -> None:
    password = secrets.token_urlsafe(16)
    args = [
        "--set",
        f"server.admin_token={ADMIN_TOKEN}",
        "--set",
        f"state.redis_url=redis://edge:{password}@127.0.0.1:6390/0",
    ]
    shown = subprocess.run(
        [sys.executable, "-m", "edge_vision", "serve", "--print-config", *args],
        capture_output=True,
        text=True,
        timeout=T(120),
        check=True,
    ).stdout
    assert "admin_token" in shown and "redis_url" in shown
    assert ADMIN_TOKEN not in shown and password not in shown
    report = tmp_path / "doctor.json"
    doctor = ["doctor", "--skip-latency", "--json", str(report)]
    subprocess.run(
        [sys.executable, "-m", "edge_vision", *doctor, *args],
        capture_output=True,
        text=True,
        timeout=T(170),
    )
    body = report.read_text()
    data: Any = json.loads(body)
    assert data["tool"] == "edge-vision doctor"
    assert ADMIN_TOKEN not in body and password not in body
