"""Real servers for tests: in-process on 127.0.0.1:0, or as a separate process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from edge_vision.common.aio import with_timeout
from edge_vision.config import Config, load_config
from edge_vision.model.spec import ModelSpec
from edge_vision.serve.server import STARTUP, create_app
from edge_vision.tools.bench.servers import free_port as free_port  # the support modules' too
from edge_vision.tools.bench.servers import serve_argv, stop_process

from .timing import T

# Defaults every test server gets: loopback, a free port, short timers.
TEST_OVERRIDES: dict[str, Any] = {
    "server": {"host": "127.0.0.1", "port": 0, "shutdown_grace_s": 2.0},
    "engine": {"keep_warm_idle_s": 0},
}


def make_config(overrides: Mapping[str, Any] | None = None) -> Config:
    """A validated Config: defaults < TEST_OVERRIDES < ``overrides`` (nested dicts)."""
    tree: dict[str, Any] = {k: dict(v) for k, v in TEST_OVERRIDES.items()}
    for section, values in (overrides or {}).items():
        if isinstance(values, Mapping):
            tree.setdefault(section, {}).update(values)
        else:
            tree[section] = values
    return load_config(None, environ={}, cli=tree)


class LoopbackUrls:
    """``url`` and ``ws_url`` of a server listening on 127.0.0.1:``port``."""

    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"


@dataclass
class RunningServer(LoopbackUrls):
    app: web.Application
    port: int


@asynccontextmanager
async def running_server(
    config: Config, spec: ModelSpec | None = None
) -> AsyncIterator[RunningServer]:
    """The real aiohttp app on a real loopback port, engine warmed up before yielding."""
    # create_app reads files (the model, the web root); a real server calls it before its
    # loop starts, so a test does it off the loop too.
    app = await asyncio.to_thread(create_app, config, spec)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.server.host, config.server.port)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]
    try:
        await with_timeout(asyncio.shield(app[STARTUP]), T(60))
        yield RunningServer(app, port)
    finally:
        await runner.cleanup()


class ServerProcess(LoopbackUrls):
    """``python -m edge_vision serve`` as a child process (for signals, nginx, browsers)."""

    def __init__(
        self,
        *set_args: str,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.port = port or free_port()
        self.args = serve_argv(self.port)
        for a in set_args:
            self.args += ["--set", a]
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        """Start the child (blocking: from async code call it through asyncio.to_thread)."""
        if self.log_path is None:
            self.proc = subprocess.Popen(
                self.args, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            return self
        with open(self.log_path, "ab") as out:  # the child keeps its own copy of the fd
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=out, stderr=out)
        return self

    async def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + T(timeout)
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
                try:
                    async with s.get(self.url + "/readyz") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError(f"server on {self.port} not ready: {self.log()}")

    def log(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")[-4000:]
        return ""

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 15) -> int | None:
        if self.proc is None:
            return None
        return stop_process(self.proc, signal.SIGTERM, T(timeout))
