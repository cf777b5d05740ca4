"""``edge-vision serve`` as a user starts it: a port already in use or an address that is
not this machine's is one line that says what to do (exit code 2, no traceback), and the
start-up log says once where to connect and whether a credential is needed."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_vision.errors import ListenFailed
from edge_vision.serve.listen import listen_failed

from ..support.server import ServerProcess, free_port
from ..support.timing import T

#: A log record as the CLI formats it (edge_vision/tools/args.py, setup_logging).
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO) ")


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edge_vision", "serve", *args],
        capture_output=True,
        text=True,
        timeout=T(90),
    )


def what_the_user_reads(stderr: str) -> list[str]:
    """stderr without the INFO log records that come before the failure."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not LOG_RECORD.match(ln)]


@pytest.fixture
def port_in_use() -> Iterator[int]:
    """A loopback port another program listens on (as a second edge-vision would)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        yield holder.getsockname()[1]
    finally:
        holder.close()


WORKERS = [
    pytest.param(["--set", "server.workers=1"], id="1-worker"),
    pytest.param(["--set", "server.workers=2"], id="2-workers-least-clients"),
    pytest.param(
        ["--set", "server.workers=2", "--set", "server.worker_balance=reuse-port"],
        id="2-workers-reuse-port",
    ),
]


@pytest.mark.parametrize("workers", WORKERS)
def test_a_port_in_use_is_one_line_naming_the_port_and_another_to_use(
    port_in_use: int, workers: list[str]
) -> None:
    started = time.monotonic()
    out = serve("--host", "127.0.0.1", "--port", str(port_in_use), *workers)
    took = time.monotonic() - started
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    lines = what_the_user_reads(out.stderr)
    assert lines == [
        f"edge-vision: cannot listen on 127.0.0.1:{port_in_use}: address already in use "
        "(another edge-vision still running?); stop it, or choose a free port with "
        f"--port {port_in_use + 1}"
    ], out.stderr
    # Said before the model loads and the engine warms up, not after.
    assert "engine onnxruntime ready" not in out.stderr
    assert "workers started" not in out.stderr
    assert took < T(30), took


@pytest.mark.parametrize("workers", WORKERS[:2])
def test_a_host_that_is_not_this_machine_is_one_line_saying_which_hosts_work(
    workers: list[str],
) -> None:
    port = free_port()
    out = serve("--host", "203.0.113.1", "--port", str(port), *workers)  # TEST-NET-3
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    [line] = what_the_user_reads(out.stderr)
    assert line.startswith(f"edge-vision: cannot listen on 203.0.113.1:{port}: "), line
    assert "203.0.113.1 is not an address of this machine" in line
    assert "--host 0.0.0.0" in line and "--host 127.0.0.1" in line


def test_a_host_name_that_does_not_resolve_is_one_line() -> None:
    out = serve("--host", "no-such-host.invalid", "--port", str(free_port()))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    [line] = what_the_user_reads(out.stderr)
    assert "'no-such-host.invalid' does not resolve" in line and "--host" in line


def test_a_privileged_port_says_what_to_use_instead() -> None:
    """Root binds port 80 here, so the refusal a user without privileges meets is built
    from the operating system's own error."""
    err = listen_failed("0.0.0.0", 80, PermissionError(13, "Permission denied"))
    assert isinstance(err, ListenFailed)
    assert str(err) == (
        "cannot listen on 0.0.0.0:80: permission denied (ports below 1024 need root or "
        "CAP_NET_BIND_SERVICE); use --port 8080, with a proxy in front for port 80 "
        "(deploy/nginx)"
    )


# -- the start-up line ---------------------------------------------------------------------


def connect_lines(log: str) -> list[str]:
    return [ln.split(": ", 1)[1] for ln in log.splitlines() if "serving on " in ln]


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=T(10)) as r:
        return r.status, r.read().decode(errors="replace")


def test_the_start_up_log_says_where_to_connect_and_how_to_open_it_up(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(port=port, log_path=tmp_path / "serve.log")
    server.start()
    try:
        asyncio.run(server.wait_ready())
        [line] = connect_lines(server.log())
        assert line == (
            f"serving on http://127.0.0.1:{port} (the page) and ws://127.0.0.1:{port}/ws; "
            "authentication is OFF, so only this machine can connect; to let other machines "
            "in, turn auth on (docs/security.md) and set server.host: 0.0.0.0 "
            "(--host 0.0.0.0)"
        )
        # The URLs it names are the page and the WebSocket.
        page, ws = re.findall(r"(?:http|ws)://[^ ;]+", line)
        status, body = get(page)
        assert status == 200 and "<html" in body.lower()
        assert ws == server.ws_url
    finally:
        server.stop()


def test_on_every_interface_it_names_localhost_and_the_machines_name(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess("server.host=0.0.0.0", port=port, log_path=tmp_path / "serve.log")
    server.start()
    try:
        asyncio.run(server.wait_ready())
        [line] = connect_lines(server.log())
        host = socket.gethostname()
        assert line.startswith(
            f"serving on http://localhost:{port} (the page; from other machines "
            f"http://{host}:{port}) and ws://{host}:{port}/ws (every interface, 0.0.0.0:{port})"
        ), line
        assert get(f"http://localhost:{port}/")[0] == 200
    finally:
        server.stop()


def test_with_two_workers_and_auth_on_it_is_said_once_that_a_credential_is_needed(
    tmp_path: Path,
) -> None:
    port = free_port()
    secret = secrets.token_urlsafe(48)
    server = ServerProcess(
        "server.workers=2",
        "auth.enabled=true",
        port=port,
        env={**os.environ, "EDGE_VISION_TOKEN_SECRET": secret},
        log_path=tmp_path / "serve.log",
    )
    server.start()
    try:
        # /readyz needs no credential; /ws does.
        asyncio.run(server.wait_ready())
        lines = connect_lines(server.log())
        assert lines == [
            f"serving on http://127.0.0.1:{port} (the page) and ws://127.0.0.1:{port}/ws; "
            "authentication is ON (auth.enabled): /ws needs an API key or a token from "
            "'edge-vision token'; see docs/security.md"
        ], server.log()
    finally:
        server.stop()
