"""Shared fixtures: the real default model, real servers on loopback ports, real redis."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockBuster, blockbuster_ctx

from edge_vision.config import ModelConfig
from edge_vision.model.spec import ModelSpec, load_model_spec

from .support.mosquitto import Mosquitto
from .support.redis_server import RedisServer
from .support.server import RunningServer, make_config, running_server


@pytest.fixture(scope="session")
def spec() -> ModelSpec:
    """The embedded PP-OCRv6 text detector, loaded once per test session."""
    return load_model_spec(ModelConfig())


@pytest.fixture(autouse=True, scope="module")
def collect_between_modules() -> Iterator[None]:
    """What a module's tests left behind is collected when the module ends, outside any
    event loop: some libraries shut down when their last object goes (gRPC's asyncio layer
    joins its poller thread), and that must not land inside a later test's loop, where the
    blocking-call guard below fails it (seen once: the Triton tests, then a WebSocket test)."""
    yield
    gc.collect()


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
    async with running_server(make_config(), spec) as srv:
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
                running_server(make_config(overrides), model_spec or spec)
            )

        yield make


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port (tests/support/redis_server.py)."""
    srv = RedisServer(tmp_path).start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """More redis-servers: ``redis_factory(unix_socket=True)``, ``(tls=True, password=...)``."""
    started: list[RedisServer] = []

    def make(**options: Any) -> RedisServer:
        workdir = tmp_path / f"redis{len(started)}"
        workdir.mkdir()
        srv = RedisServer(workdir, **options)
        started.append(srv)
        return srv.start()

    try:
        yield make
    finally:
        for srv in started:
            srv.close()


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Mosquitto]:
    """A real mosquitto on a free loopback port (tests/support/mosquitto.py)."""

    def start() -> Mosquitto:  # files and a process: off the loop
        folder = tmp_path / "mosquitto"
        folder.mkdir()
        return Mosquitto(folder).start()

    b = await asyncio.to_thread(start)
    try:
        yield b
    finally:
        await asyncio.to_thread(b.stop)
