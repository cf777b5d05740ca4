"""Shared fixtures: the real default model, real servers on loopback ports, real redis."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockBuster, blockbuster_ctx

from edge_vision.config import ModelConfig
from edge_vision.models import ModelSpec, load_model_spec

from .support.server import RunningServer, running_server, test_config
from .support.timing import T


@pytest.fixture(scope="session")
def spec() -> ModelSpec:
    """The embedded PP-OCRv6 text detector, loaded once per test session."""
    return load_model_spec(ModelConfig(), max_batch=4)


@pytest.fixture(autouse=True)
def no_blocking_calls_on_loop(request: pytest.FixtureRequest) -> Iterator[BlockBuster | None]:
    """Fail any async test in which a blocking call (file, socket, sleep) ran on the loop."""
    if not asyncio.iscoroutinefunction(getattr(request.node, "function", None)):
        yield None
        return
    with blockbuster_ctx() as bb:
        # Test-support code may block where only tests run it (reading fixture files).
        for name in (
            "io.BufferedReader.read",
            "io.TextIOWrapper.read",
            "os.stat",
            "io.BufferedWriter.write",
            "os.mkdir",
            "os.replace",
        ):
            if name in bb.functions:
                bb.functions[name].can_block_in("tests/", "")
        yield bb


@pytest.fixture
async def server(spec: ModelSpec) -> AsyncIterator[RunningServer]:
    async with running_server(test_config(), spec) as srv:
        yield srv


@pytest.fixture
async def server_factory(spec: ModelSpec) -> AsyncIterator[Any]:
    """Start servers with config overrides: ``await server_factory({"server": {...}})``."""
    from contextlib import AsyncExitStack

    async with AsyncExitStack() as stack:

        async def make(
            overrides: dict[str, Any] | None = None, model_spec: ModelSpec | None = None
        ) -> RunningServer:
            return await stack.enter_async_context(
                running_server(test_config(overrides), model_spec or spec)
            )

        yield make


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A real redis-server on a free loopback port, nothing persisted."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed; scripts/test installs it")
        self.exe = exe
        self.workdir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + T(10)
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path)
    srv.start()
    try:
        yield srv
    finally:
        srv.kill()
