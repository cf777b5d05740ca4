"""Several real edge_vision nodes behind a real nginx, sharing a real Redis.

The nginx configuration is rendered from deploy/nginx/ exactly as
deploy/local/run-cluster.sh renders it, so the tests run the configuration we ship.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from edge_vision.tools.bench.servers import stop_process

from .server import LoopbackUrls, ServerProcess, free_port
from .timing import T

REPO = Path(__file__).resolve().parents[2]
NGINX_DIR = REPO / "deploy" / "nginx"

# Small and quick nodes: one inference thread each (two nodes share two cores with the
# test), a 320-pixel engine input, one warm-up shape.
LIGHT_NODE = (
    "engine.onnxruntime.threads=1",
    "model.input_size=320",
    "engine.warmup_shapes=[[256, 320]]",
    "engine.batch_window_ms=0",
)

R = TypeVar("R")


def nginx_binary() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


def render_nginx_config(
    folder: Path, listen_port: int, node_ports: list[int], ws_token: str | None = None
) -> None:
    """What run-cluster.sh writes: nginx.conf, edge-vision.conf, edge-vision-locations.conf.

    ``ws_token``: also refuse /ws (HTTP 401) without ``Authorization: Bearer <ws_token>``,
    as a proxy in front that checks a token does (the nodes take no token on /ws)."""
    upstreams = " ".join(f"server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;" for p in node_ports)
    site = (NGINX_DIR / "edge-vision.conf.template").read_text()
    site = site.replace("@LISTEN@", f"127.0.0.1:{listen_port}")
    site = site.replace("@UPSTREAM_SERVERS@", upstreams)
    (folder / "edge-vision.conf").write_text(site)
    shutil.copy(NGINX_DIR / "edge-vision-locations.conf", folder / "edge-vision-locations.conf")
    if ws_token is not None:
        locations = (folder / "edge-vision-locations.conf").read_text()
        ws = "location /ws {\n"
        assert ws in locations, "deploy/nginx/edge-vision-locations.conf has no location /ws"
        check = f'    if ($http_authorization != "Bearer {ws_token}") {{ return 401; }}\n'
        (folder / "edge-vision-locations.conf").write_text(locations.replace(ws, ws + check, 1))
    shutil.copy(NGINX_DIR / "nginx-local.conf", folder / "nginx.conf")
    (folder / "tmp").mkdir(exist_ok=True)


class Nginx(LoopbackUrls):
    """nginx in the foreground with a rendered config, on a free loopback port."""

    def __init__(self, folder: Path, node_ports: list[int], ws_token: str | None = None) -> None:
        exe = nginx_binary()
        if exe is None:
            raise RuntimeError("nginx is not installed; scripts/test installs it")
        self.exe = exe
        self.folder = folder
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        render_nginx_config(folder, self.port, node_ports, ws_token)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Nginx:
        globals_ = "daemon off;"
        if os.geteuid() == 0:  # workers would run as 'nobody', who cannot enter tmp_path
            globals_ += " user root;"
        args = [self.exe, "-p", f"{self.folder}/", "-c", "nginx.conf", "-e", "error.log"]
        self.proc = subprocess.Popen(
            [*args, "-g", globals_], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + T(10)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"nginx exited: {err} {self.error_log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"nginx did not listen: {self.error_log()}")

    def error_log(self) -> str:
        log = self.folder / "error.log"
        return log.read_text(errors="replace")[-3000:] if log.exists() else ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            stop_process(self.proc, signal.SIGQUIT, T(5))  # graceful: finish open requests
        finally:
            if self.proc.stderr:
                self.proc.stderr.close()


NodeProcess = ServerProcess


def node_process(
    node_id: str, redis_url: str, log_dir: Path, *extra: str, ttl: bool = True
) -> NodeProcess:
    """An ``edge-vision serve`` child process that keeps its state in ``redis_url``.

    ``ttl``: short TTLs and heartbeat (node 2 s, heartbeat 0.5 s, sessions 30 s), so
    expiry is seen in seconds."""
    args = [
        f"state.redis_url={redis_url}",
        f"state.node_id={node_id}",
        *LIGHT_NODE,
    ]
    if ttl:
        args += ["state.node_ttl_s=2", "state.heartbeat_s=0.5", "state.session_ttl_s=30"]
    return NodeProcess(*args, *extra, log_path=log_dir / f"{node_id}.log")


async def wait_until(
    check: Callable[[], Awaitable[R | None]], timeout: float, what: str
) -> tuple[R, float]:
    """Poll ``check`` until it returns something other than None/False; (value, seconds)."""
    start = time.monotonic()
    deadline = start + T(timeout)
    last: Any = None
    while True:
        last = await check()
        if last is not None and last is not False:
            return last, time.monotonic() - start
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {T(timeout):.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


async def get_json(
    session: aiohttp.ClientSession, url: str, token: str | None = None
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.get(url, headers=headers) as r:
        r.raise_for_status()
        body: dict[str, Any] = await r.json()
        return body
